"""No wait without a bound (real processes): a peer that dies, or freezes, ends the tasks waiting on it.

Each cluster trains with peer_wait_secs=10, so that a step waiting on a
peer is judged after 10 s and ended 10 s after that: the watchdog's line
names the peer (or says that every peer answers while the step does not
return), and the task exits 150 to be restarted. No task is restarted
here, so that every wait must end by itself.
"""

import os
import signal
import time

import pytest

from disttrain.base.errors import EXIT_TRANSIENT
from disttrain.edges.local import LocalCluster
from tests.cluster.helpers import TINY, describe_failure, wait_for_line

pytestmark = [pytest.mark.cluster, pytest.mark.fault]

PARAMS = ["TrainConfig.train_steps=100000", "TrainConfig.peer_wait_secs=10", "TrainConfig.wait_log_secs=2"]
BOUND = 90  # the watchdog's 10 + 10 s, a step's length and a loaded machine's start-ups


def wait_all(cluster: LocalCluster, tasks, timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while any(t.proc.poll() is None for t in tasks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(t.proc.poll() is not None for t in tasks), "still waiting\n" + describe_failure(cluster)
    return {t.name: t.proc.returncode for t in tasks}


def error_lines(task) -> list[str]:
    return [line for line in open(task.log_path, errors="replace") if line.startswith("disttrain: error:")]


def start(tmp_path, gin: str, num_ps: int, params=()) -> LocalCluster:
    cluster = LocalCluster(
        [gin, TINY], str(tmp_path / "logdir"), num_ps=num_ps, num_workers=2, gin_params=[*PARAMS, *params]
    ).start()
    wait_for_line(cluster.chief_task.log_path, r"step [1-9]\d ", timeout=240)
    return cluster


def test_sync_ps_chief_killed_ends_the_worker_waiting_at_its_token_then_the_ps(tmp_path):
    cluster = start(tmp_path, "gin/mlp_sync.gin", 1)
    try:
        ps, chief, worker = cluster.tasks
        os.kill(chief.proc.pid, signal.SIGKILL)
        codes = wait_all(cluster, [worker, ps], BOUND + 30)  # the PS: once no replica is left
    finally:
        cluster.stop()
    assert codes == {worker.name: EXIT_TRANSIENT, ps.name: EXIT_TRANSIENT}, describe_failure(cluster)
    (line,) = error_lines(worker)
    assert "lost contact: /job:worker/task:0 is gone" in line, line
    (line,) = error_lines(ps)
    assert "lost contact: /job:worker/task:0, /job:worker/task:1 are gone (serving waited" in line, line


def test_allreduce_peer_killed_ends_the_replica_waiting_in_the_collective(tmp_path):
    cluster = start(tmp_path, "gin/mlp_allreduce.gin", 0)
    try:
        chief, worker = cluster.tasks
        os.kill(worker.proc.pid, signal.SIGKILL)
        codes = wait_all(cluster, [chief], BOUND)
    finally:
        cluster.stop()
    assert codes == {chief.name: EXIT_TRANSIENT}, describe_failure(cluster)
    lines = error_lines(chief)
    assert len(lines) == 1 and "/job:worker/task:1" in lines[0], lines


def test_a_frozen_ps_ends_every_replica_whose_step_waits_on_it(tmp_path):
    """SIGSTOP: the PS's port still accepts connections, but nothing answers: a hung call."""
    cluster = start(tmp_path, "gin/mlp_async.gin", 1)
    ps, *replicas = cluster.tasks
    try:
        os.kill(ps.proc.pid, signal.SIGSTOP)
        codes = wait_all(cluster, replicas, BOUND)
    finally:
        os.kill(ps.proc.pid, signal.SIGCONT)
        cluster.stop()
    assert set(codes.values()) == {EXIT_TRANSIENT}, describe_failure(cluster)
    for task in replicas:
        lines = error_lines(task)
        assert len(lines) == 1 and "with every peer reachable" in lines[0], lines
