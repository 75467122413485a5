"""Gradient accumulation and several steps per run on real clusters, checked as test_correctness does.

The same seeded MLP, data and optimizer as tests/cluster/test_correctness.py,
in every strategy:
- `accumulate_steps=2` at batch BATCH per replica equals one process at
  2 x BATCH x replicas (sync PS and all-reduce with 2 workers, async with
  1 worker, one process alone): each replica's micro-batch m reads window
  m of its rows, so an update takes the very rows the one process does;
- `steps_per_run=5` equals one step per run (sync PS, all-reduce, async
  with 1 worker): against the same one-process references as the plain
  modes;
- async with overlap (2 workers) and sync PS with a backup worker (3),
  whose order of updates is not fixed, reach 100% training accuracy with
  both settings at once.
"""

from __future__ import annotations

import pytest

from tests import extended_beyond
from tests.cluster import test_correctness as correctness
from tests.cluster.test_correctness import (
    ASYNC_MOMENTUM,
    BATCH,
    Mode,
    report,  # noqa: F401 - prints what was measured, at the end
)

pytestmark = pytest.mark.cluster

ACCUMULATE = "accumulate_steps=2,"
PER_RUN = "steps_per_run=5,"  # STEPS is a multiple: every run makes 5 steps
OVERLAP = "lambda cluster: disttrain.AsyncParameterServer(cluster, overlap=True)"
BACKUP = "lambda cluster: disttrain.SyncParameterServer(cluster, backup_workers=1)"
MODES = {
    **correctness.MODES,
    "one_process_4b": Mode(0, 0, 4 * BATCH, "None"),
    "one_process_accumulate": Mode(0, 0, BATCH, "None", settings=ACCUMULATE),
    "async_1_worker_accumulate": Mode(1, 1, BATCH, "disttrain.AsyncParameterServer", settings=ACCUMULATE),
    "sync_ps_accumulate": Mode(1, 2, BATCH, "disttrain.SyncParameterServer", settings=ACCUMULATE),
    "allreduce_accumulate": Mode(0, 2, BATCH, "disttrain.SyncAllReduce", settings=ACCUMULATE),
    "async_1_worker_per_run": Mode(1, 1, BATCH, "disttrain.AsyncParameterServer", settings=PER_RUN),
    "sync_ps_per_run": Mode(1, 2, BATCH, "disttrain.SyncParameterServer", settings=PER_RUN),
    "allreduce_per_run": Mode(0, 2, BATCH, "disttrain.SyncAllReduce", settings=PER_RUN),
    # No table in this model: the hybrid's ring alone, beside its (empty) PS half.
    "hybrid_both": Mode(1, 2, BATCH, "disttrain.SyncHybrid", settings=ACCUMULATE + PER_RUN),
    "async_overlap_both": Mode(1, 2, BATCH, OVERLAP, ASYNC_MOMENTUM, settings=ACCUMULATE + PER_RUN),
    "sync_ps_backup_both": Mode(1, 3, BATCH, BACKUP, settings=ACCUMULATE + PER_RUN),
}


def train(tmp_path_factory, mode: str):
    return correctness.train(tmp_path_factory, mode, MODES)


@pytest.mark.parametrize(
    "mode, reference",
    [
        ("one_process_accumulate", "one_process_2b"),
        ("async_1_worker_accumulate", "one_process_2b"),
        ("sync_ps_accumulate", "one_process_4b"),
        ("allreduce_accumulate", "one_process_4b"),
        ("hybrid_both", "one_process_4b"),
    ],
)
def test_accumulating_two_micro_batches_equals_one_process_at_twice_the_batch(
    tmp_path_factory, mode, reference
):
    # The mean of two micro-batches' means is the big batch's mean up to float order: sync tolerances.
    got, want = train(tmp_path_factory, mode), train(tmp_path_factory, reference)
    correctness.assert_close(got, want, correctness.SYNC_RTOL, correctness.SYNC_ATOL, mode)


@pytest.mark.parametrize(
    "mode, reference, rtol, atol",
    [
        ("async_1_worker_per_run", "one_process_b", correctness.ASYNC_RTOL, correctness.ASYNC_ATOL),
        ("sync_ps_per_run", "one_process_2b", correctness.SYNC_RTOL, correctness.SYNC_ATOL),
        ("allreduce_per_run", "one_process_2b", correctness.SYNC_RTOL, correctness.SYNC_ATOL),
    ],
)
def test_five_steps_per_run_equal_five_runs_of_one_step(tmp_path_factory, mode, reference, rtol, atol):
    got, want = train(tmp_path_factory, mode), train(tmp_path_factory, reference)
    correctness.assert_close(got, want, rtol, atol, mode)


# CI: async with overlap; sync PS with a backup worker is the extended tier's (CI's time).
@pytest.mark.parametrize(
    "mode", extended_beyond(["async_overlap_both", "sync_ps_backup_both"], {"async_overlap_both"})
)
def test_unordered_modes_with_both_reach_100_percent_training_accuracy(tmp_path_factory, mode):
    weights = train(tmp_path_factory, mode)
    accuracy, loss = correctness.training_accuracy(weights), correctness.training_loss(weights)
    correctness.MEASURED[f"{mode}: training accuracy, loss"] = f"{accuracy:.4f}, {loss:.4f}"
    assert accuracy == 1.0, (mode, accuracy, loss)
