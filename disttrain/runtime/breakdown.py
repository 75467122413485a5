"""Where a replica's step goes: computing, waiting for input, moving variables and gradients (per PS
task), waiting for peers, and the framework's own time.

Every replica times each of its steps and, now and then, traces one
(`RunOptions.FULL_TRACE`: the StepStats list each op's start and end on
every device the step ran on, the PS tasks' included). A traced step's
timeline is swept: each instant goes to one part, the first of `PARTS`
that has an op running then, so that a transfer hidden behind this task's
compute costs the step nothing and one that nothing hides is the step's.
An instant with no op running anywhere is the framework's, as is the time
outside `session.run` (Python, the hooks, the loop). The parts' shares of
the traced steps' run time, times the untraced steps' mean run time, plus
their mean time outside it, give seconds per step that add up to the step.

What counts as what, by op type (`part_of`):
- input: the input pipeline's get-next ops on this task;
- peers: collectives (the all-reduce ring) and the sync PS's queues, where a
  replica waits for the others and for the chief's update;
- transfer: sends and receives, and whatever runs on a PS task (the update
  applied there), attributed to that PS task; the async overlap's gradient
  queue when the step waits for its transfer loop;
- compute: every other op on this task.

Tracing costs a traced step its own time again and more; the hook traces
the next step only once the untraced time since the last trace is
`1 / budget` times what the last trace cost, so the cost stays within the
budget (1% by default), measured, not assumed (`Breakdown.trace_cost`).
Clocks: the sweep compares the start times of ops on different tasks, which
separate hosts read from their own clocks; NTP keeps them within a
millisecond or so, which is noise beside a step of tens of milliseconds.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import statistics
import time
from collections.abc import Iterable

import tensorflow as tf

from disttrain.base import machine
from disttrain.graph import run_steps
from disttrain.runtime import metrics

v1 = tf.compat.v1
log = logging.getLogger("disttrain")

# In the order the sweep prefers them: an instant in which this task computes is compute, whatever
# else runs beside it.
PARTS = ("compute", "input", "peers", "transfer", "framework")
INPUT_OPS = frozenset(
    {
        "IteratorGetNext",
        "IteratorGetNextSync",
        "IteratorGetNextAsOptional",
        "OptionalGetValue",
        "OptionalHasValue",
        "MultiDeviceIteratorGetNextFromShard",
    }
)
TRANSFER_OPS = frozenset({"_Recv", "_HostRecv", "_Send", "_HostSend", "RecvTensor"})
_QUEUE_OPS = ("QueueDequeue", "QueueEnqueue")
# Name scopes of the strategies' queues: where a replica waits for peers (sync PS's reports and
# tokens) or for its own transfer loop (async overlap's one-gradient queue).
PEER_SCOPES = ("sync_queues/",)
TRANSFER_SCOPES = ("gradient_queue/",)
_LABEL = re.compile(r"^(?:\[[^\]]*\]\s*)?([^ ]+) = (\w+)\((.*)")
# A tensor received from another task: "[3.8MB] [1.9Gb/s] edge_10_grad from /job:worker/... to /job:ps/...".
_RECEIVED = re.compile(r"^\[([\d.]+)([KMG]?i?B)\].* from (\S+) to (\S+)")
# Binary, whatever the label says: a 1000 x 1000 float32 gradient (4,000,000 bytes) reads "3.8MB".
_UNITS = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def _task_of(device: str) -> str:
    """'/job:ps/replica:0/task:1/device:CPU:0' -> '/job:ps/task:1' ('' for a device of no task)."""
    job = re.search(r"/job:([^/]+)", device)
    task = re.search(r"/task:(\d+)", device)
    return f"/job:{job.group(1)}/task:{task.group(1)}" if job and task else ""


def part_of(node_name: str, op: str, device: str, peer_device: str, me: str) -> tuple[str, str]:
    """(part, the PS task it is moving to or from, or '') of one op run on `device`, for task `me`.

    `peer_device`: the other end of a send or receive ('' for any other op).
    """
    task = _task_of(device)
    if op in TRANSFER_OPS:
        other = _task_of(peer_device) if task == me else task
        return "transfer", other if other.startswith("/job:ps/") else ""
    if task.startswith("/job:ps/") and task != me:
        return "transfer", task  # the PS's side of the step: the update applied there
    if task != me:
        return "", ""  # another replica's op (a collective's other end): not this task's step
    if op in INPUT_OPS:
        return "input", ""
    if op.startswith("Collective"):
        return "peers", ""
    if op.startswith(_QUEUE_OPS):
        if any(scope in node_name for scope in PEER_SCOPES):
            return "peers", ""
        if any(scope in node_name for scope in TRANSFER_SCOPES):
            return "transfer", ""
    return "compute", ""


@dataclasses.dataclass(frozen=True)
class Span:
    start: float  # seconds
    end: float
    part: str
    ps: str = ""  # the PS task a transfer is with ('' if none, or not a transfer)
    nbytes: float = 0.0  # bytes a received tensor carried (0 where the trace does not say)


def spans(step_stats, me: str) -> list[Span]:
    """The ops of one traced step as spans, each with its part (ops of no part of this task's left out)."""
    out = []
    for dev in step_stats.dev_stats:
        for node in dev.node_stats:
            span = _span(node, dev.device, me)
            if span is not None:
                out.append(span)
    return out


def _span(node, device: str, me: str) -> Span | None:
    """One op of a trace as a span (None: of no part of this task's step, or of no length)."""
    label = node.timeline_label or ""
    match, received = _LABEL.match(label), _RECEIVED.match(label)
    op = match.group(2) if match else node.node_name.split(":")[0]
    name = match.group(1) if match else node.node_name
    peer, nbytes = "", 0.0
    if received:  # RecvTensor: the side that is not this device's task is the peer
        source, dest = received.group(3), received.group(4)
        peer = source if _task_of(dest) == _task_of(device) else dest
        nbytes = float(received.group(1)) * _UNITS.get(received.group(2), 1)
    elif match and op in TRANSFER_OPS and " @" in match.group(3):
        peer = match.group(3).rsplit(" @", 1)[1].rstrip(")")
    part, ps = part_of(name, op, device, peer, me)
    start = node.all_start_micros / 1e6
    end = start + max(node.all_end_rel_micros, 0) / 1e6
    if not part or end <= start:
        return None
    return Span(start, end, part, ps, nbytes)


def sweep(traced: Iterable[Span]) -> tuple[dict[str, float], dict[str, float], float]:
    """The seconds of each part in the window from the first op's start to the last op's end, each
    instant going to the first part of PARTS with an op running then (none: 'framework'); the
    transfer seconds by PS task (shared evenly among those moving at that instant); and the window.
    """
    traced = list(traced)
    seconds = dict.fromkeys(PARTS, 0.0)
    by_ps: dict[str, float] = {}
    if not traced:
        return seconds, by_ps, 0.0
    events = sorted({t for s in traced for t in (s.start, s.end)})
    # Spans sorted by start, walked once: those running in each elementary interval.
    ordered = sorted(traced, key=lambda s: s.start)
    running: list[Span] = []
    k = 0
    for left, right in zip(events, events[1:], strict=False):
        while k < len(ordered) and ordered[k].start <= left:
            running.append(ordered[k])
            k += 1
        running = [s for s in running if s.end > left]
        width = right - left
        parts = {s.part for s in running}
        part = next((p for p in PARTS if p in parts), "framework")
        seconds[part] += width
        if part == "transfer":
            tasks = sorted({s.ps for s in running if s.part == "transfer"})
            for ps in tasks:
                by_ps[ps or "other"] = by_ps.get(ps or "other", 0.0) + width / len(tasks)
    return seconds, by_ps, events[-1] - events[0]


def moving(traced: Iterable[Span]) -> float:
    """Seconds in which any transfer ran, hidden behind compute or not (the union of their spans)."""
    total, end = 0.0, float("-inf")
    for span in sorted((s for s in traced if s.part == "transfer"), key=lambda s: s.start):
        if span.end > end:
            total += span.end - max(span.start, end)
            end = span.end
    return total


@dataclasses.dataclass
class Breakdown:
    """Where this task's step went: seconds per step by part, and what measuring it cost.

    `seconds` adds up to `step_secs`, the mean wall time of this task's steps
    (a run of several steps counts as that many); `transfer_by_ps` splits the
    transfer seconds by PS task; `traced` is how many steps the shares come
    from; `trace_cost` is what tracing added, as a share of the run;
    `bytes_by_ps` is what the tensors received from and by each PS task
    carried per step, as the traces label them (two significant digits; the
    median over the traced steps whose trace has the transfers' labels, which
    a trace now and then lacks).
    """

    step_secs: float = 0.0
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    transfer_by_ps: dict[str, float] = dataclasses.field(default_factory=dict)
    bytes_by_ps: dict[str, float] = dataclasses.field(default_factory=dict)  # received, per step
    traced: int = 0
    trace_cost: float = 0.0
    moving_secs: float = 0.0  # seconds a step in which transfers ran, hidden or not (what the bytes took)
    cpu_secs: float = 0.0  # this process's CPU seconds per step (every thread: compute, gRPC, input)
    machine_busy: float = 0.0  # cores' worth this machine kept busy meanwhile (any process; 0: unknown)
    machine_cores: float = 0  # the cores it counts: the machine's, or its cgroup's CPU limit (base.machine)
    cores_limited: bool = False  # machine_cores is a cgroup's CPU limit, machine_busy that group's own

    def shares(self) -> dict[str, float]:
        total = sum(self.seconds.values())
        return {p: (s / total if total > 0 else 0.0) for p, s in self.seconds.items()}

    def line(self) -> str:
        """'compute 61%, input 2%, peers 0%, transfer 30% (ps0 27%, ps1 3%), framework 7%'."""
        shares, total = self.shares(), sum(self.seconds.values())
        parts = []
        for part in PARTS:
            text = f"{part} {100 * shares.get(part, 0.0):.0f}%"
            if part == "transfer" and len(self.transfer_by_ps) > 1 and total > 0:
                each = ", ".join(
                    f"{_short(ps)} {100 * s / total:.0f}%" for ps, s in sorted(self.transfer_by_ps.items())
                )
                text += f" ({each})"
            parts.append(text)
        return ", ".join(parts)

    def summary(self) -> str:
        """The closing line: 'step 42.1 ms: compute 61%, ... (3 step(s) traced, 0.4% of the run; this
        machine's 2 cores 97% busy)'."""
        cores = f"; {self.cores_text} {100 * self.busy_share:.0f}% busy" if self.machine_cores else ""
        return (
            f"step {1000 * self.step_secs:.1f} ms: {self.line()} "
            f"({self.traced} step(s) traced, {100 * self.trace_cost:.1f}% of the run{cores})"
        )

    @property
    def waits_for_cores(self) -> bool:
        """This machine's cores were `SATURATED` while this process had less than `1 - BINDS` of a core
        a step: a core of its own would make its step at least as much faster as a part that binds.
        (A compute-bound task that computed on a core nearly all along is not waiting.) Under a CPU
        limit below one core, "a core" is the limit: a task that used all of it was computing on a
        slower core, not waiting for one; one that shared it with its host's other tasks was."""
        core = min(1.0, self.machine_cores) if self.cores_limited else 1.0
        return self.busy_share >= SATURATED and 0 < self.cpu_secs < (1 - BINDS) * core * self.step_secs

    @property
    def cores_text(self) -> str:
        """'this machine's 2 cores', or 'its CPU limit of 0.45 core(s)'."""
        if self.cores_limited:
            return f"its CPU limit of {self.machine_cores:g} core(s)"
        return f"this machine's {self.machine_cores:g} cores"

    @property
    def busy_share(self) -> float:
        """The share of this machine's cores busy while the steps were measured (0: unknown)."""
        return self.machine_busy / self.machine_cores if self.machine_cores else 0.0

    def of_step(self, part: str) -> str:
        """'279 ms of a 904 ms step'."""
        return f"{_ms(self.seconds.get(part, 0.0))} of a {_ms(self.step_secs)} step"

    @classmethod
    def of(cls, fields: dict) -> Breakdown:
        """From its dict (a result.json's `breakdown`)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in fields.items() if k in known})


# A part of the step binds it when it is at least this share of it (removing it would make the step at
# least 18% faster); one PS task carrying this much more than the mean of the bytes is unbalanced.
BINDS = 0.15
UNBALANCED = 1.3
# The machine's cores are all taken when at least this share of them was busy while the steps ran.
SATURATED = 0.9


CORES = "cores"  # a cause that is no part of the step: the machine's cores were all busy


@dataclasses.dataclass(frozen=True)
class Cause:
    """A part of a replica's step that binds it: the part, its seconds a step and the evidence in words."""

    part: str
    seconds: float
    text: str
    ps_balance: float = 1.0  # transfer: the busiest PS task's bytes over the mean (1.0: balanced or one PS)


def causes(where: Breakdown, name: str, ps_loads: Iterable[float] = ()) -> list[Cause]:
    """The parts beside compute that take at least `BINDS` of `name`'s step, longest first; before them,
    `CORES` when the task waited for the machine's cores (`Breakdown.waits_for_cores`).

    ps_loads: bytes of variables on each PS task (run.json's), to say whether
    one PS carries most of what moves.
    """
    loads = list(ps_loads)
    balance = max(loads) / (sum(loads) / len(loads)) if len(loads) > 1 and sum(loads) else 1.0
    moved = sum(where.bytes_by_ps.values())
    transfer = f"moving variables and gradients takes {where.of_step('transfer')}"
    if moved:
        transfer += f" ({moved / 2**20:.1f} MiB a step)"
    if balance >= UNBALANCED:
        transfer = f"one PS holds most of the bytes (busiest/mean {balance:.1f}); {transfer}"
    texts = {
        "input": f"most of {name}'s step waits for its input pipeline ({where.of_step('input')})",
        "transfer": transfer,
        "peers": f"{name} waits for its peers {where.of_step('peers')}",
        "framework": f"the framework's own time (Python, hooks, session.run) is {where.of_step('framework')}",
    }
    out = []
    for part, text in texts.items():
        seconds = where.seconds.get(part, 0.0)
        if where.step_secs > 0 and seconds >= BINDS * where.step_secs:
            out.append(Cause(part, seconds, text, balance if part == "transfer" else 1.0))
    out.sort(key=lambda c: -c.seconds)
    if where.waits_for_cores:
        # First: on cores that are all taken, any part of the step may be a wait for one.
        text = (
            f"{where.cores_text} were {100 * where.busy_share:.0f}% busy while "
            f"{name} stepped (its tasks wait for a core, inside every part of the step)"
        )
        out.insert(0, Cause(CORES, where.seconds.get("compute", 0.0), text))
    return out


def verdict(where: Breakdown, name: str, ps_loads: Iterable[float] = ()) -> str:
    """One line: what binds `name`'s step, with its evidence, or that compute does."""
    found = causes(where, name, ps_loads)
    if found:
        return found[0].text
    share = where.seconds.get("compute", 0.0) / where.step_secs if where.step_secs else 0.0
    return f"no bottleneck: compute is {100 * share:.0f}% of {name}'s step ({_ms(where.step_secs)})"


def _ms(seconds: float) -> str:
    """'279 ms', '0.4 ms'."""
    ms = 1000 * seconds
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def _short(task: str) -> str:
    """'/job:ps/task:1' -> 'ps1'."""
    match = re.fullmatch(r"/job:(\w+)/task:(\d+)", task)
    return f"{match.group(1)}{match.group(2)}" if match else task


class BreakdownHook(v1.train.SessionRunHook):
    """Times every step of this task and traces one now and then; `breakdown()` says where they went.

    me: this task ('/job:worker/task:0'). after_steps: local steps before any
    is counted (start-up); the first trace comes `MIN_TIMED` timed steps
    later. budget: the share of the run that tracing may cost. task_logdir:
    where `time/<part>` (share of the traced step) and `time/step_ms` go at
    each traced step (None: nowhere). global_step: fetched with a traced
    step, to write its scalars at.
    """

    MIN_TIMED = 10

    def __init__(self, me: str, after_steps=20, budget=0.01, task_logdir=None, global_step=None):
        self._me, self._after, self._budget = _task_of(me), after_steps, budget
        self._logdir, self._writer, self._global_step = task_logdir, None, global_step
        self._local = 0
        self._timed = {"steps": 0, "run": 0.0, "outside": 0.0}  # untraced steps and their seconds
        self._traced = {"steps": 0, "window": 0.0, "parts": dict.fromkeys(PARTS, 0.0)}  # traced steps
        self._by_ps: dict[str, float] = {}
        self._bytes: dict[str, list[float]] = {}  # per PS task, per traced run: bytes a step
        self._cost = 0.0  # seconds tracing added
        self._moving = 0.0  # traced seconds in which transfers ran
        self._credit = 0.0  # untraced seconds since the last trace ...
        self._owed = 0.0  # ... and what they must reach before the next: its cost / budget
        self._mark: float | None = None  # when the last run ended
        self._started = 0.0
        self._tracing = False
        self._run_started = 0.0
        self._window: tuple[float, float, float] | None = None  # wall, machine busy, own CPU at the start
        self._window_end: tuple[float, float, float, int] | None = None  # ... at the last trace, and steps
        self._counted = 0  # steps since the start

    def begin(self):
        self._writer = metrics.graphless_writer(self._logdir) if self._logdir else None

    def after_create_session(self, session, coord):
        self._started = time.perf_counter()

    def before_run(self, run_context):
        timed = self._timed["steps"]
        self._tracing = timed >= self.MIN_TIMED and self._credit >= self._owed
        self._run_started = time.perf_counter()
        if not self._tracing:
            return None
        options = v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE)
        fetches = self._global_step if self._global_step is not None else []
        return v1.train.SessionRunArgs(fetches, options=options)

    def after_run(self, run_context, run_values):
        now = time.perf_counter()
        steps = run_steps.steps_in(run_context)
        run_secs = now - self._run_started
        outside = self._run_started - self._mark if self._mark is not None else 0.0
        self._mark = now
        self._local += steps
        if self._local <= self._after:
            return  # start-up: not counted
        if self._window is None:  # the first counted step: the CPU window starts at its end
            self._window = (now, machine.busy_seconds(), time.process_time())
        else:
            self._counted += steps
        if self._tracing:  # the window ends before reading the trace, which costs this process CPU
            self._window_end = (now, machine.busy_seconds(), time.process_time(), self._counted)
            self._take(run_values.run_metadata.step_stats, run_secs, steps, run_values.results)
            return
        timed = self._timed
        timed["steps"] += steps
        timed["run"] += run_secs
        timed["outside"] += outside
        self._credit += run_secs + outside

    def _take(self, step_stats, run_secs: float, steps: int, global_step) -> None:
        found = spans(step_stats, self._me)
        seconds, by_ps, window = sweep(found)
        self._moving += moving(found)
        moved: dict[str, float] = {}
        for span in found:
            if span.nbytes and span.ps:
                moved[span.ps] = moved.get(span.ps, 0.0) + span.nbytes / steps
        for ps, nbytes in moved.items():
            self._bytes.setdefault(ps, []).append(nbytes)
        traced = self._traced
        traced["steps"] += steps
        traced["window"] += window
        for part, s in seconds.items():
            traced["parts"][part] += s
        for ps, s in by_ps.items():
            self._by_ps[ps] = self._by_ps.get(ps, 0.0) + s
        typical = self._timed["run"] / self._timed["steps"] * steps
        extra = max(run_secs - typical, 0.0)
        self._cost += extra
        self._owed, self._credit = extra / self._budget, 0.0
        if self._writer is not None and window > 0:
            values = {f"time/{p}": s / window for p, s in seconds.items()}
            values["time/step_ms"] = 1000 * typical / steps
            step = int(global_step) if self._global_step is not None else 0
            self._writer.add_summary(metrics.scalar_summary(values), step)

    def _cpu(self) -> dict:
        """This process's CPU per step and how busy this machine was, from the first counted step to the
        last traced one."""
        if self._window is None or self._window_end is None:
            return {}
        (wall, busy, own), (wall_end, busy_end, own_end, steps) = self._window, self._window_end
        if wall_end <= wall or not steps:
            return {}
        found = {"cpu_secs": (own_end - own) / steps}
        if busy_end > 0:
            cores = machine.cores()
            busy_cores = min((busy_end - busy) / (wall_end - wall), cores)
            found.update(
                machine_busy=busy_cores, machine_cores=cores, cores_limited=machine.limit() is not None
            )
        return found

    def breakdown(self) -> Breakdown | None:
        """Seconds per step by part (None before any step was traced).

        The traced steps' executor window, split by part, is scaled to an
        untraced step's time in `session.run` (tracing only lengthens it, so
        at most that); the rest of that time, and the time between runs, are
        the framework's.
        """
        traced, timed = self._traced, self._timed
        if not traced["steps"] or not timed["steps"] or traced["window"] <= 0:
            return None
        run = timed["run"] / timed["steps"]
        executor = min(traced["window"] / traced["steps"], run)
        scale = executor / traced["window"]
        seconds = {p: s * scale for p, s in traced["parts"].items()}
        seconds["framework"] += run - executor + timed["outside"] / timed["steps"]
        elapsed = time.perf_counter() - self._started
        return Breakdown(
            **self._cpu(),
            step_secs=sum(seconds.values()),
            seconds=seconds,
            transfer_by_ps={ps: s * scale for ps, s in self._by_ps.items()},
            moving_secs=self._moving * scale,
            bytes_by_ps={ps: statistics.median(b) for ps, b in self._bytes.items()},
            traced=traced["steps"],
            trace_cost=self._cost / elapsed if elapsed > 0 else 0.0,
        )
