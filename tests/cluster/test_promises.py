"""Promises of docs/ held by real processes: Ctrl-C, NaN under all-reduce, faults, input resumed.

Each test names the promise it holds; docs/promises.md lists them all with
their tests. The clusters run `python -m tests.reading_model` as every task,
under `LocalCluster` where a task must be restarted as an orchestrator would.
"""

from __future__ import annotations

import json
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

from disttrain.base.errors import EXIT_DIVERGED, EXIT_TRANSIENT
from disttrain.edges.local import LocalCluster, task_process_options
from disttrain.launch import read_results
from tests import REPO
from tests.cluster.helpers import TINY, describe_failure, wait_for_line
from tests.cluster.test_every_value import start_cluster
from tests.cluster.test_own_model import logs, run_all
from tests.reading_model import BATCH, IDS

pytestmark = pytest.mark.cluster


def test_ctrl_c_ends_disttrain_train_with_130_and_one_line(tmp_path):
    """docs/faults.md, exit codes: 130, interrupted (Ctrl-C), as one line."""
    script = os.path.join(os.path.dirname(sys.executable), "disttrain-train")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "disttrain.scripts.train"]
    args = [
        "--gin_file=gin/mlp_async.gin",
        f"--gin_file={TINY}",
        "--gin_param=TrainConfig.train_steps=100000",
    ]
    out = tmp_path / "out.log"
    with open(out, "w") as log:
        proc = subprocess.Popen(
            [*command, *args, "--gin_param=TrainConfig.log_every_steps=5", f"--logdir={tmp_path}"],
            cwd=REPO,
            env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
            stdout=log,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
        )
    try:
        wait_for_line(out, r" step \d+ ", timeout=180)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    errors = [line for line in err.splitlines() if line.strip() and not line.startswith(("W0000", "I0000"))]
    assert errors == ["disttrain: error: interrupted"], err[-3000:]


def test_nan_on_one_all_reduce_replica_ends_it_with_3_and_its_peer_with_150(tmp_path):
    """docs/faults.md: a NaN stops its replica (3); under all-reduce the peer, losing it, exits 150."""
    # Replica 1's input turns to NaN from id 41 on (its 21st batch); a checkpoint every 5 steps.
    settings = {"save_checkpoint_steps": 5, "peer_wait_secs": 20}
    procs = start_cluster(tmp_path, "SyncAllReduce", {}, settings, steps=10_000, nan=[1, 41])
    codes = run_all(procs, tmp_path, timeout=180)
    assert codes == {"worker_0": EXIT_TRANSIENT, "worker_1": EXIT_DIVERGED}, (codes, logs(tmp_path))
    last = {name: (tmp_path / f"{name}.log").read_text().strip().splitlines()[-1] for name in codes}
    # The loss and the gradients computed from it (w's and b's) are all checked: whichever check ran
    # first says so, and which one that is differs between CPUs (b's on an AMD EPYC without AVX-512).
    assert re.match(
        r"disttrain: error: (loss|gradient of [wb]) became NaN or Inf after global step \d+", last["worker_1"]
    ), last
    assert "/job:worker/task:1" in last["worker_0"] and last["worker_0"].startswith(
        "disttrain: error: lost"
    ), last
    reader = tf.train.load_checkpoint(str(tmp_path / "logdir"))  # the last checkpoint holds no NaN
    assert np.isfinite(reader.get_tensor("w")).all() and reader.get_tensor("global_step") >= 5


def reading_cluster(tmp_path, spec: dict, num_ps: int) -> LocalCluster:
    """A LocalCluster of `python -m tests.reading_model` tasks, 2 workers, restarting what dies.

    As an orchestrator would: a second apart, up to 10 times (a replica
    restarted before its all-reduce peer has seen it go is refused by the
    group, exits 150, and is started again until the peer's watchdog has
    ended the peer's stuck step too).
    """
    run = tmp_path / "run.json"
    run.write_text(json.dumps(dict(spec, logdir=str(tmp_path / "logdir"))))

    def popen(task, argv, env, log_file):
        argv = [sys.executable, "-m", "tests.reading_model", str(run)]
        return subprocess.Popen(argv, env=env, cwd=REPO, **task_process_options(log_file))

    return LocalCluster(
        [],
        str(tmp_path / "logdir"),
        num_ps=num_ps,
        num_workers=2,
        max_restarts=10,
        restart_delay_secs=1.0,
        popen=popen,
    )


def logged_global_steps(path) -> list[int]:
    return [int(s) for s in re.findall(r"/job:worker/task:0 step (\d+) ", open(path).read())]


def in_background(cluster: LocalCluster, timeout: float) -> tuple[threading.Thread, dict]:
    """`cluster.wait(timeout)` (which restarts what dies) in a thread, while the test sends faults."""
    outcome: dict = {}

    def wait():
        try:
            outcome["codes"] = cluster.wait(timeout=timeout)
        except Exception as e:  # noqa: BLE001  handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=wait, name="cluster-wait", daemon=True)
    thread.start()
    return thread, outcome


def strike(cluster: LocalCluster, task, fault: int, after: str, timeout: float = 180) -> None:
    """Once `task` logs a line matching `after` from now on, send it `fault`; wait for its restart."""
    since = os.path.getsize(task.log_path)
    deadline = time.monotonic() + timeout
    while not re.search(after, open(task.log_path, errors="replace").read()[since:]):
        assert time.monotonic() < deadline, f"{after!r} never came\n" + describe_failure(cluster)
        time.sleep(0.2)
    life = task.proc
    life.send_signal(fault)
    while task.proc is life:  # the cluster's wait loop starts the next life
        assert time.monotonic() < deadline, "not restarted\n" + describe_failure(cluster)
        time.sleep(0.2)


def test_a_worker_preempted_then_killed_under_overlap_rejoins_and_training_ends(tmp_path):
    """docs/strategies.md recommends AsyncParameterServer(overlap=True) for workers that come and go."""
    spec = dict(
        strategy="AsyncParameterServer",
        knobs={"overlap": True},
        # Long enough that worker 0 still trains when worker 1 is back from its SIGTERM: with 300 steps,
        # under two test files at a time, worker 0 finished while worker 1 restarted (23 s) and the
        # second strike waited for a step that never came.
        steps=1500,
        settings={"log_every_steps": 5, "save_checkpoint_steps": 50},
        record=str(tmp_path / "read"),
    )
    (tmp_path / "read").mkdir()
    cluster = reading_cluster(tmp_path, spec, num_ps=1).start()
    worker = cluster.tasks[-1]
    thread, outcome = in_background(cluster, timeout=400)
    try:
        strike(cluster, worker, signal.SIGTERM, after=r"/job:worker/task:1 step \d+ ")
        strike(cluster, worker, signal.SIGKILL, after=r"/job:worker/task:1 step \d+ ")
        thread.join(420)
    finally:
        cluster.stop()
    assert "codes" in outcome, (outcome, describe_failure(cluster))
    assert set(outcome["codes"].values()) == {0}, (outcome, describe_failure(cluster))
    died = [e for e in cluster.events if e.startswith("/job:worker/task:1 died")]
    assert len(died) == 2 and set(cluster.restarts) == {"/job:worker/task:1"}, cluster.events
    assert f"exit code {EXIT_TRANSIENT}" in died[0] and "signal 9" in died[1], died  # preempted, then killed
    assert "preempted (SIGTERM)" in open(worker.log_path).read()
    steps = logged_global_steps(cluster.chief_task.log_path)
    assert steps == sorted(steps), steps  # the global step never went back
    assert read_results(str(tmp_path / "logdir"))["worker_0"]["global_step"] >= 1500


def lives(read_dir, replica: int) -> list[list[int]]:
    """The ids replica `replica` read in each of its lives (processes), in order."""
    files = sorted(read_dir.glob(f"ids_*_{replica}_0.txt"), key=lambda p: p.stat().st_mtime)
    return [[int(i) for i in p.read_text().split()] for p in files]


@pytest.mark.parametrize("strategy", ["SyncParameterServer", "SyncAllReduce"])
def test_input_positions_saved_by_time_resume_after_a_kill(tmp_path, strategy):
    """docs/own_model.md: a restarted replica goes on from its saved position; here saved by time.

    Replica k reads ids k, k+2, k+4, ... (repeated). SIGKILL worker 1 once it
    has saved a position: each life after the first (worker 1's; under
    all-reduce worker 0's too, which exits 150 when it loses its peer) must
    read on from a saved position, never from the start and never past where
    the life before it stopped.
    """
    read = tmp_path / "read"
    read.mkdir()
    spec = dict(
        strategy=strategy,
        knobs={},
        steps=200,
        settings={
            "log_every_steps": 5,
            "save_checkpoint_steps": None,
            "save_checkpoint_secs": 1.0,
            "peer_wait_secs": 20,  # the watchdog's bound on a step stuck on a lost all-reduce peer
        },
        record=str(read),
    )
    cluster = reading_cluster(tmp_path, spec, num_ps=0 if strategy == "SyncAllReduce" else 1).start()
    worker = cluster.tasks[-1]
    task_dir = tmp_path / "logdir" / "tasks" / "worker_1"
    thread, outcome = in_background(cluster, timeout=400)
    try:
        deadline = time.monotonic() + 180
        while not list(task_dir.glob("input-r2t1-*.index")):
            assert time.monotonic() < deadline, (
                "worker 1 never saved its input position\n" + describe_failure(cluster)
            )
            time.sleep(0.1)
        strike(cluster, worker, signal.SIGKILL, after=r"/job:worker/task:1 step \d+ ")
        thread.join(420)
    finally:
        cluster.stop()
    assert set(outcome.get("codes", {}).values()) == {0}, (outcome, describe_failure(cluster))
    assert "input position restored from" in open(worker.log_path).read()
    restarted = [1] if strategy == "SyncParameterServer" else [0, 1]
    for replica in (0, 1):
        share = [replica + 2 * j for j in range(IDS // 2)] * 4
        runs = lives(read, replica)
        assert len(runs) >= 2 if replica in restarted else len(runs) == 1, [len(r) for r in runs]
        assert runs[0] == share[: len(runs[0])]  # the first life reads its share from the start
        for before, after in zip(runs, runs[1:], strict=False):
            at = share.index(before[0]) + len(before)  # where the life before stopped
            starts = [k for k in range(1, at + 1) if share[k : k + len(after)] == after]
            assert starts, (replica, before[-6:], after[:6])  # read on from a saved position, no gap
            assert starts[0] % BATCH == 0, starts  # a position between two batches
