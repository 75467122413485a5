"""The examples of README and docs/own_model.md, run as written, in one process and on real clusters.

Each example is the README's code block, written to a file and started as
every task of a cluster (the same script for every role, TF_CONFIG telling
each its role). The only edits: fewer steps and a smaller width (so CPU runs
take seconds), a log, data and export directory under the test's, a checkpoint
interval where a test needs one, and the strategy where a test runs another.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from disttrain.base import quiet
from disttrain.edges.local import free_port, task_env
from tests import REPO
from tests.cluster.helpers import moved_weights, saved_steps, wait_for_line

pytestmark = pytest.mark.cluster

STRATEGIES = {
    "async": "disttrain.AsyncParameterServer",
    "sync": "disttrain.SyncParameterServer",
    "allreduce": "disttrain.SyncAllReduce",
}


def readme_examples() -> dict[str, str]:
    """README's example, then docs/own_model.md's Keras and file examples, by name."""
    blocks = []
    for page in ("README.md", os.path.join("docs", "own_model.md")):  # README's first: it comes first
        with open(os.path.join(REPO, page)) as f:
            blocks += re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    fits = [b for b in blocks if "disttrain.fit(" in b]
    return {
        "get_variable": next(b for b in fits if "get_variable" in b and "ctx.shard" not in b),
        "keras": next(b for b in fits if "keras" in b),
        "files": next(b for b in fits if "ctx.shard" in b),
    }


def script(tmp_path, example: str, strategy: str, steps: int = 40, extra: str = "") -> str:
    """The README example with the edits the module docstring lists, as a file."""
    code = readme_examples()[example]
    code, n = re.subn(r"strategy=disttrain\.\w+", f"strategy={STRATEGIES[strategy]}", code)
    assert n == 1
    code, n = re.subn(r"steps=\d+", f"steps={steps}{extra}", code)
    assert n == 1
    code, n = re.subn(r'logdir="/tmp/\w+"', f'logdir="{tmp_path / "logdir"}"', code)
    assert n == 1
    code = code.replace("4096", "64").replace("Dense(512", "Dense(32")
    code = code.replace('"/tmp/mlp"', f'"{tmp_path / "logdir"}"')  # the export's copy of the logdir
    code = code.replace('"/tmp/mlp_served"', f'"{tmp_path / "served"}"')
    code = code.replace('DATA = "/tmp/mlp_data"', f'DATA = "{tmp_path / "data"}"')
    path = tmp_path / f"own_{example}_model.py"  # not keras.py: it would shadow keras
    path.write_text(code)
    return str(path)


def start(path, tmp_path, cluster, job, index, tag="") -> subprocess.Popen:
    env = task_env({k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
    if cluster is not None:
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
    log = open(tmp_path / f"{job}_{index}{tag}.log", "w")
    return subprocess.Popen(
        [sys.executable, path], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path
    )


def start_all(path, tmp_path, cluster) -> dict[str, subprocess.Popen]:
    """Every task of `cluster` running the script at `path`, by '<job>_<index>'."""
    return {
        f"{job}_{i}": start(path, tmp_path, cluster, job, i)
        for job in cluster
        for i in range(len(cluster[job]))
    }


def run_all(procs, tmp_path, timeout=240) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    try:
        for p in procs.values():
            p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return {name: p.returncode for name, p in procs.items()}


def logs(tmp_path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))


def cluster_of(strategy: str) -> dict:
    if strategy == "allreduce":
        return {"worker": [f"127.0.0.1:{free_port()}" for _ in range(2)]}
    return {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"]}


def checkpoint_values(logdir, pattern: str) -> list[np.ndarray]:
    reader = tf.train.load_checkpoint(str(logdir))
    return [
        reader.get_tensor(name) for name in reader.get_variable_to_shape_map() if re.search(pattern, name)
    ]


@pytest.mark.quick
@pytest.mark.parametrize("example", ["get_variable", "keras"])
def test_example_trains_in_one_process(tmp_path, example):
    path = script(tmp_path, example, "async", steps=20)
    codes = run_all({"local": start(path, tmp_path, None, "local", 0)}, tmp_path)
    assert codes == {"local": 0}, logs(tmp_path)
    assert "finished: 20 local steps to global step 20" in logs(tmp_path)
    # As written (disttrain imported first), none of TensorFlow's start-up lines on any CPU.
    noise = [line for line in logs(tmp_path).splitlines() if quiet.is_start_up_line(line.encode())]
    assert not noise, noise


# Each example as written (its own strategy), and Keras under all-reduce, whose batch norm
# updates a copy on every replica. The other crossings would repeat test_correctness.py (fit's
# get_variable model under every strategy, against one process), test_zoo_matrix.py (every model
# under every strategy) and test_resize.py (a Keras model with batch norm under async PS).
@pytest.mark.parametrize(
    "example, strategy",
    [
        pytest.param("get_variable", "async", marks=pytest.mark.quick),
        pytest.param("keras", "sync", marks=pytest.mark.quick),
        ("keras", "allreduce"),
    ],
)
def test_example_trains_on_a_real_cluster_and_every_task_exits_0(tmp_path, example, strategy):
    path = script(tmp_path, example, strategy)
    cluster = cluster_of(strategy)
    procs = start_all(path, tmp_path, cluster)
    codes = run_all(procs, tmp_path)
    assert set(codes.values()) == {0}, (codes, logs(tmp_path))
    text = logs(tmp_path)
    assert "/job:worker/task:0 finished" in text, text
    if strategy != "allreduce":
        assert "/job:ps/task:0 done: 1/1 replicas reported; exiting" in text, text
    # It trained: the weights moved between the start's checkpoint and the end's.
    saved = saved_steps(str(tmp_path / "logdir"))
    assert saved[0] == 0 and saved[-1] >= 40, saved
    assert moved_weights(str(tmp_path / "logdir"), saved[0], saved[-1]), text
    if example == "keras":
        # Batch norm's moving statistics were updated by the steps and checkpointed.
        means = checkpoint_values(tmp_path / "logdir", r"moving_mean$")
        assert means and np.abs(means[0]).max() > 1e-4, means
    else:  # the chief exported the newest checkpoint once training was over
        assert len(os.listdir(tmp_path / "served")) == 1, text


@pytest.mark.parametrize("strategy", ["sync", "allreduce"])
def test_file_reading_example_trains_sharded_and_an_evaluator_measures_it(tmp_path, strategy):
    """README's file example as written: 2 replicas read their own files, an evaluator the held-out one."""
    path = script(
        tmp_path, "files", strategy, steps=30, extra=", save_checkpoint_steps=10, log_every_steps=10"
    )
    cluster = {**cluster_of(strategy), "worker": [f"127.0.0.1:{free_port()}" for _ in range(2)]}
    procs = start_all(path, tmp_path, cluster)
    procs["evaluator_0"] = start(path, tmp_path, cluster, "evaluator", 0)
    codes = run_all(procs, tmp_path)
    assert set(codes.values()) == {0}, (codes, logs(tmp_path))
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == sorted(
        [f"train-{i}.tfrecord" for i in range(8)] + ["eval-8.tfrecord"]
    )
    evaluated = re.findall(
        r"evaluator: step (\d+)  eval loss ([\d.]+)", (tmp_path / "evaluator_0.log").read_text()
    )
    assert evaluated and int(evaluated[-1][0]) >= 30, logs(tmp_path)
    for worker in ("worker_0", "worker_1"):  # each replica saved its own input position
        assert list((tmp_path / "logdir" / "tasks" / worker).glob("input-r2t1-*.index")), worker


def test_user_model_resumes_from_its_checkpoint_after_the_chief_is_killed(tmp_path):
    path = script(
        tmp_path, "get_variable", "async", steps=400, extra=", save_checkpoint_steps=20, log_every_steps=10"
    )
    cluster = cluster_of("async")
    ps = start(path, tmp_path, cluster, "ps", 0)
    chief = start(path, tmp_path, cluster, "worker", 0)
    try:
        wait_for_line(tmp_path / "worker_0.log", r"step (4|5|6|7|8|9)\d ", timeout=180)
        chief.send_signal(signal.SIGKILL)
        chief.wait()
        saved = int(tf.train.latest_checkpoint(str(tmp_path / "logdir")).rsplit("-", 1)[1])
        assert saved >= 20
        restarted = start(path, tmp_path, cluster, "worker", 0, tag="_restarted")
        codes = run_all({"ps": ps, "worker": restarted}, tmp_path)
    finally:
        for p in (ps, chief):
            if p.poll() is None:
                p.kill()
    assert codes == {"ps": 0, "worker": 0}, logs(tmp_path)
    # The restarted chief went on from the checkpoint: its first logged global step is not before
    # it (it logs the step it adopted, which may be the checkpoint's own).
    after_restart = (tmp_path / "worker_0_restarted.log").read_text()
    steps = [int(s) for s in re.findall(r" step (\d+) ", after_restart)]
    assert steps and steps[0] >= saved, (saved, steps[:3])
    result = json.loads((tmp_path / "logdir" / "tasks" / "worker_0" / "result.json").read_text())
    assert result["global_step"] >= 400 and result["local_steps"] <= 400 - saved + 5


OWN_LOOP = """
import sys

import tensorflow as tf

import disttrain

v1 = tf.compat.v1
cluster = disttrain.Cluster.from_env()
strategy = disttrain.AsyncParameterServer(cluster)


def loss_fn():
    x = tf.random.normal([8, 16])
    return tf.reduce_mean(tf.square(tf.matmul(x, v1.get_variable("w", [16, 16])) - x))


with strategy.scope():
    train_op = strategy.minimize(v1.train.GradientDescentOptimizer(0.1), loss_fn)
with disttrain.session(strategy, steps=30, logdir=sys.argv[1], log_every_steps=10) as session:
    open(sys.argv[1] + "/entered_by_" + cluster.task_type, "w").close()
    while not session.should_stop():
        session.run(train_op)
print("loop ended:", session.result.global_step)
"""


def test_own_loop_session_trains_and_a_ps_never_enters_the_body(tmp_path):
    path = tmp_path / "own_loop.py"
    path.write_text(OWN_LOOP)
    logdir = tmp_path / "logdir"
    logdir.mkdir()
    cluster = cluster_of("async")
    env = task_env({k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
    procs = {}
    for job in ("ps", "worker"):
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": 0}})
        log = open(tmp_path / f"{job}_0.log", "w")
        procs[job] = subprocess.Popen(
            [sys.executable, str(path), str(logdir)], env=dict(env), stdout=log, stderr=subprocess.STDOUT
        )
    codes = run_all(procs, tmp_path)
    assert codes == {"ps": 0, "worker": 0}, logs(tmp_path)
    assert sorted(p.name for p in logdir.glob("entered_by_*")) == ["entered_by_worker"]
    assert "loop ended: 30" in (tmp_path / "worker_0.log").read_text()


def test_a_worker_started_before_its_chief_says_what_it_waits_for(tmp_path):
    """Issue 22, "nobody waits in silence": a variable it waits for, since when, until when."""
    path = script(tmp_path, "get_variable", "async", extra=", wait_log_secs=1")
    cluster = {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}" for _ in range(2)]}
    procs = {"ps_0": start(path, tmp_path, cluster, "ps", 0)}
    procs["worker_1"] = start(path, tmp_path, cluster, "worker", 1)
    waiting = r"waiting for the chief to initialise the variables \(e\.g\. [\w/]+, \d+ in all\): since"
    wait_for_line(str(tmp_path / "worker_1.log"), waiting, timeout=120)
    procs["worker_0"] = start(path, tmp_path, cluster, "worker", 0)
    codes = run_all(procs, tmp_path)
    assert set(codes.values()) == {0}, (codes, logs(tmp_path))
