"""The chaos soak (tests/chaos.py), short: a few random SIGKILLs and SIGTERMs per strategy in 2-3 minutes.

DISTTRAIN_CHAOS_SECS=1200 runs the long soak (20 minutes of faults per
strategy; raise DISTTRAIN_CHAOS_STEPS so that training outlasts it, and set
DISTTRAIN_CHAOS_EVERY, the mean seconds between faults, for more of them
than one every SECS/6).
"""

import os

import pytest

from tests.chaos import soak
from tests.cluster.helpers import TINY

pytestmark = [pytest.mark.cluster, pytest.mark.fault]

SECS = float(os.environ.get("DISTTRAIN_CHAOS_SECS", "120"))
CHECKPOINT_STEPS, LOG_STEPS = 200, 25
# gin file, more settings, training steps that outlast the short soak on a loaded 2-core machine
STRATEGIES = {
    "async_ps": ("gin/mlp_async.gin", [], 30000),
    "sync_ps": ("gin/mlp_sync.gin", ["SyncParameterServer.backup_workers=1"], 6000),
    "allreduce": ("gin/mlp_allreduce.gin", [], 12000),
}


# The first short soak (async_ps, seed 1) found a replica hung for good, silently, in its first
# step after an in-process recovery from a PS SIGKILL that followed a PS preemption (BUILD_NOTES);
# not seen again in the soaks since, nor explained. Only that hang (the cluster outlasting its
# timeout) is expected to fail: a lost step, a step going back or a bad exit code fails the test.
# The sync PS hangs the soaks found are fixed.
ASYNC_HANG = pytest.mark.xfail(
    reason="issue 22: an async replica once hung after recovering from a lost PS",
    raises=TimeoutError,
    strict=False,
)


@pytest.mark.timeout(SECS + 900)  # the long soak outlasts pytest's default limit
@pytest.mark.parametrize(
    "strategy", [pytest.param(s, marks=ASYNC_HANG) if s == "async_ps" else s for s in sorted(STRATEGIES)]
)
def test_chaos_soak(tmp_path, strategy):
    gin, settings, steps = STRATEGIES[strategy]
    steps = int(os.environ.get("DISTTRAIN_CHAOS_STEPS", steps))
    report = soak(
        [gin, TINY],
        str(tmp_path / "logdir"),
        gin_params=[
            f"TrainConfig.train_steps={steps}",
            f"TrainConfig.save_checkpoint_steps={CHECKPOINT_STEPS}",
            f"TrainConfig.log_every_steps={LOG_STEPS}",
            *settings,
        ],
        duration_secs=SECS,
        every_secs=float(os.environ.get("DISTTRAIN_CHAOS_EVERY", max(20.0, SECS / 6))),
        seed=int(os.environ.get("DISTTRAIN_CHAOS_SEED", "1")),
        num_ps=2 if strategy != "allreduce" else 0,
        num_workers=2,
        timeout_secs=SECS + 600,
        last_step=steps,
    )
    print(f"chaos soak, {strategy}:\n{report}")
    (tmp_path / "report.txt").write_text(str(report))
    assert report.faults, report
    assert set(report.codes.values()) == {0}, report
    assert not report.went_back_without_restore, report
    for fault in report.faults:
        bound = 0 if fault.signal == "SIGTERM" else CHECKPOINT_STEPS + LOG_STEPS
        assert fault.lost <= bound, (fault, str(report))
    assert report.final_step >= steps
