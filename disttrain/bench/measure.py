"""From the tasks' log lines to steady-state rates and a measured window: pure functions.

Every replica logs a line each `every_n` of its own steps
(`metrics.THROUGHPUT_LINE`, written by metrics.ThroughputHook):

    12:00:01 INFO /job:worker/task:1 step 840  loss 0.1234  examples/sec 402.1 (this task)

and the chief adds `  1604.2 (cluster)  global_step/sec 12.53`. The rates in a
line are timed inside the task (perf_counter over exactly `every_n` local
steps), so they are exact; the benchmark adds the time at which it *saw* the
line (it polls every 50 ms), used only to decide which intervals count and to
bracket the window over which link counters are read.

Method:

1. Warm-up: every replica's first `warmup` intervals are dropped (session
   start, the chief's first checkpoint, the other replicas still starting).
   `t_start` is when the last replica finished its warm-up: from then on
   every replica is in steady state at once.
2. A replica's interval is measured if it began after `t_start` (the line
   before it was seen at or after `t_start`). A replica's rate is its measured
   steps over their summed durations (each duration = steps / the line's rate).
3. The cluster's rates are the chief's `(cluster)` and `global_step/sec`
   figures averaged the same way, weighted by duration.
4. The window for byte and CPU counters runs from the chief's first line at or
   after `t_start` to its last line; the benchmark snapshots the counters as it
   sees each chief line. Bytes per step = counter difference / the global
   steps taken between the two snapshots (`Measurement.window_counted_steps`).
5. The run is complete once every replica has `measure` measured intervals.

The loss is kept too: a run whose loss rises tenfold has diverged, and a
diverged model can step faster (dead units make cheaper kernels), so the
benchmark flags it rather than report its speed as the model's.

A run that trains nothing is not measured at all (`trained_nothing`): steps
that apply no update are fast, and their rate would read as a result. The
lines say so whatever system wrote them: the global step a replica sees does
not move over its measured intervals, or its loss never changes on the fixed
synthetic batch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from disttrain.base import logs
from disttrain.runtime import metrics


@dataclasses.dataclass(frozen=True)
class Sample:
    """One interval line of one replica, with what the benchmark read when it saw it."""

    t: float  # monotonic seconds when the line was seen
    global_step: int
    local_examples_per_sec: float
    loss: float = float("nan")
    cluster_examples_per_sec: float | None = None  # chief only
    global_steps_per_sec: float | None = None  # chief only
    link_bytes: tuple[tuple[int, int], ...] | None = None  # per host (sent, received); chief lines
    cpu_seconds: Mapping[str, float] | None = None  # per task; chief lines
    budget: object | None = None  # the hosts' CPU budget counters (bench.budget.Reading); chief lines


def parse_line(line: str) -> dict | None:
    """The numbers in a task's console throughput line (`disttrain.base.logs` format), or None."""
    message = logs.message_of(line)
    return None if message is None else metrics.parse_throughput(message)


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Steady-state rates of a run and the chief's window for counters."""

    t_start: float
    steps_per_sec: Mapping[str, float]  # per replica, its own steps
    intervals: Mapping[str, int]  # measured intervals per replica
    cluster_examples_per_sec: float
    global_steps_per_sec: float
    window_start: Sample
    window_end: Sample
    first_loss: float  # the chief's first logged loss
    max_loss: float  # the highest loss any replica logged in its measured intervals
    alongside: float | None = None  # steps/s of one process alone beside the run, on a budget of its own

    @property
    def diverged(self) -> bool:
        """The loss rose tenfold: the figures then time a broken model (e.g. dead ReLUs)."""
        return not self.max_loss <= 10 * max(self.first_loss, 1e-3)

    @property
    def window_seconds(self) -> float:
        return self.window_end.t - self.window_start.t

    @property
    def window_global_steps(self) -> int:
        return self.window_end.global_step - self.window_start.global_step

    @property
    def window_counted_steps(self) -> float:
        """Global steps taken between the two counter snapshots of the window.

        The counters are read when the benchmark *sees* a chief line, up to a
        poll (more on a loaded machine) after the chief wrote it; the step in
        the line is the step when it was written. On a fast model the gap is
        several steps, and a window of 40 steps then read 25% too few bytes per
        step. The chief's timed global-step rate over the seconds between the
        snapshots counts the steps the counters saw; the lines' step difference
        is the fallback when the chief logs no rate.
        """
        if self.global_steps_per_sec > 0 and self.window_seconds > 0:
            return self.global_steps_per_sec * self.window_seconds
        return float(self.window_global_steps)

    def link_bytes_per_step(self) -> list[tuple[float, float]] | None:
        """(sent, received) per host per global step over the window; None without counters."""
        a, b = self.window_start.link_bytes, self.window_end.link_bytes
        steps = self.window_counted_steps
        if a is None or b is None or steps <= 0:
            return None
        return [((s1 - s0) / steps, (r1 - r0) / steps) for (s0, r0), (s1, r1) in zip(a, b, strict=True)]

    def cpu_seconds(self) -> dict[str, float] | None:
        """CPU seconds used over the window, per counter (task); None without counters."""
        a, b = self.window_start.cpu_seconds, self.window_end.cpu_seconds
        if a is None or b is None:
            return None
        return {task: b[task] - a[task] for task in a if task in b}

    def cpu_seconds_per_step(self) -> dict[str, float] | None:
        """CPU seconds each counter (task) used per global step over the window."""
        used, steps = self.cpu_seconds(), self.window_counted_steps
        if used is None or steps <= 0:
            return None
        return {task: seconds / steps for task, seconds in used.items()}


def _measured(samples: Sequence[Sample], t_start: float) -> list[Sample]:
    """The samples whose interval began at or after t_start (the previous line was seen then)."""
    return [s for prev, s in zip(samples, samples[1:], strict=False) if prev.t >= t_start]


def measure(
    samples: Mapping[str, Sequence[Sample]],
    chief: str,
    every_n: int,
    examples_per_step: int,
    warmup: int,
    measure: int,
) -> Measurement | None:
    """Rates once every replica has `warmup` + `measure` intervals in steady state, else None.

    `samples` maps each replica to its lines in order; `every_n` is the
    replica's steps per line, `examples_per_step` its examples per step.
    """
    if warmup < 1 or measure < 1:
        raise ValueError(f"need warmup >= 1 and measure >= 1 intervals, got {warmup}, {measure}")
    if any(len(s) < warmup + measure for s in samples.values()) or chief not in samples:
        return None
    t_start = max(s[warmup - 1].t for s in samples.values())
    measured = {task: _measured(s, t_start) for task, s in samples.items()}
    if any(len(m) < measure for m in measured.values()):
        return None

    def duration(s: Sample) -> float:
        return every_n * examples_per_step / s.local_examples_per_sec if s.local_examples_per_sec else 0.0

    rates = {}
    for task, ms in measured.items():
        seconds = sum(duration(s) for s in ms)
        rates[task] = len(ms) * every_n / seconds if seconds else 0.0
    chief_ms = measured[chief]
    seconds = sum(duration(s) for s in chief_ms)

    def weighted(field: str) -> float:
        values = [(getattr(s, field), duration(s)) for s in chief_ms]
        if not seconds or any(v is None for v, _ in values):
            return 0.0
        return sum(v * d for v, d in values) / seconds

    window = [s for s in samples[chief] if s.t >= t_start]
    return Measurement(
        t_start=t_start,
        steps_per_sec=rates,
        intervals={task: len(ms) for task, ms in measured.items()},
        cluster_examples_per_sec=weighted("cluster_examples_per_sec"),
        global_steps_per_sec=weighted("global_steps_per_sec"),
        window_start=window[0],
        window_end=window[-1],
        first_loss=samples[chief][0].loss,
        max_loss=max(s.loss for ms in measured.values() for s in ms),
    )


LOSS_DIGITS = 4  # metrics.THROUGHPUT_LINE prints the loss to 4 decimals


def trained_nothing(samples: Mapping[str, Sequence[Sample]], t_start: float, every_n: int) -> str | None:
    """Why a measured run trained nothing, or None if every replica shows training.

    `samples` and `t_start` are those `measure` took and returned. Two signs,
    read per replica:

    - its global step did not advance over its measured intervals (from the
      line it was seen at t_start or after to its last): no update was
      applied, by it or (synchronous) by anyone;
    - its loss is the same in every line it wrote, warm-up included: on a
      fixed batch, no update reached the variables it reads. A loss printed
      as 0.0000 is exempt: a model that has fit its batch shows that too.

    It does not judge how well a run trains (`Measurement.diverged` flags a
    loss that rises) nor whether the global step moves as fast as it should.
    """
    stuck, flat = [], []
    for task, ss in samples.items():
        window = [s for s in ss if s.t >= t_start]
        if len(window) >= 2 and window[-1].global_step <= window[0].global_step:
            stuck.append((task, window))
        losses = {s.loss for s in ss}
        if len(ss) >= 2 and len(losses) == 1:
            (loss,) = losses
            if math.isfinite(loss) and round(loss, LOSS_DIGITS) != 0:
                flat.append((task, loss, len(ss)))
    reasons = []
    if stuck:
        task, window = stuck[0]
        steps = (len(window) - 1) * every_n
        reasons.append(
            f"global step did not advance ({window[0].global_step} -> {window[-1].global_step} "
            f"over {steps} local steps of {task}{_others(stuck)})"
        )
    if flat:
        task, loss, lines = flat[0]
        reasons.append(
            f"loss constant at {loss:.{LOSS_DIGITS}f} (all {lines} lines of {task}{_others(flat)})"
        )
    return "; ".join(reasons) or None


def _others(found: list) -> str:
    return f" and {len(found) - 1} other replica(s)" if len(found) > 1 else ""
