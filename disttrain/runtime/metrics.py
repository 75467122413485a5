"""Throughput: pure math, and the session hook that feeds it to the console and TensorBoard.

The math is plain functions on numbers (unit-tested); the hook only
measures time and counts and calls them.

TensorBoard layout under the log directory:
- `<logdir>/`: the chief's cluster-wide scalars `examples/sec`,
  `global_step/sec` and `loss`.
- `<logdir>/tasks/<job>_<index>/`: each replica's own `examples/sec` and
  `loss`, so a straggler shows as one slow run.
- `<logdir>/`, TEXT tab: what ran (`run/...`: settings, cluster, strategy,
  placement, and the operative gin config on the gin path), written once by
  the chief at start.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import string
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from disttrain.base import tf_internals
from disttrain.base.errors import DivergedError
from disttrain.graph import run_steps

v1 = tf.compat.v1
log = logging.getLogger("disttrain")


def rate(count: float, seconds: float) -> float:
    """count / seconds, 0 for an empty interval."""
    return count / seconds if seconds > 0 else 0.0


def cluster_examples_per_sec(global_steps: float, examples_per_global_step: int, seconds: float) -> float:
    """Whole-cluster throughput from the global step's progress."""
    return rate(global_steps * examples_per_global_step, seconds)


@dataclasses.dataclass(frozen=True)
class Stats:
    mean: float
    stderr: float
    jitter: float  # median absolute deviation: robust spread of the samples
    count: int


def summarize(samples: Sequence[float]) -> Stats:
    """Mean, standard error of the mean and jitter of throughput samples."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        return Stats(0.0, 0.0, 0.0, 0)
    stderr = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0
    jitter = float(np.median(np.abs(x - np.median(x))))
    return Stats(float(x.mean()), stderr, jitter, int(x.size))


def scaling_efficiency(throughput: float, num_workers: int, single_process_throughput: float) -> float:
    """throughput(N) / (N x one process alone): 1.0 is linear scaling."""
    return rate(throughput, num_workers * single_process_throughput)


def async_throughput(per_worker: Sequence[float]) -> float:
    """N x the slowest worker: async speed that leaves workers behind does not count."""
    return len(per_worker) * min(per_worker) if per_worker else 0.0


def throughput_drop(rates: Sequence[float], window: int, lookback: int = 20) -> float:
    """How far the last `window` intervals all fell below the best before them (0..1).

    Compares the *best* of the last `window` rates with the best of the
    `lookback` rates before them, so one slow interval (a checkpoint, a
    noisy neighbour) is not a drop; a sustained slowdown is. 0 when there is
    not enough history or no drop.
    """
    if window < 1 or len(rates) < window + 1:
        return 0.0
    recent = max(rates[-window:])
    before = max(rates[-window - lookback : -window])
    return max(0.0, 1.0 - recent / before) if before > 0 else 0.0


def peak_memory_mb() -> float:
    """This process's peak resident memory in MiB so far (Linux VmHWM; ru_maxrss elsewhere)."""
    return _status_mb("VmHWM:")


def process_memory_mb() -> float:
    """Resident memory of this process in MiB (Linux /proc; peak RSS elsewhere)."""
    return _status_mb("VmRSS:")


def _status_mb(field: str) -> float:
    """A memory line of /proc/self/status in MiB; without /proc, the peak resident memory."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def scalar_summary(values: dict[str, float]) -> v1.Summary:
    return v1.Summary(value=[v1.Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()])


def text_summary(texts: dict[str, str]) -> v1.Summary:
    """TensorBoard's TEXT tab entries, one per tag, each shown as preformatted text."""
    metadata = v1.SummaryMetadata(plugin_data=v1.SummaryMetadata.PluginData(plugin_name="text"))
    return v1.Summary(
        value=[
            v1.Summary.Value(
                tag=tag,
                metadata=metadata,
                tensor=tf.make_tensor_proto("\n".join("    " + line for line in text.splitlines())),
            )
            for tag, text in texts.items()
        ]
    )


_GRAPHLESS_WRITERS: dict[str, v1.summary.FileWriter] = {}


def graphless_writer(logdir: str) -> v1.summary.FileWriter:
    """One event file per directory for this process, as FileWriterCache, but with no graph in it."""
    if logdir not in _GRAPHLESS_WRITERS:
        _GRAPHLESS_WRITERS[logdir] = v1.summary.FileWriter(logdir)
    return _GRAPHLESS_WRITERS[logdir]


def write_texts(logdir: str, texts: dict[str, str], step: int = 0) -> None:
    """Add `texts` to the event file TensorBoard reads in `logdir` (the writer the hooks share)."""
    writer = v1.summary.FileWriterCache.get(logdir)
    writer.add_summary(text_summary(texts), step)
    writer.flush()


@dataclasses.dataclass
class TaskThroughput:
    """What one replica measured; written as JSON at the end of training."""

    task: str
    chief: bool = False
    local_steps: int = 0
    global_step: int = 0
    final_loss: float = float("nan")
    examples_per_sec: float = 0.0  # this task, mean over intervals after the first
    steps_per_sec: float = 0.0
    cluster_examples_per_sec: float = 0.0  # chief only: from the global step
    seconds: float = 0.0
    peak_memory_mb: float = 0.0  # this process's peak resident memory (VmHWM), at the end
    # Where its step went (disttrain.runtime.breakdown.Breakdown as a dict; None: never traced).
    breakdown: dict | None = None


@dataclasses.dataclass(frozen=True)
class ThroughputSettings:
    """What a ThroughputHook counts, how often it reports, and where it writes.

    examples_per_local_step / examples_per_global_step: the examples of one
      step of this replica, and of one step of the global step (the cluster's).
    every_n: report every N local steps.
    task_logdir: this replica's TensorBoard directory (None: none written).
    cluster_logdir: the cluster-wide scalars' directory, given on the chief
      only (None: not the chief).
    decay_threshold / decay_window: warn when this task's examples/sec stays
      this far below its recent best (0: never) for this many reports.
    """

    examples_per_local_step: int
    examples_per_global_step: int
    every_n: int
    task_logdir: str | None
    cluster_logdir: str | None
    decay_threshold: float = 0.0
    decay_window: int = 3


class ThroughputHook(v1.train.SessionRunHook):
    """Counts steps; every `every_n` local steps logs and writes throughput.

    Fetches the loss and global step with every run (scalars, read in
    parallel with the run) so that a NaN is caught at the run it appears
    in. A run of several steps (`steps_per_run`) counts those that trained
    (`steps_trained`: with data, before the last step) and reports its last
    step's loss. The first interval includes start-up and is left out of
    the means.
    """

    def __init__(
        self,
        task: str,
        loss: tf.Tensor,
        global_step: tf.Tensor,
        settings: ThroughputSettings,
        data_weight: tf.Tensor | None = None,
        steps_trained: tf.Tensor | None = None,
    ):
        self._fetches = {"loss": loss, "global_step": global_step}
        if data_weight is not None:  # the run's last step had no data (Join): its loss is a stand-in's
            self._fetches["data_weight"] = data_weight
        if steps_trained is not None:  # steps without data, or past the last step, trained nothing
            self._fetches["steps_trained"] = steps_trained
        self._per_local = settings.examples_per_local_step
        self._per_global = settings.examples_per_global_step
        self._every_n = settings.every_n
        self._dirs = (settings.task_logdir, settings.cluster_logdir)
        self.result = TaskThroughput(task=task, chief=settings.cluster_logdir is not None)
        self._local_rates: list[float] = []
        self._cluster_rates: list[float] = []
        self._decay = (settings.decay_threshold, settings.decay_window)
        self._warned_drop = 0.0

    def begin(self):
        # The cluster's directory: the cache shares one event file with TF's checkpoint hook, and
        # TensorBoard's graph comes from there. A task's own directory gets no copy of the graph:
        # a model fed from NumPy arrays holds them as constants, and each copy was 110 MB for
        # 8,000 small images, written twice into every task's events at start-up.
        task_dir, cluster_dir = self._dirs
        self._writers = [
            graphless_writer(task_dir) if task_dir else None,
            v1.summary.FileWriterCache.get(cluster_dir) if cluster_dir else None,
        ]

    def after_create_session(self, session, coord):
        self._start = self._mark = time.perf_counter()
        self._mark_step = self._mark_global = None

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values):
        results = run_values.results
        if "steps_trained" in results:
            trained = int(results["steps_trained"])
        else:  # every step of the run trained
            trained = run_steps.steps_in(run_context)
        if trained == 0:
            return  # its data has ended: it computed stand-in batches, not counted
        loss, step = float(results["loss"]), int(results["global_step"])
        real = results.get("data_weight", 1) > 0  # else the loss is the stand-in batch's
        if real and not math.isfinite(loss):
            raise DivergedError(
                f"loss is {loss} at global step {step}: stopping; the last checkpoint is kept"
            )
        r = self.result
        r.local_steps += trained
        r.global_step = step
        if real:
            r.final_loss = loss
        if self._mark_global is None:  # the first step includes start-up: measure from its end
            self._mark_global, self._mark_step = step, r.local_steps
            self._mark = time.perf_counter()
            self._first = (self._mark, r.local_steps, step)
            return
        if r.local_steps - self._mark_step < self._every_n:
            return
        now = time.perf_counter()
        seconds = now - self._mark
        local = rate((r.local_steps - self._mark_step) * self._per_local, seconds)
        cluster = cluster_examples_per_sec(step - self._mark_global, self._per_global, seconds)
        gsps = rate(step - self._mark_global, seconds)
        self._local_rates.append(local)
        self._cluster_rates.append(cluster)
        task_writer, cluster_writer = self._writers
        if task_writer:
            task_writer.add_summary(scalar_summary({"examples/sec": local, "loss": loss}), step)
        if cluster_writer:
            cluster_writer.add_summary(
                scalar_summary({"examples/sec": cluster, "global_step/sec": gsps, "loss": loss}), step
            )
        msg = THROUGHPUT_LINE.format(task=r.task, step=step, loss=loss, local=local)
        if cluster_writer:
            msg += CLUSTER_SUFFIX.format(cluster=cluster, gsps=gsps)
        log.info(msg)
        self._watch_decay(run_context.session.graph, step, task_writer)
        self._mark, self._mark_step, self._mark_global = now, r.local_steps, step

    def _watch_decay(self, graph, step, writer):
        """Warn once per sustained drop of this task's throughput below its recent best."""
        threshold, window = self._decay
        if threshold <= 0:
            return
        drop = throughput_drop(self._local_rates[1:], window)  # the first interval includes start-up
        if drop < threshold:
            self._warned_drop = 0.0
            return
        if self._warned_drop:
            return
        self._warned_drop = drop
        memory, ops = process_memory_mb(), len(graph.get_operations())
        log.warning(
            f"{self.result.task}: examples/sec fell {100 * drop:.0f}% below its recent best for "
            f"{window} intervals (at global step {step}); process memory {memory:.0f} MiB, graph ops {ops}"
        )
        if writer:
            writer.add_summary(
                scalar_summary(
                    {"health/throughput_drop": drop, "health/memory_mb": memory, "health/graph_ops": ops}
                ),
                step,
            )

    def end(self, session):
        r = self.result
        now = time.perf_counter()
        r.seconds = now - self._start
        r.peak_memory_mb = peak_memory_mb()
        r.global_step = int(session.run(self._fetches["global_step"]))
        if self._mark_global is None:
            return
        # Mean of the logged intervals after the first; a run too short for two
        # intervals is measured whole, from the end of its first step.
        start, first_local, first_global = self._first
        if len(self._local_rates) >= 2:
            r.examples_per_sec = summarize(self._local_rates[1:]).mean
            cluster = summarize(self._cluster_rates[1:]).mean
        else:
            r.examples_per_sec = rate((r.local_steps - first_local) * self._per_local, now - start)
            cluster = cluster_examples_per_sec(r.global_step - first_global, self._per_global, now - start)
        r.steps_per_sec = rate(r.examples_per_sec, self._per_local)
        r.cluster_examples_per_sec = cluster if r.chief else 0.0
        for writer in self._writers:
            if writer:
                writer.flush()


class TraceHook(v1.train.SessionRunHook):
    """Writes a Chrome trace (chrome://tracing, Perfetto) of `steps` local steps of this task.

    The steps traced are those right after the first `after_steps` (past
    start-up and the first checkpoint), one file per run (a run of several
    steps, `steps_per_run`, is traced whole),
    `<directory>/trace_step_<global step>.json` (`..._<local step>.json`
    for a second step that read the same global step, as overlap's lagging
    mirror can): every op of the step on
    every device it ran on (this task's, and the PS tasks' for the
    variables it read and updated), with the transfers between them. The
    rounds of `loops` (a strategy's transfer loop beside the step, see
    `Strategy.traced_loops`) that started while the traced steps ran are in
    the same files, on the same clock: each in the file of the step during
    which it ended, and a round still running when the last traced step
    ends in that step's file, written again when the round ends (at most
    `_LATE_STEPS` steps later).
    """

    _LATE_STEPS = 100

    def __init__(
        self, directory: str, steps: int, after_steps: int, global_step: tf.Tensor, loops: Sequence = ()
    ):
        self._directory, self._steps, self._after = directory, steps, after_steps
        self._global_step = global_step
        self._loops = list(loops)
        self._local = 0  # steps of this task so far (a run may make several)
        self._asked_loops = False
        self._last: tuple[str, Any] | None = None  # the last traced file and its StepStats, while rounds run
        self.written: list[str] = []

    def _tracing(self) -> bool:
        return self._after < self._local + 1 <= self._after + self._steps

    def before_run(self, run_context):
        if not self._tracing():
            return None
        if not self._asked_loops:
            self._asked_loops = True
            for loop in self._loops:  # the rounds beside the traced steps (about one per step)
                loop.trace(self._steps + 1)
        options = v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE)
        return v1.train.SessionRunArgs(self._global_step, options=options)

    def after_run(self, run_context, run_values):
        tracing, self._local = self._tracing(), self._local + run_steps.steps_in(run_context)
        if tracing:
            stats = run_values.run_metadata.step_stats
            name = f"trace_step_{int(run_values.results)}"
            path = os.path.join(self._directory, f"{name}.json")
            if path in self.written:  # overlap's global step is a mirror that can lag: two steps, one value
                path = os.path.join(self._directory, f"{name}_{self._local}.json")
            self._take_rounds(stats)
            self._write(path, stats)
            self.written.append(path)
            log.info("step trace: %s", path)
            last = self._local >= self._after + self._steps
            if last and any([loop.stop_tracing() for loop in self._loops]):
                self._last = (path, stats)  # a traced round is still running: add it when it ends
        elif self._last is not None:
            running = any([loop.stop_tracing() for loop in self._loops])
            if self._take_rounds(self._last[1]):
                self._write(*self._last)
            if not running or self._local > self._after + self._steps + self._LATE_STEPS:
                self._last = None

    def end(self, session):
        if self._last is not None and self._take_rounds(self._last[1]):
            self._write(*self._last)

    def _take_rounds(self, stats) -> bool:
        """Adds to `stats` the loops' rounds that ended since the last call; True if there were any."""
        taken = [rounds for loop in self._loops for rounds in loop.take_traces()]
        for rounds in taken:
            stats.dev_stats.extend(rounds.dev_stats)
        return bool(taken)

    def _write(self, path: str, stats) -> None:
        os.makedirs(self._directory, exist_ok=True)
        with open(path, "w") as f:
            f.write(tf_internals.timeline().Timeline(stats).generate_chrome_trace_format())


# The console line of ThroughputHook, defined once: formatted by the hook, read back by
# `parse_throughput` (the benchmark measures runs from the tasks' logs).
THROUGHPUT_LINE = "{task} step {step}  loss {loss:.4f}  examples/sec {local:.1f} (this task)"
CLUSTER_SUFFIX = "  {cluster:.1f} (cluster)  global_step/sec {gsps:.2f}"


def _pattern(template: str) -> str:
    """A regex for lines formatted from `template`: each field a token, runs of spaces any spaces."""
    out = []
    for literal, field, _spec, _conv in string.Formatter().parse(template):
        out.append(r"\s+".join(re.escape(w) for w in literal.split(" ")).replace(r"\s+\s+", r"\s+"))
        if field:
            out.append(rf"(?P<{field}>\S+)")
    return "".join(out)


_THROUGHPUT = re.compile(f"^{_pattern(THROUGHPUT_LINE)}(?:{_pattern(CLUSTER_SUFFIX)})?$")


def parse_throughput(message: str) -> dict | None:
    """The numbers of a THROUGHPUT_LINE message (with the chief's suffix or not), or None."""
    m = _THROUGHPUT.match(message.strip())
    if not m:
        return None
    try:
        return {
            "task": m["task"],
            "global_step": int(m["step"]),
            "local_examples_per_sec": float(m["local"]),
            "loss": float(m["loss"]),
            "cluster_examples_per_sec": float(m["cluster"]) if m["cluster"] else None,
            "global_steps_per_sec": float(m["gsps"]) if m["gsps"] else None,
        }
    except ValueError:
        return None


def task_logdir(logdir: str, job: str, index: int) -> str:
    return os.path.join(logdir, "tasks", f"{job}_{index}")
