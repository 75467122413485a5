"""A run that trains nothing is refused: the check on recorded log lines, and a task's exit reason (pure)."""

from __future__ import annotations

import pytest

from disttrain.bench.measure import Sample, measure, parse_line, trained_nothing
from disttrain.bench.watch import exit_reason

CHIEF, OTHER = "/job:worker/task:0", "/job:worker/task:1"

# Issue 20's bug, recorded: SyncAllReduce before commit ad413c1, 2 workers, gin/bench/cifar10_b128.gin
# with gin/testing/tiny.gin. Every "step" ran, fast, and applied nothing: global step 0, loss constant.
BROKEN_ALLREDUCE = {
    CHIEF: [
        "21:32:31 INFO /job:worker/task:0 step 0  loss 2.5154  examples/sec 9829.6 (this task)  "
        "0.0 (cluster)  global_step/sec 0.00",
        "21:32:31 INFO /job:worker/task:0 step 0  loss 2.5154  examples/sec 10246.3 (this task)  "
        "0.0 (cluster)  global_step/sec 0.00",
        "21:32:31 INFO /job:worker/task:0 step 0  loss 2.5154  examples/sec 8196.9 (this task)  "
        "0.0 (cluster)  global_step/sec 0.00",
        "21:32:31 INFO /job:worker/task:0 step 0  loss 2.5154  examples/sec 10034.3 (this task)  "
        "0.0 (cluster)  global_step/sec 0.00",
    ],
    OTHER: [
        "21:32:31 INFO /job:worker/task:1 step 0  loss 2.6366  examples/sec 11116.5 (this task)",
        "21:32:31 INFO /job:worker/task:1 step 0  loss 2.6366  examples/sec 6228.6 (this task)",
        "21:32:31 INFO /job:worker/task:1 step 0  loss 2.6366  examples/sec 6208.6 (this task)",
        "21:32:31 INFO /job:worker/task:1 step 0  loss 2.6366  examples/sec 6422.0 (this task)",
    ],
}
# The same command after the fix.
HEALTHY_ALLREDUCE = {
    CHIEF: [
        "21:32:39 INFO /job:worker/task:0 step 10  loss 1.8348  examples/sec 3425.5 (this task)  "
        "6850.9 (cluster)  global_step/sec 428.18",
        "21:32:39 INFO /job:worker/task:0 step 20  loss 1.6639  examples/sec 4263.2 (this task)  "
        "8526.4 (cluster)  global_step/sec 532.90",
        "21:32:39 INFO /job:worker/task:0 step 30  loss 1.5578  examples/sec 3813.9 (this task)  "
        "7627.8 (cluster)  global_step/sec 476.74",
        "21:32:39 INFO /job:worker/task:0 step 40  loss 1.4619  examples/sec 3220.0 (this task)  "
        "6440.0 (cluster)  global_step/sec 402.50",
    ],
    OTHER: [
        "21:32:39 INFO /job:worker/task:1 step 10  loss 2.0423  examples/sec 3420.1 (this task)",
        "21:32:39 INFO /job:worker/task:1 step 20  loss 1.9022  examples/sec 4274.2 (this task)",
        "21:32:39 INFO /job:worker/task:1 step 30  loss 1.8124  examples/sec 3882.7 (this task)",
        "21:32:39 INFO /job:worker/task:1 step 40  loss 1.7202  examples/sec 3179.1 (this task)",
    ],
}
# TF 2's MultiWorkerMirroredStrategy peer (bench/peers/tf2_mwms.py) with Adam.learning_rate=0: the
# global step moves, the variables do not.
FROZEN_MWMS = {
    CHIEF: [
        "21:32:49 INFO /job:worker/task:0 step 20  loss 2.2889  examples/sec 4937.5 (this task)  "
        "9874.9 (cluster)  global_step/sec 617.18",
        "21:32:49 INFO /job:worker/task:0 step 30  loss 2.2889  examples/sec 4814.4 (this task)  "
        "9628.7 (cluster)  global_step/sec 601.79",
        "21:32:49 INFO /job:worker/task:0 step 40  loss 2.2889  examples/sec 5652.4 (this task)  "
        "11304.8 (cluster)  global_step/sec 706.55",
    ],
}


def samples_of(lines: dict[str, list[str]]) -> dict[str, list[Sample]]:
    """Each replica's lines as watch() makes them: parsed, seen in turn (replica k's line i at i + k/10)."""
    out = {}
    for k, (task, texts) in enumerate(lines.items()):
        parsed = [parse_line(text) for text in texts]
        assert all(p is not None and p.pop("task") == task for p in parsed), texts
        out[task] = [Sample(t=i + k / 10, **p) for i, p in enumerate(parsed)]
    return out


def check(lines: dict[str, list[str]], warmup: int = 1, intervals: int = 2) -> tuple:
    """(the Measurement the benchmark took, what trained_nothing says of it)."""
    samples = samples_of(lines)
    m = measure(samples, CHIEF, every_n=10, examples_per_step=8, warmup=warmup, measure=intervals)
    assert m is not None
    return m, trained_nothing(samples, m.t_start, every_n=10)


def test_issue_20s_broken_allreduce_is_refused():
    m, why = check(BROKEN_ALLREDUCE)
    # What the benchmark used to print as a row: 0.00 steps/s, a fast slowest worker.
    assert m.cluster_examples_per_sec == 0.0 and min(m.steps_per_sec.values()) > 100
    assert why == (
        "global step did not advance (0 -> 0 over 20 local steps of /job:worker/task:0 "
        "and 1 other replica(s)); loss constant at 2.5154 (all 4 lines of /job:worker/task:0 "
        "and 1 other replica(s))"
    )


def test_the_same_run_after_the_fix_passes():
    m, why = check(HEALTHY_ALLREDUCE)
    assert why is None
    assert m.cluster_examples_per_sec > 0


def test_a_tf2_peer_with_frozen_variables_is_refused_for_its_loss_alone():
    _, why = check(FROZEN_MWMS)
    assert why == "loss constant at 2.2889 (all 3 lines of /job:worker/task:0)"


def test_the_global_step_counts_over_the_measured_window_only():
    # Healthy in warm-up (0 -> 10), then stuck at 10 for the two measured intervals.
    lines = {CHIEF: [line.replace("step 0 ", "step 10 ") for line in BROKEN_ALLREDUCE[CHIEF]]}
    lines[CHIEF][0] = HEALTHY_ALLREDUCE[CHIEF][0]  # step 10, loss 1.8348
    _, why = check(lines)
    assert why == "global step did not advance (10 -> 10 over 30 local steps of /job:worker/task:0)"


def test_one_replica_alone_is_enough_to_refuse():
    lines = {CHIEF: HEALTHY_ALLREDUCE[CHIEF], OTHER: BROKEN_ALLREDUCE[OTHER]}
    _, why = check(lines)
    assert why.startswith("global step did not advance (0 -> 0 over 30 local steps of /job:worker/task:1)")
    assert why.endswith("loss constant at 2.6366 (all 4 lines of /job:worker/task:1)")


@pytest.mark.parametrize(
    "losses, refused",
    [
        ([2.3026, 2.3026, 2.3026, 2.3026], True),
        ([2.4, 2.3026, 2.3026, 2.3026], False),  # it changed once: it trained, then stopped improving
        ([0.0, 0.0, 0.0, 0.0], False),  # a model that has fit its fixed batch prints 0.0000
        ([float("nan")] * 4, False),  # not this check's: Measurement.diverged flags it
    ],
)
def test_loss_constant_means_never_changed(losses, refused):
    lines = {CHIEF: [line.replace("loss 1.", "loss 9.") for line in HEALTHY_ALLREDUCE[CHIEF]]}
    samples = samples_of(lines)
    samples[CHIEF] = [Sample(**{**vars(s), "loss": x}) for s, x in zip(samples[CHIEF], losses, strict=True)]
    m = measure(samples, CHIEF, every_n=10, examples_per_step=8, warmup=1, measure=2)
    why = trained_nothing(samples, m.t_start, every_n=10)
    assert (why is not None) == refused, why
    if refused:
        assert why == "loss constant at 2.3026 (all 4 lines of /job:worker/task:0)"


# The tail of a disttrain worker's log that stopped itself (TrainConfig's stall guard), recorded.
STALLED_LOG = """\
I0000 00:00:1795555930.850627   12757 port.cc:153] oneDNN custom operations are on. You may see slightly \
different numerical results due to floating-point round-off errors from different computation orders.
21:32:11 INFO /job:worker/task:0 step 0  loss 2.8255  examples/sec 4154.6 (this task)  0.0 (cluster)  \
global_step/sec 0.00
disttrain: error: AsyncParameterServer: the global step has not moved in 30 of this replica's steps \
(still 0): its train op applies no update; stopping (RunSettings.stall_steps sets the window)
W0000 00:00:1795555931.000001   12757 grpc_server.cc:99] shutting down
"""


def test_exit_reason_is_the_tasks_own_line():
    assert exit_reason(STALLED_LOG) == (
        "AsyncParameterServer: the global step has not moved in 30 of this replica's steps (still 0): "
        "its train op applies no update; stopping (RunSettings.stall_steps sets the window)"
    )
    # A TF 2 peer ends with sys.exit's message or a traceback's last line: the last line that is not TF's.
    peer = "Traceback (most recent call last):\n  File x\nValueError: bad shape\n"
    peer += "E0000 00:00:1795555931.000002   12760 f.cc:1] gone\n"
    assert exit_reason(peer) == "ValueError: bad shape"
    assert exit_reason("") == ""
