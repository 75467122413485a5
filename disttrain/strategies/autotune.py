"""Start-up search over the all-reduce's fusion settings: bucket size and ring pieces.

The graph holds the all-reduce built once per candidate setting, as the
branches of one `switch_case` whose index is a local variable; only the
taken branch's collectives run, and every replica takes the same one, so
they pair. Each candidate also has a probe: the same all-reduce over zeros of
the gradients' shapes, with instance keys of its own. When a session is
created (after the initial broadcast, before the first step) every replica
runs the probes in the same order, times them, sums the times over the
replicas with one more collective (every replica gets the same bits) and
sets the index to the fastest candidate. What it probes is the all-reduce
alone, not compute or the update.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from disttrain.base.errors import ConfigError

v1 = tf.compat.v1
log = logging.getLogger("disttrain")

MiB = 2**20


@dataclasses.dataclass(frozen=True)
class Setting:
    """One candidate: fusion bucket size and the cap on TF's ring pieces (-1: TF's default, 2)."""

    bucket_bytes: int
    max_subdivs: int = -1

    def __str__(self) -> str:
        subdivs = "default" if self.max_subdivs == -1 else self.max_subdivs
        return f"bucket_bytes={self.bucket_bytes} max_subdivs={subdivs}"


# TF's ring cuts a bucket into pieces until each is at most 4 MiB or the cap is reached, so
# caps above bucket / (N x 4 MiB) change nothing: the grid's caps are TF's 2 and 8.
DEFAULT_GRID = tuple(Setting(b * MiB, s) for b in (4, 32, 128) for s in (-1, 8))


def candidates(first: Setting, grid: Sequence[Sequence[int]] | None) -> list[Setting]:
    """`first` (the configured setting, used until tuned) then the grid's other settings, in order.

    `grid`: (bucket_bytes, max_subdivs) pairs, max_subdivs None or -1 for
    TF's default; None for DEFAULT_GRID.
    """
    if grid is not None and not len(grid):
        raise ConfigError(
            "autotune_grid is empty: give (bucket_bytes, max_subdivs) pairs, or None for the default grid"
        )
    settings = [first]
    for entry in DEFAULT_GRID if grid is None else grid:
        setting = entry if isinstance(entry, Setting) else _setting(entry)
        if setting not in settings:
            settings.append(setting)
    return settings


def _setting(entry) -> Setting:
    try:
        bucket_bytes, max_subdivs = entry
    except (TypeError, ValueError):
        raise ConfigError(
            f"autotune setting {entry!r}: expected a (bucket_bytes, max_subdivs) pair"
        ) from None
    max_subdivs = -1 if max_subdivs is None else max_subdivs
    if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ConfigError(f"autotune setting {entry!r}: bucket_bytes must be an int >= 1")
    if not isinstance(max_subdivs, int) or (max_subdivs < 1 and max_subdivs != -1):
        raise ConfigError(f"autotune setting {entry!r}: max_subdivs must be an int >= 1 or None")
    return Setting(bucket_bytes, max_subdivs)


ReduceFn = Callable[[list[tf.Tensor], Setting, Iterator[int]], list[tf.Tensor]]


class Autotuner:
    """Builds the candidates' all-reduce and the probes; its hook picks one at session start."""

    def __init__(self, settings: Sequence[Setting], group_size: int, group_key: int, runs: int = 2):
        if not settings:
            raise ConfigError("autotune needs at least one candidate setting")
        if runs < 1:
            raise ConfigError(f"autotune_runs must be >= 1, got {runs}")
        self.settings = list(settings)
        self.group_size, self.group_key, self.runs = group_size, group_key, runs
        self._probes: list[tf.Operation] = []
        self._times = self._agreed = self._index = self._set_index = self._chosen_ph = None
        self.chosen: Setting | None = None  # set by the hook
        self.seconds: list[float] = []  # per candidate, summed over the replicas

    def reduce(
        self, grads: list[tf.Tensor], reduce_fn: ReduceFn, keys: Iterator[int], first: bool = True
    ) -> list[tf.Tensor]:
        """`reduce_fn(grads, setting, keys)` for the chosen setting; builds the probes too.

        Call on the device the all-reduce runs on; every replica must call it
        with the same shapes and the same `keys` position. Once per step of a
        run: the first call (`first`) builds the probes and the choice, the
        others use them.
        """
        if not grads:
            return []
        if first:
            self._index = v1.get_variable(
                "allreduce_setting",
                initializer=0,
                dtype=tf.int32,
                trainable=False,
                collections=[v1.GraphKeys.LOCAL_VARIABLES],
            )
        branches = [lambda s=s: reduce_fn(grads, s, keys) for s in self.settings]
        reduced = tf.switch_case(self._index.read_value(), branches, name="autotuned")
        if not first:
            return list(reduced)
        with tf.name_scope("autotune"):
            zeros = [tf.zeros(g.shape, g.dtype) for g in grads]
            for i, setting in enumerate(self.settings):
                with tf.name_scope(f"probe_{i}"):
                    self._probes.append(tf.group(*reduce_fn(zeros, setting, keys)))
            self._times = v1.placeholder(tf.float32, [len(self.settings)], name="seconds")
            self._agreed = tf.raw_ops.CollectiveReduceV2(
                input=self._times,
                group_size=self.group_size,
                group_key=self.group_key,
                instance_key=next(keys),
                ordering_token=[],
                merge_op="Add",
                final_op="Id",
            )
            self._chosen_ph = v1.placeholder(tf.int32, [], name="chosen")
            self._set_index = self._index.assign(self._chosen_ph, read_value=False)
        return list(reduced)

    def hook(self) -> v1.train.SessionRunHook:
        return _AutotuneHook(self)

    def tune(self, session) -> Setting:
        """Probe every candidate, agree with the other replicas, select the fastest (all replicas at once)."""
        if self._index is None:
            return self.settings[0]
        mine = []
        for probe in self._probes:
            session.run(probe)  # first run: collective resolution, kernel caches
            start = time.perf_counter()
            for _ in range(self.runs):
                session.run(probe)
            mine.append((time.perf_counter() - start) / self.runs)
        summed = session.run(self._agreed, {self._times: np.asarray(mine, np.float32)})
        best = int(np.argmin(summed))
        session.run(self._set_index, {self._chosen_ph: best})
        self.chosen, self.seconds = self.settings[best], [float(s) / self.group_size for s in summed]
        timings = ", ".join(
            f"{s}: {t * 1e3:.0f} ms" for s, t in zip(self.settings, self.seconds, strict=True)
        )
        log.info("all-reduce autotune chose %s (mean over replicas per all-reduce: %s)", self.chosen, timings)
        return self.chosen


class _AutotuneHook(v1.train.SessionRunHook):
    """Runs the search once per session, after initialisation and before the first step."""

    def __init__(self, tuner: Autotuner):
        self._tuner = tuner

    def after_create_session(self, session, coord):
        self._tuner.tune(session)
