"""bin/benchmark.py end to end on runs that train nothing: each is a FAILED row and the exit is non-zero.

The broken runs are real: tests/bench/no_update.gin imports an optimizer
that applies no update into every task (global step stuck, loss constant),
and a learning rate of 0 freezes the variables while the global step moves
(loss constant on the fixed synthetic batch).
"""

from __future__ import annotations

import re

import pytest

from tests.bench.test_benchmark import TINY, _explain, benchmark

NO_UPDATE = "tests/bench/no_update.gin"
# The trainer's own guard (RunSettings.stall_steps) stops a replica whose global step does not
# move; off here, so that what is tested is the benchmark's refusal alone (the TF 2 peers have none).
NO_GUARD = ["--gin_param=TrainConfig.stall_steps=0"]
SHORT = ["--warmup_steps=10", "--measure_steps=10"]


def _failed_rows(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if "  FAILED: " in line]


@pytest.mark.cluster
def test_no_update_fails_every_system_and_the_reference(tmp_path):
    args = ["--gin_file=gin/bench/mlp.gin", f"--gin_file={TINY}", f"--gin_file={NO_UPDATE}", *NO_GUARD]
    args += ["--workers=1", "--ps=1", "--systems=disttrain,tf_default", *SHORT]
    done, report, _ = benchmark(args, tmp_path)
    assert done.returncode == 1, _explain(done)
    # Steps run fast here: the benchmark may see a few lines at once, so the step count varies.
    assert re.match(
        r"global step did not advance \(0 -> 0 over \d+ local steps of /job:localhost/replica:0/task:0\)",
        report["reference"]["error"],
    ), report["reference"]["error"]
    assert [r["system"] for r in report["runs"]] == ["disttrain", "tf_default"]
    for run in report["runs"]:
        assert run["error"].startswith("global step did not advance (0 -> 0 over "), run["error"]
        assert "; loss constant at " in run["error"].splitlines()[0]
        assert "steps_per_sec" not in run and "scaling_efficiency" not in run
    rows = _failed_rows(done.stdout)
    assert [row.split()[0] for row in rows] == ["disttrain", "tf_default"], done.stdout
    for row in rows:
        figures = row.split("FAILED: ")[0]
        assert "0.00" not in figures  # no rate is printed for a run that trained nothing
        assert "FAILED: global step did not advance (0 -> 0 over" in row
    assert "one process alone: FAILED (global step did not advance" in done.stdout
    summary = done.stdout.split("summary:")[1]
    assert "best" not in summary and "scaling" not in summary
    assert "  reference FAILED: global step did not advance" in summary
    assert "  FAILED disttrain N=1 P=1: global step did not advance" in summary


@pytest.mark.cluster
@pytest.mark.extended  # issue 20's refusal: test_trained_nothing and the test above (CI's time)
def test_frozen_variables_fail_disttrain_and_the_tf2_peers(tmp_path):
    args = ["--gin_file=gin/bench/mlp.gin", f"--gin_file={TINY}", "--gin_param=Adam.learning_rate=0.0"]
    args += ["--workers=1", "--ps=1", "--systems=disttrain,tf2_pss,tf2_mwms", "--reference=false", *SHORT]
    done, report, _ = benchmark(args, tmp_path)
    assert done.returncode == 1, _explain(done)
    assert [r["system"] for r in report["runs"]] == ["disttrain", "tf2_pss", "tf2_mwms"]
    for run in report["runs"]:
        # The global step moves (each update adds 0): the loss alone says nothing was learnt.
        assert run["error"].startswith("loss constant at "), (run["system"], run["error"])
    assert len(_failed_rows(done.stdout)) == 3, done.stdout
    assert "best" not in done.stdout.split("summary:")[1]


@pytest.mark.cluster
def test_a_task_that_stops_itself_is_failed_with_its_reason(tmp_path):
    # The guard stops the worker at 30 of its steps, before 10 + 50 are measured: the row
    # must say why the task ended (its own line names the strategy), not only that it did.
    args = ["--gin_file=gin/bench/mlp.gin", f"--gin_file={TINY}", f"--gin_file={NO_UPDATE}"]
    args += ["--workers=1", "--ps=1", "--systems=disttrain", "--reference=false"]
    args += ["--warmup_steps=10", "--measure_steps=50", "--gin_param=TrainConfig.stall_steps=30"]
    done, report, _ = benchmark(args, tmp_path)
    assert done.returncode == 1, _explain(done)
    (run,) = report["runs"]
    first = run["error"].splitlines()[0]
    assert first.startswith("/job:worker/task:0 exited with code 4 before the measurement ended: "), first
    assert "AsyncParameterServer" in first
    (row,) = _failed_rows(done.stdout)
    assert "AsyncParameterServer" in row
