"""Running real local clusters in tests: bounded in time, logs kept, always cleaned up."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import time

from tensorboard.backend.event_processing import event_accumulator

from disttrain.local import LocalCluster
from tests import REPO

TINY = "gin/testing/tiny.gin"
TRAIN_PY = os.path.join(REPO, "bin", "train.py")  # the checkout's script, as the README runs it


def run_cluster(tmp_path, gin_files, timeout=240, **kwargs) -> tuple[LocalCluster, dict[str, int]]:
    """Start a LocalCluster, wait for it (bounded), return it and every task's exit code."""
    cluster = LocalCluster(gin_files, str(tmp_path / "logdir"), **kwargs).start()
    try:
        codes = cluster.wait(timeout=timeout)
    finally:
        cluster.stop()
    return cluster, codes


def describe_failure(cluster: LocalCluster) -> str:
    """Every task's log tail, for an assertion message."""
    return "\n".join(f"--- {t.name} ({t.log_path})\n{cluster.log_tail(t, 25)}" for t in cluster.tasks)


def scalars(directory: str, tag: str) -> list[tuple[int, float]]:
    """(step, value) of a scalar tag in the event files directly in `directory`."""
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
        acc = event_accumulator.EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            out += [(e.step, e.value) for e in acc.Scalars(tag)]
    return sorted(out)


def train_py(args, env=None, timeout=120) -> subprocess.CompletedProcess:
    """Run bin/train.py once with `args`; output captured as text."""
    return subprocess.run(
        [sys.executable, TRAIN_PY, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=dict(os.environ if env is None else env),
    )


def wait_for_line(path, pattern, timeout=120) -> None:
    """Block until a line matching `pattern` appears in the file at `path`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and re.search(pattern, open(path, errors="replace").read(), flags=re.M):
            return
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} never appeared in {path}")
