"""Promises of docs/ held in one process: restores refused, divergence, the evaluator, shares, restarts.

Each test names the promise it holds; docs/promises.md lists them all with
their tests. `fit` runs here in this process (no servers); the launcher's
restart policy runs real processes that only exit.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import disttrain
from disttrain.base.cluster import EVALUATOR, Cluster
from disttrain.edges.local import LocalCluster, task_process_options
from disttrain.runtime import metrics, trainer
from tests import reading_model
from tests.cluster.helpers import scalars

v1 = tf.compat.v1


def other_model(ctx):
    """reading_model's model with a wider layer: its checkpoints are another model's."""
    x = tf.reshape(tf.cast(ctx.get_next(tf.data.Dataset.range(10**6).batch(2)) % 7, tf.float32), [-1, 1])
    return tf.reduce_mean(tf.square(tf.matmul(x, v1.get_variable("w", [1, 5])) - 1.0))


def checkpoint_files(directory) -> dict[str, tuple[int, int]]:
    """The checkpoint files in `directory` (the model's and the input positions'): (size, mtime in ns)."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            if "ckpt" in name or "checkpoint" in name or name.startswith("input-"):
                stat = os.stat(os.path.join(root, name))
                out[os.path.relpath(os.path.join(root, name), directory)] = (stat.st_size, stat.st_mtime_ns)
    return out


def fit_once(logdir, loss_fn, optimizer=reading_model.optimizer, steps=4, cluster=None, **settings):
    """`fit` in a graph of its own: what it returned, or the exit code it asked for."""
    with tf.Graph().as_default():
        try:
            return disttrain.fit(
                loss_fn,
                optimizer,
                steps=steps,
                logdir=str(logdir),
                cluster=cluster or Cluster.local(),
                batch_size=reading_model.BATCH,
                **settings,
            )
        except SystemExit as e:
            return e.code


@pytest.mark.parametrize(
    "loss_fn,optimizer,named",
    [
        (other_model, reading_model.optimizer, "holds [1, 4], not [1, 5], for 'w'"),
        (reading_model.loss_fn, lambda: v1.train.AdamOptimizer(0.01), "has no variable 'b/Adam'"),
    ],
    ids=["another_shape", "another_optimizer"],
)
def test_a_checkpoint_of_another_model_is_refused_in_one_line_and_left_unchanged(
    tmp_path, capsys, loss_fn, optimizer, named
):
    """docs/faults.md, resized clusters: refused at start-up in one line naming the variable, exit 2."""
    assert fit_once(tmp_path, reading_model.loss_fn, save_checkpoint_steps=2).global_step == 4
    before = checkpoint_files(tmp_path)
    capsys.readouterr()
    assert fit_once(tmp_path, loss_fn, optimizer, steps=8, save_checkpoint_steps=2) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("disttrain: error: the checkpoint "), err
    assert named in err[0] and "written by another model or optimizer" in err[0], err[0]
    assert checkpoint_files(tmp_path) == before  # nothing written, over them or beside them


@tf.custom_gradient
def _infinite_gradient_after(x, step):
    """x, whose gradient is Inf once `step` reaches 3: a finite loss with an Inf gradient."""

    def grad(dy):
        return dy * tf.where(step >= 3, np.float32("inf"), np.float32(1.0)), None

    return tf.identity(x), grad


def inf_gradient_model(ctx):
    step = tf.cast(v1.train.get_or_create_global_step(), tf.float32)
    w = v1.get_variable("w", [4])
    return tf.reduce_mean(tf.square(_infinite_gradient_after(w, step)))


def test_an_inf_gradient_with_a_finite_loss_stops_before_the_update_with_exit_3(tmp_path, capsys):
    """docs/faults.md: a NaN or Inf in any gradient stops training before it is applied (exit 3)."""
    code = fit_once(tmp_path, inf_gradient_model, steps=20, save_checkpoint_steps=1)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 3, err
    assert len(err) == 1, err
    assert re.match(r"disttrain: error: gradient of w became NaN or Inf after global step \d+", err[0]), err
    # The step that met the Inf (the fourth) applied nothing: the last checkpoint is the third's, finite.
    reader = tf.train.load_checkpoint(str(tmp_path))
    assert reader.get_tensor("global_step") == 3 and np.isfinite(reader.get_tensor("w")).all()


def test_the_evaluator_writes_an_eval_scalar_per_metric_name(tmp_path, capsys):
    """docs (fit's eval_fn): a dict name -> scalar becomes `eval/<name>` scalars under <logdir>/eval."""
    assert fit_once(tmp_path, reading_model.loss_fn, save_checkpoint_steps=2).global_step == 4

    def eval_fn(ctx):
        loss = reading_model.loss_fn(ctx)
        (b,) = [v for v in v1.global_variables() if v.op.name == "b"]
        return {"mse": loss, "bias_mean": tf.reduce_mean(b)}

    evaluator = Cluster(jobs={"worker": ["localhost:1"]}, task_type=EVALUATOR, task_index=0)
    assert fit_once(tmp_path, reading_model.loss_fn, cluster=evaluator, eval_fn=eval_fn, eval_steps=2) is None
    bias = float(np.mean(tf.train.load_checkpoint(str(tmp_path)).get_tensor("b")))
    assert scalars(os.path.join(tmp_path, "eval"), "eval/bias_mean") == [(4, pytest.approx(bias))]
    [(step, mse)] = scalars(os.path.join(tmp_path, "eval"), "eval/mse")
    assert step == 4 and np.isfinite(mse)


def test_an_evaluator_that_gets_no_checkpoint_says_so_and_ends(tmp_path, capsys):
    """With no checkpoints (both intervals None) an evaluator has nothing to read: it ends in a bound."""
    evaluator = Cluster(jobs={"worker": ["localhost:1"]}, task_type=EVALUATOR, task_index=0)
    code = fit_once(
        tmp_path, reading_model.loss_fn, cluster=evaluator, eval_fn=reading_model.loss_fn, peer_wait_secs=1
    )
    assert code is None
    assert "evaluator: no new checkpoint in 1 s" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["checkpoints", "no_checkpoints", "an_earlier_runs_result"])
def test_an_evaluator_ends_once_the_chief_has_finished_and_its_last_checkpoint_is_measured(
    tmp_path, capsys, case
):
    """Training that ends before `steps` (its data ran out) leaves the chief's result.json: the evaluator
    stops once the last checkpoint is measured, or at once without any, not peer_wait_secs later. A
    result.json written before the evaluator started is an earlier run's, and does not count."""
    every = dict(save_checkpoint_steps=None, save_checkpoint_secs=None) if case == "no_checkpoints" else {}
    assert fit_once(tmp_path, reading_model.loss_fn, **every).global_step == 4
    chief = metrics.TaskThroughput(task="/job:worker/task:0", chief=True, global_step=4)

    def chief_finishes():  # once the evaluator is up (it makes its eval directory first)
        while not os.path.isdir(tmp_path / "eval"):
            time.sleep(0.01)
        trainer.write_result(str(tmp_path), "worker", 0, chief)

    if case == "an_earlier_runs_result":
        trainer.write_result(str(tmp_path), "worker", 0, chief)
    else:
        threading.Thread(target=chief_finishes, daemon=True).start()
    evaluator = Cluster(jobs={"worker": ["localhost:1"]}, task_type=EVALUATOR, task_index=0)
    fit_once(
        tmp_path,
        reading_model.loss_fn,
        steps=1000,
        cluster=evaluator,
        eval_fn=reading_model.loss_fn,
        peer_wait_secs=1 if case == "an_earlier_runs_result" else 60,
    )
    out = capsys.readouterr().out
    said = {
        "checkpoints": "evaluator: training is over at global step 4, and its last checkpoint is measured",
        "no_checkpoints": "evaluator: training is over at global step 4 and wrote no checkpoint",
        "an_earlier_runs_result": "evaluator: no new checkpoint in 1 s; stopping after step 4",
    }[case]
    assert said in out, out


def test_without_checkpoints_a_late_replica_knows_training_is_over_from_the_chiefs_result(tmp_path):
    """Its peers gone, a replica exits 0, not 150, once the chief finished, no checkpoint saying so."""
    cluster = Cluster.from_hosts("worker", 1, ["p:1"], ["w0:1", "w1:1"])
    strategy = disttrain.SyncParameterServer(cluster, backup_workers=1)
    settings = disttrain.RunSettings(save_checkpoint_steps=None, save_checkpoint_secs=None)
    watchdog = trainer.replica_watchdog(cluster, strategy, settings, str(tmp_path), steps=16)
    assert not watchdog._over()  # nothing yet: the chief has not finished
    trainer.write_result(str(tmp_path), "worker", 0, metrics.TaskThroughput("chief", True, 16, 16))
    assert watchdog._over()
    assert not trainer.replica_watchdog(cluster, strategy, settings, str(tmp_path), steps=17)._over()


def test_positions_of_other_shares_are_not_restored_and_a_line_says_so(tmp_path, capsys):
    """docs/own_model.md: a restart with other replicas or towers reads its new share from the start."""
    assert fit_once(tmp_path, reading_model.loss_fn).global_step == 4  # one tower: saves input-r1t1-*
    assert list((tmp_path / "tasks" / "local_0").glob("input-r1t1-*.index"))
    two_towers = functools.partial(disttrain.AsyncParameterServer, num_towers=2)
    assert fit_once(tmp_path, reading_model.loss_fn, steps=8, strategy=two_towers).global_step == 8
    out = capsys.readouterr().out
    assert "are of 1 replica(s) x 1 tower(s), this run has 1 x 2: the shares differ" in out, out
    assert "input position restored" not in out


def restart_policy(tmp_path, code: int) -> LocalCluster:
    """A one-task LocalCluster under max_restarts=2 whose task always ends with `code` (-9: SIGKILL)."""
    end = "import os; os.kill(os.getpid(), 9)" if code == -9 else f"import sys; sys.exit({code})"

    def popen(task, argv, env, log_file):
        return subprocess.Popen([sys.executable, "-c", end], env=env, **task_process_options(log_file))

    cluster = LocalCluster([], str(tmp_path), num_ps=0, num_workers=1, max_restarts=2, popen=popen)
    cluster.start()
    cluster.wait(timeout=60)
    return cluster


@pytest.mark.parametrize("code", [2, 3, 4])
def test_permanent_exit_codes_are_never_restarted(tmp_path, code):
    """docs/faults.md: 1-127 are permanent (configuration, divergence, a stall): no restart."""
    cluster = restart_policy(tmp_path, code)
    assert cluster.restarts == {} and cluster.failed and cluster.failed[0].proc.returncode == code
    assert cluster.events == [
        f"/job:worker/task:0 died (exit code {code}); stopping the cluster; log: {cluster.tasks[0].log_path}"
    ]


@pytest.mark.parametrize("code", [130, 150, -signal.SIGKILL])
def test_transient_exits_and_signals_are_restarted_up_to_max_restarts(tmp_path, code):
    cluster = restart_policy(tmp_path, code)
    assert cluster.restarts == {"/job:worker/task:0": 2}, cluster.events
    assert cluster.failed[0].proc.returncode == code
