"""TF's default layout as a user arriving with the seeds' problem runs it, read by disttrain-diagnose.

The benchmark's `tf_default` system (1 PS, 2 workers of the 76 MB MLP at
batch 32, loopback) writes the same run directory as any disttrain run; its
row carries diagnose's verdict, and the verdict must follow what the run
measured: the machine's cores first when they were all busy, else the
longest part of the slowest replica's step, with disttrain's layout among
the changes. The seeds' own cases are docs/diagnose.md's table (benchmark
runs); tests/netem/test_seeds.py is seed 000 over a slow emulated link.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from disttrain.plan import diagnose
from disttrain.runtime import breakdown
from tests import REPO
from tests.bench.test_benchmark import _explain, benchmark

pytestmark = pytest.mark.cluster


def test_a_tf_default_benchmark_run_is_diagnosed_as_it_measured(tmp_path):
    args = [
        "--gin_file=gin/bench/mlp_b32.gin",
        "--workers=2",
        "--ps=1",
        "--systems=tf_default",
        "--noreference",
        "--warmup_steps=4",
        "--measure_steps=40",
    ]
    done, report, _ = benchmark(args, tmp_path, timeout=900)
    assert done.returncode == 0, _explain(done)
    (row,) = report["runs"]
    assert "verdict: " + row["verdict"] in done.stdout  # printed as the run ended
    run = diagnose.read_run(row["logdir"])
    assert run.strategy["class"] == "TFDefault" and run.strategy["baseline"]
    where = {name: breakdown.Breakdown.of(b) for name, b in run.replicas().items()}
    assert len(where) == 2, "both workers traced steps"
    name, slowest = max(where.items(), key=lambda kv: kv[1].step_secs)
    assert slowest.machine_cores >= 1 and slowest.cpu_secs > 0
    parts = {
        p: s
        for p, s in slowest.seconds.items()
        if p != "compute" and s >= breakdown.BINDS * slowest.step_secs
    }
    if slowest.waits_for_cores:
        assert row["verdict"].startswith("this machine's"), row
        assert row["predicted_gain"] is None and "cores of their own" in row["top_change"]
    elif parts:
        longest = max(parts, key=parts.get)
        assert longest == "transfer", (longest, slowest)  # 76 MB each way a step, nothing hides it
        assert row["verdict"].startswith("moving variables and gradients takes"), row
        changes = [f.change for f in diagnose.findings(run)]
        assert any(c.startswith("train with disttrain's AsyncParameterServer(overlap=True)") for c in changes)
    else:
        assert row["verdict"].startswith("no bottleneck: compute is"), row
    said = subprocess.run(
        [sys.executable, os.path.join(REPO, "bin", "diagnose.py"), row["logdir"]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert said.returncode == 0 and f"verdict: {row['verdict']}" in said.stdout, said.stdout + said.stderr
