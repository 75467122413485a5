"""Every documented value of every setting on 2-worker clusters, under each strategy.

The values of tests/unit/test_every_value.py (which runs each alone, in one
process), combined into two runs per strategy: each run sets every
RunSettings field and every strategy knob at once, so that between them the
two runs of a strategy hold the values that change what a cluster does
(no checkpoints, time-based ones, the stall guard off, clipping on either
side, 16-bit transfer, pieces, towers, backup workers, autotune, a PS that
leaves with the chief). Every task runs `python -m tests.reading_model`.
Each run trains to its last step and every task, PS included, exits 0
within a bound, with no traceback in any log. A refused value ends every
task at once, PS included, with one line and exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from disttrain.edges.local import free_port, task_env
from disttrain.launch import read_results
from tests import extended_beyond
from tests.cluster.test_own_model import logs, run_all

pytestmark = pytest.mark.cluster

STEPS = 16
# Every RunSettings field at two values, one for each kind of run: (QUIET, BUSY). QUIET writes no
# checkpoint and turns the guards off; BUSY checkpoints by time, clips and watches.
TWO_WAYS = {
    "save_checkpoint_steps": (None, None),
    "save_checkpoint_secs": (None, 0.01),
    "keep_checkpoints": (None, 1),
    "stall_steps": (0, None),
    "trace_steps": (2, 0),
    "breakdown_budget": (0, 0.5),
    "log_every_steps": (2, 1),
    "check_numerics": (False, True),
    "intra_op_threads": (1, 0),
    "inter_op_threads": (1, 0),
    "decay_threshold": (0, 0.3),
    "decay_window": (1, 3),
    "ps_linger_secs": (0, 30),
    "wait_log_secs": (0.5, 10),
    "preempt_secs": (0.5, 20),
    "clip_norm": (None, 1.0),
    "peer_wait_secs": (30, 120),
}
QUIET = {name: values[0] for name, values in TWO_WAYS.items()}
BUSY = {name: values[1] for name, values in TWO_WAYS.items()} | {"clip_where": "replica"}
RUNS = {
    "async-overlap": (
        "AsyncParameterServer",
        dict(overlap=True, transfer_dtype="bfloat16", piece_bytes=8, num_towers=2),
        QUIET,
    ),
    "async-plain": ("AsyncParameterServer", dict(overlap=False, piece_bytes=None, num_towers=None), BUSY),
    "sync_ps-backup": (
        "SyncParameterServer",
        dict(backup_workers=1, piece_bytes=8, num_towers=2),
        dict(QUIET, clip_norm=1.0, clip_where="aggregate"),
    ),
    "sync_ps-all": (
        "SyncParameterServer",
        dict(backup_workers=0),
        dict(BUSY, save_checkpoint_steps=1, keep_checkpoints=2, stall_steps=10),
    ),
    "allreduce-autotune": (
        "SyncAllReduce",
        dict(
            autotune=True,
            autotune_grid=[[1024, None], [4 * 2**20, 8]],
            autotune_runs=1,
            transfer_dtype="bfloat16",
            densify_below_bytes=0,
            communication_hint="ring",
            num_towers=2,
        ),
        dict(QUIET, clip_norm=1.0, clip_where="aggregate"),
    ),
    "allreduce-buckets": (
        "SyncAllReduce",
        dict(bucket_bytes=1, max_subdivs=8, transfer_dtype="float16", communication_hint="nccl"),
        BUSY,
    ),
}


def start_cluster(
    tmp_path, strategy: str, knobs: dict, settings: dict, steps: int = STEPS, **more
) -> dict[str, subprocess.Popen]:
    """Every task of a 2-worker cluster (and a PS unless all-reduce) running tests.reading_model.

    `more`: the run's other keys (record, nan).
    """
    run = tmp_path / "run.json"
    logdir = str(tmp_path / "logdir")
    spec = dict(strategy=strategy, knobs=knobs, steps=steps, logdir=logdir, settings=settings, **more)
    run.write_text(json.dumps(spec))
    cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(2)]}
    if strategy != "SyncAllReduce":
        cluster["ps"] = [f"127.0.0.1:{free_port()}"]
    env = task_env({k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
    procs = {}
    for job, addresses in cluster.items():
        for i in range(len(addresses)):
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": i}})
            log = open(tmp_path / f"{job}_{i}.log", "w")
            procs[f"{job}_{i}"] = subprocess.Popen(
                [sys.executable, "-m", "tests.reading_model", str(run)],
                env=dict(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
            )
    return procs


def checkpoint_steps(logdir) -> list[int]:
    return sorted(int(p.name.split("-")[1].split(".")[0]) for p in logdir.glob("model.ckpt-*.index"))


# One run per strategy in CI; the other three are the extended tier's (CI's time).
@pytest.mark.parametrize("run", extended_beyond(RUNS, {"async-overlap", "sync_ps-all", "allreduce-buckets"}))
def test_a_run_with_every_setting_trains_to_the_last_step_and_every_task_exits_0(tmp_path, run):
    strategy, knobs, settings = RUNS[run]
    codes = run_all(start_cluster(tmp_path, strategy, knobs, settings), tmp_path, timeout=240)
    text = logs(tmp_path)
    assert set(codes.values()) == {0}, (codes, text)
    assert "Traceback" not in text, text
    results = read_results(str(tmp_path / "logdir"))
    assert results["worker_0"]["global_step"] >= STEPS, results
    if strategy != "AsyncParameterServer":  # one global step per synchronous step
        assert results["worker_0"]["global_step"] == STEPS, results
    if strategy != "SyncAllReduce":
        assert "/job:ps/task:0 done:" in (tmp_path / "ps_0.log").read_text(), text
    logdir = tmp_path / "logdir"
    saved, positions = checkpoint_steps(logdir), list(logdir.glob("tasks/*/input-*.index"))
    if settings["save_checkpoint_steps"] is None and settings["save_checkpoint_secs"] is None:
        assert not saved and not positions, (saved, positions)
    else:
        assert saved[-1] >= STEPS and len(saved) <= settings["keep_checkpoints"], saved
        assert {p.parent.name for p in positions} == {"worker_0", "worker_1"}, positions
        assert tf.train.load_checkpoint(str(logdir)).get_tensor("global_step") >= STEPS


def test_a_refused_strategy_knob_ends_every_task_at_once_the_ps_too(tmp_path):
    """Replicas refuse the knob when they build the strategy; a PS that did not would serve for ever."""
    procs = start_cluster(tmp_path, "AsyncParameterServer", dict(transfer_dtype="int8"), {})
    codes = run_all(procs, tmp_path, timeout=240)
    assert codes == {"worker_0": 2, "worker_1": 2, "ps_0": 2}, (codes, logs(tmp_path))
    for name in codes:
        lines = [line for line in (tmp_path / f"{name}.log").read_text().splitlines() if "error" in line]
        assert len(lines) == 1 and "AsyncParameterServer.transfer_dtype='int8'" in lines[0], lines
