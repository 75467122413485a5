"""A local cluster leaves no TensorFlow start-up line on the console or in any task log, on any CPU.

Checked by keywords, not by disttrain.base.quiet's own list, so a line TensorFlow
rewords shows up here. README's main command is checked for them as a user
runs it (tests/cluster/test_launch_local.py). With TF_CPP_MIN_LOG_LEVEL=0
TensorFlow writes its gRPC server start line (and cpu_feature_guard's) on
every CPU, so the run here proves the filtering even where the default run
has nothing to filter.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

from tests import REPO
from tests.cluster.helpers import TINY, user_env

pytestmark = pytest.mark.cluster

START_UP = ("absl::InitializeLog", "oneDNN", "cpu_feature_guard", "To enable the following instructions")
SERVER_START = "Started server with target"
MLIR = "MLIR V1 optimization pass"
TF_CPP = ("I0000 ", "W0000 ")  # absl's prefix before its logging is initialised (TF never initialises it)
# TensorFlow's Python warnings: a normal run has none (iterators kept in a graph collection once made
# every checkpoint's meta-graph export warn that it could not serialize them).
TF_PYTHON = ("WARNING:tensorflow", "Issue encountered when serializing")


def launch(logdir) -> tuple[str, dict[str, str]]:
    """Run bin/launch_local.py (1 PS, 1 worker) with TensorFlow logging at INFO; console, task logs."""
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "bin", "launch_local.py"),
            "--gin_file=gin/mlp_async.gin",
            f"--gin_file={TINY}",
            "--num_ps=1",
            "--num_workers=1",
            f"--logdir={logdir}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env=user_env(TF_CPP_MIN_LOG_LEVEL="0"),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    logs = {}
    for path in sorted(glob.glob(os.path.join(logdir, "logs", "*.log"))):
        with open(path) as f:
            logs[os.path.basename(path)] = f.read()
    assert set(logs) == {"ps_0.log", "worker_0.log"}
    return r.stdout + r.stderr, logs


def found(text: str, words) -> list[str]:
    return [line for line in text.splitlines() if any(w in line for w in words)]


def test_start_up_lines_stay_filtered_when_tf_logs_info(tmp_path):
    console, logs = launch(tmp_path)
    for name, text in {"console": console, **logs}.items():
        lines = found(text, (*START_UP, SERVER_START))
        assert not lines, f"{name} has TensorFlow start-up lines:\n" + "\n".join(lines)
    # TensorFlow did log at INFO: what it wrote outside start-up (the session's master) is there.
    assert any(found(text, TF_CPP) for text in logs.values()), logs
