"""Faults with real processes: tasks killed with SIGKILL, bad checkpoints, bad specs, divergence, decay.

Each test asserts: no lost checkpointed progress, a global step that never
goes back past the last checkpoint, every process ending, the right exit codes.
"""

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

from disttrain.base import logs
from disttrain.base.errors import EXIT_CONFIG, EXIT_DIVERGED
from disttrain.bench.measure import parse_line
from disttrain.edges.local import LocalCluster, free_port
from disttrain.launch import read_results
from disttrain.runtime.metrics import throughput_drop
from tests import REPO
from tests.cluster.helpers import TINY, TRAIN_PY, describe_failure, scalars, train_py, wait_for_line

pytestmark = [pytest.mark.cluster, pytest.mark.fault]

MLP = ["gin/mlp_async.gin", TINY]
STEPS = [
    "TrainConfig.train_steps=500",
    "TrainConfig.save_checkpoint_steps=50",
    "TrainConfig.log_every_steps=25",
]


def logged_steps(path):
    """Global steps in a replica's progress lines, in order."""
    with open(path, errors="replace") as f:
        return [parsed["global_step"] for parsed in map(parse_line, f) if parsed]


def checkpoint_steps(logdir):
    state = tf.train.get_checkpoint_state(logdir)
    return [int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths]


def run_and_kill(tmp_path, victim_index, after_pattern=r"step [1-9]\d\d ", gin_params=(), **kwargs):
    """Start a cluster that restarts what dies, SIGKILL one task mid-training, wait for the end."""
    params = [*STEPS, *gin_params]
    cluster = LocalCluster(MLP, str(tmp_path / "logdir"), gin_params=params, max_restarts=1, **kwargs).start()
    try:
        wait_for_line(cluster.chief_task.log_path, after_pattern)
        victim = cluster.tasks[victim_index]
        killed_at = logged_steps(cluster.chief_task.log_path)[-1]
        os.kill(victim.proc.pid, signal.SIGKILL)
        codes = cluster.wait(timeout=300)
    finally:
        cluster.stop()
    return cluster, victim, killed_at, codes


def test_killed_worker_is_named_restarted_and_rejoins_while_the_others_train(tmp_path):
    # Steps enough that the survivor is still training when the restarted worker is back (a new
    # process takes seconds; the survivor alone runs 500 tiny steps in about as many). A worker
    # that comes back after the last step trains nothing, as it should.
    cluster, victim, _, codes = run_and_kill(
        tmp_path, victim_index=2, num_ps=1, num_workers=2, gin_params=["TrainConfig.train_steps=3000"]
    )
    assert victim.name == "/job:worker/task:1"
    assert set(codes.values()) == {0}, describe_failure(cluster) + str(codes)
    assert any("/job:worker/task:1 died (signal 9); restarting" in e for e in cluster.events), cluster.events
    r = read_results(cluster.logdir)
    assert r["worker_1"]["local_steps"] > 0  # the restarted worker rejoined and trained to the end
    assert r["worker_0"]["global_step"] >= 500
    steps = logged_steps(cluster.chief_task.log_path)
    assert steps == sorted(steps)  # async: losing a worker sets nothing back


@pytest.mark.parametrize(
    "overlap", [pytest.param(False, id="plain", marks=pytest.mark.quick), pytest.param(True, id="overlap")]
)
def test_killed_ps_is_named_and_training_resumes_from_the_last_checkpoint(tmp_path, overlap):
    # An orchestrator backs off before restarting (Kubernetes: CrashLoopBackOff): the PS is gone a while.
    # With overlap, the PS is lost inside the transfer loop's thread: the same recovery must follow.
    cluster, victim, killed_at, codes = run_and_kill(
        tmp_path,
        victim_index=1,
        num_ps=2,
        num_workers=2,
        restart_delay_secs=3.0,
        gin_params=[f"AsyncParameterServer.overlap={overlap}"],
    )
    assert victim.name == "/job:ps/task:1"
    assert set(codes.values()) == {0}, describe_failure(cluster) + str(codes)
    assert any("/job:ps/task:1 died (signal 9); restarting" in e for e in cluster.events)
    chief_log = open(cluster.chief_task.log_path).read()
    # Exactly the killed PS: never the chief itself, nor the PS that only relayed the failure.
    # TF may report the loss only once the PS is back, so "restarted" is as right as "gone".
    lost = re.findall(r"lost its session: (.*); checking peers", chief_log)
    assert lost and set(lost) <= {"/job:ps/task:1 is gone", "/job:ps/task:1 restarted"}, chief_log[-3000:]
    resumed = [int(s) for s in re.findall(r"resuming from .*model\.ckpt-(\d+)", chief_log)]
    assert resumed and resumed[0] >= killed_at - 50, (resumed, killed_at)  # no checkpointed progress lost
    steps = logged_steps(cluster.chief_task.log_path)
    for before, after in zip(steps, steps[1:], strict=False):
        if after < before:  # back to the checkpoint at most
            assert after >= resumed[0], (before, after, resumed)
    assert checkpoint_steps(cluster.logdir)[-1] >= 500
    assert checkpoint_steps(cluster.logdir) == sorted(checkpoint_steps(cluster.logdir))
    read_every_tensor(cluster.logdir)


def test_killed_chief_restarts_from_the_latest_checkpoint(tmp_path):
    cluster, victim, killed_at, codes = run_and_kill(tmp_path, victim_index=1, num_ps=1, num_workers=2)
    assert victim.name == "/job:worker/task:0" and victim is cluster.chief_task
    assert set(codes.values()) == {0}, describe_failure(cluster) + str(codes)
    r = read_results(cluster.logdir)
    assert r["worker_0"]["global_step"] >= 500 and r["worker_1"]["local_steps"] > 0
    steps = logged_steps(cluster.chief_task.log_path)
    restart = (
        next(i for i in range(1, len(steps)) if steps[i] < steps[i - 1]) if steps != sorted(steps) else None
    )
    if restart is not None:  # the restarted chief may start from a checkpoint below its last logged step
        assert steps[restart] >= killed_at - 50 - 25, (steps, killed_at)
    read_every_tensor(cluster.logdir)


def read_every_tensor(logdir):
    """The latest checkpoint reads back whole and finite (no file left corrupt)."""
    reader = tf.train.load_checkpoint(logdir)
    for name in reader.get_variable_to_shape_map():
        value = reader.get_tensor(name)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            assert np.isfinite(value).all(), name


def local_env():
    return {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}


def test_nan_loss_stops_naming_the_step_and_keeps_a_good_checkpoint(tmp_path):
    args = [
        "--gin_file=gin/mlp_async.gin",
        f"--gin_file={TINY}",
        f"--logdir={tmp_path}",
        "--gin_param=TrainConfig.optimizer=@SGD",
        "--gin_param=SGD.learning_rate=1e30",  # diverges within a few steps
        "--gin_param=TrainConfig.save_checkpoint_steps=1",
        "--gin_param=TrainConfig.train_steps=200",
    ]
    r = train_py(args, env=local_env())
    assert r.returncode == EXIT_DIVERGED, r.stdout[-2000:] + r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert re.match(r"disttrain: error: .* became NaN or Inf after global step \d+", line), line
    assert "Traceback" not in r.stderr
    read_every_tensor(str(tmp_path))


def test_unwritable_log_directory(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    r = train_py(
        ["--gin_file=gin/mlp_async.gin", f"--gin_file={TINY}", f"--logdir={blocker}/run"], env=local_env()
    )
    assert r.returncode == EXIT_CONFIG, r.stderr[-2000:]
    assert "cannot write to the log directory" in r.stderr.strip().splitlines()[-1]


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path):
    base = ["--gin_file=gin/mlp_async.gin", f"--gin_file={TINY}", f"--logdir={tmp_path}"]
    first = train_py(base + ["--gin_param=TrainConfig.train_steps=20"], env=local_env())
    assert first.returncode == 0, first.stderr[-2000:]
    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert latest.endswith("-20")
    data = [p for p in os.listdir(tmp_path) if p.startswith("model.ckpt-20.data")]
    with open(tmp_path / data[0], "r+b") as f:  # flip bytes in the middle of the data: a CRC mismatch
        f.seek(os.path.getsize(tmp_path / data[0]) // 2)
        f.write(b"\xff" * 64)
    second = train_py(base + ["--gin_param=TrainConfig.train_steps=25"], env=local_env())
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "model.ckpt-20 is unreadable" in second.stdout and "falling back" in second.stdout
    assert os.path.exists(str(tmp_path / data[0]) + ".corrupt")
    # It resumed from step 10, not from scratch: 15 steps to reach 25.
    assert json.load(open(tmp_path / "tasks" / "local_0" / "result.json"))["local_steps"] == 15


def test_mismatched_cluster_spec_is_detected_and_named(tmp_path):
    ps, w0, w1, extra = (f"127.0.0.1:{free_port()}" for _ in range(4))
    good = {"ps": [ps], "worker": [w0, w1]}
    bad = {"ps": [ps], "worker": [w0, w1, extra]}
    args = [
        sys.executable,
        TRAIN_PY,
        "--gin_file=gin/mlp_async.gin",
        f"--gin_file={TINY}",
        f"--logdir={tmp_path}",
        "--gin_param=TrainConfig.train_steps=100000",
        "--gin_param=TrainConfig.peer_wait_secs=30",
    ]
    procs = []

    def start(spec, job, index, name):
        env = dict(
            local_env(), TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": job, "index": index}})
        )
        log = open(tmp_path / f"{name}.log", "w")
        procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO))
        return procs[-1]

    try:
        start(good, "ps", 0, "ps")
        start(good, "worker", 0, "w0")
        wait_for_line(tmp_path / "w0.log", r" /job:worker/task:0 step ", timeout=120)
        odd = start(bad, "worker", 1, "w1")
        odd.wait(timeout=120)
        text = open(tmp_path / "w1.log").read()
        assert odd.returncode == EXIT_CONFIG, text[-3000:]
        assert "/job:worker/task:1 was started with another cluster than /job:worker/task:0" in text
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_sustained_slowdown_is_warned_about_with_memory_and_op_count(tmp_path):
    args = [
        "--gin_file=gin/mlp_async.gin",
        f"--gin_file={TINY}",
        f"--logdir={tmp_path}",
        "--gin_param=TrainConfig.train_steps=90",
        "--gin_param=TrainConfig.log_every_steps=5",
        "--gin_param=TrainConfig.decay_window=2",
        "--gin_param=synthetic_input.slow_after_batches=50",
        "--gin_param=synthetic_input.slow_batch_secs=0.05",
    ]
    r = train_py(args, env=local_env())
    assert r.returncode == 0, r.stderr[-3000:]
    # Before the slowdown, steps take about a millisecond: on a busy machine an interval's rate can
    # dip and be warned about too, and a drop is warned about once until the rate recovers. So the
    # rule is replayed on the logged rates: a warning at every interval where a drop begins, none
    # elsewhere, and the sustained slowdown (batches 50 on) is a drop.
    warnings = [line for line in r.stdout.splitlines() if "examples/sec fell" in line]
    warned_at = [int(re.search(r"at global step (\d+)", line)[1]) for line in warnings]
    logged = re.findall(r"step (\d+)  loss \S+  examples/sec ([\d.]+) \(this task\)", r.stdout)
    steps, rates = [int(s) for s, _ in logged], [float(x) for _, x in logged]
    drops = [throughput_drop(rates[1 : i + 1], 2) for i in range(len(rates))]
    begins = [steps[i] for i in range(len(rates)) if drops[i] >= 0.3 and (i == 0 or drops[i - 1] < 0.3)]
    assert warned_at == begins, (warned_at, begins, r.stdout[-3000:])
    assert all(d >= 0.3 for s, d in zip(steps, drops, strict=True) if s >= 65), (drops, r.stdout[-3000:])
    # The slowdown's own warning; or the drop warned about before it, if that never recovered.
    warning = [line for line, step in zip(warnings, warned_at, strict=True) if step > 50] or warnings[-1:]
    assert logs.message_of(warning[0]) and " WARNING " in warning[0], warning[0]  # a level, not text
    assert re.search(
        r"fell \d+% below its recent best for 2 intervals .* memory \d+ MiB, graph ops \d+", warning[0]
    )
    drops = scalars(str(tmp_path / "tasks" / "local_0"), "health/throughput_drop")
    assert drops and max(drop for _, drop in drops) > 0.3


def test_sync_cluster_with_a_backup_worker_keeps_stepping_after_losing_one(tmp_path):
    params = [
        "TrainConfig.train_steps=100000",
        "TrainConfig.log_every_steps=10",
        "SyncParameterServer.backup_workers=1",
    ]
    cluster = LocalCluster(
        ["gin/mlp_sync.gin", TINY], str(tmp_path / "logdir"), 1, 3, gin_params=params
    ).start()
    try:
        chief_log = cluster.chief_task.log_path
        wait_for_line(chief_log, r"step [1-9]\d ")
        victim = cluster.tasks[-1]
        assert victim.name == "/job:worker/task:2"
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait()
        after_kill = logged_steps(chief_log)[-1]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and logged_steps(chief_log)[-1] < after_kill + 50:
            assert all(t.proc.poll() is None for t in cluster.tasks if t is not victim), describe_failure(
                cluster
            )
            time.sleep(0.5)
        assert logged_steps(chief_log)[-1] >= after_kill + 50, describe_failure(
            cluster
        )  # two of three suffice
    finally:
        cluster.stop()
