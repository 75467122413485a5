"""Preemption and a chief that never throws live state away, with real processes.

SIGTERM (Kubernetes, spot instances) to the chief, a worker or a PS mid-run:
the replicas stop at a step boundary, the chief checkpoints that step, the
signalled tasks exit with the transient code, and the run resumes from that
step under `LocalCluster(max_restarts=...)`. SIGKILL to the chief with only
an old checkpoint: the restarted chief adopts the live PS state. In each,
the global step never goes back while a PS lives.
"""

import os
import re
import signal

import pytest

from disttrain.base.errors import EXIT_TRANSIENT
from disttrain.edges.local import LocalCluster
from disttrain.launch import read_results
from tests.cluster.helpers import TINY, describe_failure, wait_for_line
from tests.cluster.test_faults import checkpoint_steps, logged_steps

pytestmark = [pytest.mark.cluster, pytest.mark.fault]

MLP = ["gin/mlp_async.gin", TINY]
# The setting: a user who checkpoints by steps, with an interval the run never reaches.
BY_STEPS = ["TrainConfig.save_checkpoint_steps=100000", "TrainConfig.save_checkpoint_secs=None"]
BY_TIME = ["TrainConfig.save_checkpoint_steps=None", "TrainConfig.save_checkpoint_secs=600"]


def start(tmp_path, params, num_ps=1, num_workers=2, steps=3000):
    params = [f"TrainConfig.train_steps={steps}", "TrainConfig.log_every_steps=25", *params]
    return LocalCluster(
        MLP,
        str(tmp_path / "logdir"),
        num_ps=num_ps,
        num_workers=num_workers,
        gin_params=params,
        max_restarts=1,
    ).start()


def signal_mid_run(cluster, victim, signum, after=r"step [3-9]\d\d "):
    """Send `signum` to `victim` once the chief has logged step 300+; wait for the end; codes."""
    try:
        wait_for_line(cluster.chief_task.log_path, after)
        at = logged_steps(cluster.chief_task.log_path)[-1]
        os.kill(victim.proc.pid, signum)
        codes = cluster.wait(timeout=300)
    finally:
        cluster.stop()
    return at, codes


def steps_after_restart(path, restart_marker):
    text = open(path, errors="replace").read()
    tail = text[text.index(restart_marker) :]
    tmp = path + ".after"
    with open(tmp, "w") as f:
        f.write(tail)
    return logged_steps(tmp)


def test_sigterm_to_the_chief_checkpoints_that_step_and_the_restart_adopts_live_state(tmp_path):
    # Long enough that worker 1, training on alone, has not finished when the chief is back.
    cluster = start(tmp_path, BY_STEPS, steps=15000)
    chief = cluster.chief_task
    at, codes = signal_mid_run(cluster, chief, signal.SIGTERM)
    assert set(codes.values()) == {0}, describe_failure(cluster) + str(codes)
    assert any(f"{chief.name} died (exit code {EXIT_TRANSIENT}); restarting" in e for e in cluster.events)
    log = open(chief.log_path).read()
    stopped = int(re.search(r"preempted: checkpointing at global step (\d+)", log).group(1))
    assert stopped >= at
    assert stopped in checkpoint_steps(cluster.logdir) or any(
        s >= stopped for s in checkpoint_steps(cluster.logdir)
    )
    adopted = int(re.search(r"adopting the PS tasks' live state at global step (\d+)", log).group(1))
    assert adopted >= stopped, (adopted, stopped)  # nothing lost: the other worker went on meanwhile
    after = steps_after_restart(chief.log_path, "adopting the PS tasks")
    assert after and min(after) >= stopped, (after[:5], stopped)  # never back while the PS lives
    assert read_results(cluster.logdir)["worker_0"]["global_step"] >= 15000


# Checkpoints by time reach the same restart path as by steps (extended: CI's time).
@pytest.mark.parametrize("every", ["steps", pytest.param("secs", marks=pytest.mark.extended)])
def test_sigkill_to_the_chief_with_only_an_old_checkpoint_adopts_live_state(tmp_path, every):
    cluster = start(tmp_path, BY_STEPS if every == "steps" else BY_TIME)
    chief = cluster.chief_task
    at, codes = signal_mid_run(cluster, chief, signal.SIGKILL)
    assert set(codes.values()) == {0}, describe_failure(cluster) + str(codes)
    log = open(chief.log_path).read()
    # The only checkpoint was step 0's: TF's chief restored it over the live PS (issue 22).
    adopted = re.search(
        r"adopting the PS tasks' live state at global step (\d+) \(latest checkpoint: step 0\)", log
    )
    adopted = int(adopted.group(1))
    assert adopted >= at, (adopted, at)
    after = steps_after_restart(chief.log_path, "adopting the PS tasks")
    assert after and min(after) >= at, (after[:5], at)


def test_sigterm_to_a_worker_ends_it_at_a_step_and_it_rejoins(tmp_path):
    cluster = start(tmp_path, [])
    worker = cluster.tasks[2]
    at, codes = signal_mid_run(cluster, worker, signal.SIGTERM)
    assert worker.name == "/job:worker/task:1"
    assert set(codes.values()) == {0}, describe_failure(cluster) + str(codes)
    assert any(f"{worker.name} died (exit code {EXIT_TRANSIENT}); restarting" in e for e in cluster.events)
    assert "preempted (SIGTERM)" in open(worker.log_path).read()
    steps = logged_steps(cluster.chief_task.log_path)
    assert steps == sorted(steps)
    assert read_results(cluster.logdir)["worker_1"]["local_steps"] > 0


def test_sigterm_to_a_ps_stops_every_replica_after_the_chief_checkpoints_and_loses_no_step(tmp_path):
    cluster = start(tmp_path, BY_STEPS, num_ps=2)
    ps1 = cluster.tasks[1]
    at, codes = signal_mid_run(cluster, ps1, signal.SIGTERM)
    assert ps1.name == "/job:ps/task:1"
    assert set(codes.values()) == {0}, describe_failure(cluster) + str(codes)
    transient = f"(exit code {EXIT_TRANSIENT}); restarting"
    for task in [ps1, *cluster.tasks[2:]]:  # the PS and every replica it told, once each
        assert any(f"{task.name} died {transient}" in e for e in cluster.events), (task.name, cluster.events)
    assert not any("/job:ps/task:0 died" in e for e in cluster.events)  # the other PS kept serving
    chief_log = open(cluster.chief_task.log_path).read()
    saved = int(re.search(r"preempted: checkpointing at global step (\d+)", chief_log).group(1))
    assert saved >= at
    stopped = []
    for task in cluster.tasks[2:]:
        text = open(task.log_path).read()
        stopped += [int(s) for s in re.findall(r"preempted \(.*\): stopped at global step (\d+)", text)]
    assert len(stopped) == 2 and max(stopped) <= saved, (stopped, saved)
    # The restarted PS holds nothing: the restarted chief restores that very checkpoint.
    restored = int(
        re.search(r"restoring \S*model\.ckpt-(\d+)", chief_log.split("preempted: checkpointing")[1]).group(1)
    )
    assert restored == saved, (restored, saved)  # zero steps lost
    after = steps_after_restart(cluster.chief_task.log_path, f"model.ckpt-{restored}")
    assert after and min(after) >= saved


# Five steps per run: the extended tier (CI's time); all-reduce's five-step case stays in CI.
@pytest.mark.parametrize("per_run", [1, pytest.param(5, marks=pytest.mark.extended)])
def test_sigterm_to_the_sync_chief_resumes_at_that_step_and_trains_to_the_end(tmp_path, per_run):
    # The chief's aggregator once closed the token queues on its way out: the other replica took
    # that for the end of training and the run ended with exit 0 at the step of the signal.
    params = ["TrainConfig.train_steps=1000", "TrainConfig.log_every_steps=25", *BY_STEPS]
    params.append(f"TrainConfig.steps_per_run={per_run}")
    cluster = LocalCluster(
        ["gin/mlp_sync.gin", TINY],
        str(tmp_path / "logdir"),
        num_ps=1,
        num_workers=2,
        gin_params=params,
        max_restarts=1,
    ).start()
    chief = cluster.chief_task
    at, codes = signal_mid_run(cluster, chief, signal.SIGTERM, after=r"step [1-9]\d\d ")
    assert set(codes.values()) == {0}, describe_failure(cluster) + str(codes)
    log = open(chief.log_path).read()
    saved = int(re.search(r"preempted: checkpointing at global step (\d+)", log).group(1))
    adopted = int(re.search(r"adopting the PS tasks' live state at global step (\d+)", log).group(1))
    assert saved >= at and adopted == saved, (at, saved, adopted)  # sync: nobody stepped meanwhile
    assert read_results(cluster.logdir)["worker_0"]["global_step"] >= 1000
    assert read_results(cluster.logdir)["worker_0"]["global_step"] == 1000 or per_run == 1  # not past it


@pytest.mark.parametrize(
    "gin_file, num_ps, per_run",
    [
        ("gin/mlp_allreduce.gin", 0, 1),
        ("gin/dlrm_hybrid.gin", 1, 1),
        ("gin/mlp_allreduce.gin", 0, 5),
        # The hybrid's ring carries the flag as all-reduce's does, whose five-step runs are above.
        pytest.param("gin/dlrm_hybrid.gin", 1, 5, marks=pytest.mark.extended),
    ],
)
def test_sigterm_to_an_all_reduce_replica_stops_the_group_at_one_step_and_loses_none(
    tmp_path, gin_file, num_ps, per_run
):
    """No PS to pass the word: the step's own all-reduce carries the flag, and both stop after it.

    Under SyncHybrid too (its dense half is a ring), whose restarted chief restores its tables from
    that checkpoint rather than adopting the live ones (its dense half was not live). With several
    steps per run, the run's first step carries the flag and both stop after the run.
    """
    params = ["TrainConfig.train_steps=1200", "TrainConfig.log_every_steps=25", *BY_STEPS]
    params.append(f"TrainConfig.steps_per_run={per_run}")
    cluster = LocalCluster(
        [gin_file, TINY],
        str(tmp_path / "logdir"),
        num_ps=num_ps,
        num_workers=2,
        gin_params=params,
        max_restarts=1,
    ).start()
    chief, other = cluster.tasks[num_ps:]
    at, codes = signal_mid_run(cluster, other, signal.SIGTERM)
    assert set(codes.values()) == {0}, describe_failure(cluster) + str(codes)
    for task in (chief, other):  # both stopped for the restart, neither was lost
        assert any(f"{task.name} died (exit code {EXIT_TRANSIENT}); restarting" in e for e in cluster.events)
    log = open(chief.log_path).read()
    assert "preempted (a replica of the all-reduce group is being preempted)" in log
    stopped = int(re.search(r"preempted: checkpointing at global step (\d+)", log).group(1))
    assert stopped >= at and stopped in checkpoint_steps(cluster.logdir), describe_failure(cluster)
    assert stopped % per_run == 0, stopped  # at a run boundary
    after = steps_after_restart(chief.log_path, "preempted: checkpointing")
    after = [s for s in after if s > 0]
    assert after and min(after) > stopped, (after[:5], stopped)  # resumed there: no step lost
    assert read_results(cluster.logdir)["worker_0"]["global_step"] >= 1200
