"""Running real local clusters in tests: bounded in time, logs kept, always cleaned up."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from disttrain.edges.local import LocalCluster
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


def run_timed(logdir, gin_files, timeout=150, **kwargs) -> tuple[LocalCluster, dict[str, float]]:
    """Run a LocalCluster; return it and each task's exit time (time.time()); fail with logs."""
    cluster = LocalCluster(gin_files, str(logdir), **kwargs).start()
    exited: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(exited) < len(cluster.tasks):
            for task in cluster.tasks:
                code = task.proc.poll()
                if code is not None and task.name not in exited:
                    exited[task.name] = time.time()
                    assert code == 0, f"{task.name} exited {code}\n" + describe_failure(cluster)
            assert time.monotonic() < deadline, f"still running after {timeout} s\n" + describe_failure(
                cluster
            )
            time.sleep(0.05)
    finally:
        cluster.stop()
    return cluster, exited


def variables(logdir: str) -> dict[str, np.ndarray]:
    """Every tensor of the latest checkpoint in `logdir` (or of the checkpoint prefix `logdir`)."""
    reader = tf.train.load_checkpoint(logdir)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def saved_steps(logdir: str) -> list[int]:
    """The steps of the checkpoints on disk in `logdir` (model.ckpt-N), in order."""
    found = (
        re.search(r"ckpt-(\d+)\.index$", p) for p in glob.glob(os.path.join(logdir, "model.ckpt-*.index"))
    )
    return sorted(int(m.group(1)) for m in found if m)


def moved_weights(logdir: str, first: int, last: int) -> list[str]:
    """The model's float weights whose values differ between checkpoints model.ckpt-<first> and -<last>.

    State that moves when no gradient is applied is not counted: optimizer slots (`<variable>/Adam`,
    ...) and `*_power` move under a learning rate of 0, batch norm's `moving_*` in every forward pass.
    """
    before = variables(os.path.join(logdir, f"model.ckpt-{first}"))
    after = variables(os.path.join(logdir, f"model.ckpt-{last}"))
    state = {n for n in before if any(n.startswith(f"{other}/") for other in before)}
    state |= {n for n in before if n.endswith("_power") or "moving_" in n.rsplit("/", 1)[-1]}
    weights = [n for n in before if n not in state and before[n].dtype.kind == "f"]
    return [n for n in weights if not np.array_equal(before[n], after[n])]


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


def texts(directory: str) -> dict[str, str]:
    """The TEXT tab of the event files directly in `directory`: tag -> text."""
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
        acc = event_accumulator.EventAccumulator(path, size_guidance={"tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["tensors"]:
            for event in acc.Tensors(tag):
                out[tag] = tf.make_ndarray(event.tensor_proto).item().decode()
    return out


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


def user_env(**more) -> dict[str, str]:
    """A user's environment: no TF_CONFIG, and none of the tests' TensorFlow log settings."""
    names = ("TF_CONFIG", "TF_CPP_MIN_LOG_LEVEL", "DISTTRAIN_TF_LOGS")
    return {k: v for k, v in os.environ.items() if k not in names} | more


def wait_for_line(path, pattern, timeout=120) -> None:
    """Block until a line matching `pattern` appears in the file at `path`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and re.search(pattern, open(path, errors="replace").read(), flags=re.M):
            return
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} never appeared in {path}")
