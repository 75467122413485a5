"""The end of training with real processes: every task ends, even when its PS has already gone.

The incident: worker 1 took longer to close its session than the PS tasks
lingered after the chief was done; the PS exited, and worker 1 then waited
for ever to tell them it was done (TF's session creation has no timeout).
"""

import os
import subprocess
import time

import pytest

from disttrain.edges.local import LocalCluster
from tests.cluster.helpers import TINY, describe_failure, wait_for_line

pytestmark = pytest.mark.cluster

MLP = ["gin/mlp_async.gin", TINY]


def wait_exit(proc, timeout):
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return proc.poll()


def test_replica_that_finishes_after_every_ps_exited_exits_0_at_once(tmp_path):
    gate = tmp_path / "gate"
    gated = tmp_path / "gated.gin"
    gated.write_text(
        "import tests.cluster.slow_close\n"
        "TrainConfig.input_fn = @gated_input\n"
        f"gated_input.gate_file = '{gate}'\n"
    )
    cluster = LocalCluster(
        [*MLP, str(gated)],
        str(tmp_path / "logdir"),
        num_ps=2,
        num_workers=2,
        gin_params=["TrainConfig.ps_linger_secs=1"],
    ).start()
    try:
        ps = [t for t in cluster.tasks if t.job == "ps"]
        worker_0, worker_1 = (t for t in cluster.tasks if t.job == "worker")
        # The chief finishes and reports; worker 1 stops training too but sits in its session close.
        wait_for_line(worker_0.log_path, r"/job:worker/task:0 finished", timeout=240)
        for task in ps:
            assert wait_exit(task.proc, 60) == 0, describe_failure(cluster)
            assert "replicas [1] never reported done" in open(task.log_path).read()
        assert wait_exit(worker_0.proc, 30) == 0, describe_failure(cluster)
        assert worker_1.proc.poll() is None, describe_failure(cluster)  # still closing

        gate.touch()  # worker 1's close completes now, after every PS has exited
        opened = time.monotonic()
        code = wait_exit(worker_1.proc, 60)
        took = time.monotonic() - opened
    finally:
        cluster.stop()
    log = open(worker_1.log_path).read()
    assert code == 0, describe_failure(cluster)
    assert took < 60, took  # a bound for a shared machine: it takes a second or two here
    assert "/job:worker/task:1 finished" in log
    gone = [line for line in log.splitlines() if "already gone" in line]
    assert len(gone) == 1, log[-3000:]
    assert "/job:ps/task:0" in gone[0] and "/job:ps/task:1" in gone[0], gone
    assert os.path.exists(os.path.join(cluster.logdir, "tasks", "worker_1", "result.json"))


def test_a_replica_whose_ps_left_during_the_overlap_drain_exits_0_with_one_line(tmp_path):
    """Overlap's last gradients are still being applied when the PS, done with the chief, leaves.

    Worker 1 either stops within one step of its held round and ends in its drain, or its next
    step waits on the held round (its queue is full) and waits on a PS that has gone: a call to a
    PS that died mid-call never returns by itself, and the watchdog ends it (decisions 0015 and
    0016). Either way it exits 0 (training is over) with one line saying why, within the
    watchdog's bound.
    """
    # Enough steps that worker 1 starts before the chief alone finishes them (60 did not, at a
    # loaded CI's start-up: worker 1 found the run over and never reached its held rounds).
    gate, steps = tmp_path / "gate", 4000
    overlay = tmp_path / "slow_drain.gin"
    overlay.write_text(
        "import tests.cluster.slow_drain\n"
        "TrainConfig.strategy = @SlowDrainAsyncParameterServer\n"
        f"SlowDrainAsyncParameterServer.gate_file = '{gate}'\n"
        f"SlowDrainAsyncParameterServer.last_step = {steps}\n"
    )
    cluster = LocalCluster(
        [*MLP, str(overlay)],
        str(tmp_path / "logdir"),
        num_ps=1,
        num_workers=2,
        gin_params=[
            f"TrainConfig.train_steps={steps}",
            "TrainConfig.log_every_steps=10",
            "TrainConfig.ps_linger_secs=3",
            "TrainConfig.peer_wait_secs=10",
        ],
    ).start()
    try:
        (ps,) = (t for t in cluster.tasks if t.job == "ps")
        worker_1 = next(t for t in cluster.tasks if t.name == "/job:worker/task:1")
        deadline = time.monotonic() + 240
        while not os.path.exists(f"{gate}.held") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert os.path.exists(f"{gate}.held"), describe_failure(cluster)  # worker 1's last rounds wait
        assert wait_exit(ps.proc, 60) == 0, describe_failure(cluster)  # the PS left without worker 1
        assert "replicas [1] never reported done" in open(ps.log_path).read()
        assert worker_1.proc.poll() is None, describe_failure(cluster)  # still in its drain
        gate.touch()  # its held rounds now push to a PS that is gone
        code = wait_exit(worker_1.proc, 90)  # the watchdog's bound: 10 + 10 s, and a step's length
    finally:
        cluster.stop()
    log = open(worker_1.log_path).read()
    assert code == 0, describe_failure(cluster)
    said = [
        line
        for line in log.splitlines()
        if "a PS left while the last gradients were applied" in line
        or "lost contact: /job:ps/task:0 is gone" in line
    ]
    assert len(said) == 1 and "training is over" in said[0], log[-3000:]


def _start_again(cluster: LocalCluster, task) -> subprocess.CompletedProcess:
    """Run `task` once more, as an orchestrator restarting it would; its output (both streams) captured."""
    env = dict(os.environ, TF_CONFIG=cluster.tf_config(task), PYTHONUNBUFFERED="1")
    return subprocess.run(
        cluster.argv(task), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120
    )


def test_a_replica_restarted_after_training_ended_reports_to_the_waiting_ps_and_exits_0(tmp_path):
    """Worker 1 died before reporting; its restart finds the last checkpoint and lets the PS go.

    Started again once the PS has gone too, it ends at once (it waited for the PS, then failed);
    so does the PS started again (it waited for ever for reports).
    """
    cluster = LocalCluster(
        ["gin/mlp_sync.gin", TINY],
        str(tmp_path / "logdir"),
        num_ps=1,
        num_workers=2,
        gin_params=["SyncParameterServer.backup_workers=1", "TrainConfig.ps_linger_secs=600"],
    ).start()
    try:
        ps, worker_0, worker_1 = cluster.tasks
        worker_1.proc.kill()  # with a backup worker the chief trains on alone; the PS waits for worker 1
        assert wait_exit(worker_0.proc, 240) == 0, describe_failure(cluster)
        assert ps.proc.poll() is None, describe_failure(cluster)
        again = _start_again(cluster, worker_1)
        ps_code = wait_exit(ps.proc, 60)
        # Once more, with the PS gone too: nothing left to wait for, nothing to tell.
        once_more = _start_again(cluster, worker_1)
        ps_again = _start_again(cluster, ps)  # no replica would report to it: it ends at once
    finally:
        cluster.stop()
    assert again.returncode == 0, again.stdout[-3000:]
    assert "/job:worker/task:1: training is already over" in again.stdout, again.stdout[-3000:]
    assert ps_code == 0, describe_failure(cluster)
    assert "2/2 replicas reported" in open(ps.log_path).read()
    assert once_more.returncode == 0, once_more.stdout[-3000:]
    assert "/job:ps/task:0 already gone" in once_more.stdout, once_more.stdout[-3000:]
    assert ps_again.returncode == 0, ps_again.stdout[-3000:]
    assert "/job:ps/task:0: training is already over" in ps_again.stdout, ps_again.stdout[-3000:]


def test_an_allreduce_replica_restarted_after_its_peers_exited_0_exits_0_without_waiting(tmp_path):
    cluster = LocalCluster(["gin/mlp_allreduce.gin", TINY], str(tmp_path / "logdir"), num_ps=0).start()
    codes = cluster.wait(timeout=240)
    assert set(codes.values()) == {0}, describe_failure(cluster)
    again = _start_again(cluster, cluster.tasks[1])  # peer_wait_secs is 60: it would wait, then fail
    assert again.returncode == 0, again.stdout[-3000:]
    assert "/job:worker/task:1: training is already over" in again.stdout, again.stdout[-3000:]
