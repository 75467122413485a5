"""A chaos soak: SIGKILL or SIGTERM a random task at random times through a run, under max_restarts.

`soak(...)` starts a LocalCluster that restarts what dies (as TFJob's
ExitCode policy does), signals a random live task (PS, worker or chief)
every `every_secs` on average, from the chief's first progress line until
`duration_secs` have passed or the run is near its end, waits for the end,
and reads the chief's log back into a
`Report`: the faults, the restarts, the steps each fault lost (the global
step before it against the step training resumed from), whether the global
step went back other than at a restore, and every task's exit code.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import re
import signal
import sys
import time

from disttrain.bench.measure import parse_line
from disttrain.edges.local import LocalCluster, LogFollower
from disttrain.launch import read_results

# Where a chief resumes: adopted live state, a restored checkpoint (start or in-process recovery).
_RESUMED = re.compile(r"(?:adopting the PS tasks' live state at global step (\d+)|restoring \S*ckpt-(\d+))")
_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d) ")
_FINISHED = re.compile(r"finished: \d+ local steps to global step (\d+)")
# The lines of a task's log that tell a soak's story (see Report.story).
_STORY = re.compile(
    r"preempt|exiting|input position|reads its new share|adopting|restoring|finished:|recover|lost|"
    r"Traceback|error",
    re.IGNORECASE,
)


@dataclasses.dataclass
class Fault:
    at: float  # time.time()
    task: str
    signal: str
    step_before: int = 0  # the chief's last logged global step before the fault
    lost: int = 0  # steps lost: step_before - the step training resumed from (0 if none)


@dataclasses.dataclass
class Report:
    faults: list[Fault]
    restarts: dict[str, int]
    codes: dict[str, int]
    went_back_without_restore: list[tuple[int, int]]  # (step, next logged step)
    final_step: int
    # What each task said about preemption, restores, input positions and its end, in time order:
    # a failed soak's story, since its logs are gone with CI's machine.
    story: list[str] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        lines = [
            f"{len(self.faults)} faults, {sum(self.restarts.values())} restarts, final global step "
            f"{self.final_step}; exit codes {sorted(set(self.codes.values()))}"
        ]
        for f in self.faults:
            lines.append(
                f"  {time.strftime('%H:%M:%S', time.localtime(f.at))} {f.signal} {f.task} "
                f"at global step ~{f.step_before}: {f.lost} steps lost"
            )
        back = self.went_back_without_restore
        lines.append(f"  global step monotone except at restores: {'yes' if not back else back}")
        if self.story:
            lines.append("  the tasks' story:")
            lines.extend(f"    {line}" for line in self.story)
        return "\n".join(lines)


def _seconds(clock: str, day_start: float) -> float:
    h, m, s = (int(x) for x in clock)
    return day_start + 3600 * h + 60 * m + s


def read_chief_log(path: str) -> list[tuple[float, str, int]]:
    """(time, kind, step) in order: kind 'step' for progress lines, 'resumed' for a restore or adoption."""
    lt = time.localtime()
    day_start = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, 0, 0, 0, 0, 0, -1))
    events, now = [], 0.0
    with open(path, errors="replace") as f:
        for line in f:
            clock = _TIME.match(line)
            if clock:
                now = _seconds(clock.groups(), day_start)
            parsed = parse_line(line)
            if parsed:
                events.append((now, "step", parsed["global_step"]))
                continue
            resumed = _RESUMED.search(line)
            if resumed:
                events.append((now, "resumed", int(resumed.group(1) or resumed.group(2))))
    return events


def account(faults: list[Fault], events) -> list[tuple[int, int]]:
    """Fill in each fault's step_before and lost from the chief's log; return unexplained steps back."""
    for i, fault in enumerate(faults):
        end = faults[i + 1].at if i + 1 < len(faults) else float("inf")
        before = [step for t, kind, step in events if kind == "step" and t <= fault.at]
        fault.step_before = max(before, default=0)
        resumed = [step for t, kind, step in events if kind == "resumed" and fault.at - 1 <= t < end]
        fault.lost = max([0, *(fault.step_before - step for step in resumed)])
    back, last, floor = [], None, None
    for _, kind, step in events:
        if kind == "resumed":
            floor = step
        elif last is not None and step < last and (floor is None or step < floor):
            back.append((last, step))
        if kind == "step":
            last = step
    return back


class ScriptCluster(LocalCluster):
    """A LocalCluster whose every task runs a user's script (its role from TF_CONFIG), not the zoo's."""

    def __init__(self, script: str, logdir: str, **kwargs):
        super().__init__([], logdir, **kwargs)
        self.script = script

    def argv(self, task) -> list[str]:
        return [sys.executable, self.script]


def soak(
    gin_files,
    logdir: str,
    gin_params=(),
    duration_secs: float = 150.0,
    every_secs: float = 25.0,
    seed: int = 0,
    signals=(signal.SIGKILL, signal.SIGTERM),
    timeout_secs: float = 900.0,
    last_step: int | None = None,
    script: str | None = None,
    **cluster_kwargs,
) -> Report:
    """The soak of a zoo run (`gin_files`), or of a user's `script` run as every task."""
    rng = random.Random(seed)
    if script is not None:
        cluster = ScriptCluster(script, logdir, max_restarts=1000, **cluster_kwargs)
    else:
        cluster = LocalCluster(
            gin_files, logdir, gin_params=list(gin_params), max_restarts=1000, **cluster_kwargs
        )
    faults: list[Fault] = []
    # The faults start with training (the chief's first progress line), not with the processes:
    # on a loaded machine start-up alone can outlast a short soak.
    start, due = [], []
    chief = LogFollower(cluster.chief_task.log_path)

    followers = [LogFollower(t.log_path) for t in cluster.tasks if t.job != "ps"]
    ending = []

    def tick():
        now = time.monotonic()
        if not start:
            if not any(parse_line(line) for line in chief.new_lines()):
                return
            start.append(now)
            due.append(now + rng.uniform(0.5, 1.5) * every_secs)
        if now < due[0] or now - start[0] > duration_secs or ending:
            return
        # Training is ending once a replica has finished its last step (it may not have exited yet):
        # a PS or replica restarted now would wait for replicas that are done.
        for follower in followers:
            finished = [m for line in follower.new_lines() if (m := _FINISHED.search(line))]
            if last_step is not None and any(int(m.group(1)) >= last_step for m in finished):
                ending.append(now)
        if ending or any(t.proc is not None and t.proc.poll() == 0 for t in cluster.tasks):
            return
        due[0] = now + rng.uniform(0.5, 1.5) * every_secs
        live = [t for t in cluster.tasks if t.proc is not None and t.proc.poll() is None]
        if not live:
            return
        task = rng.choice(live)
        signum = rng.choice(signals)
        os.kill(task.proc.pid, signum)
        faults.append(Fault(time.time(), task.name, signal.Signals(signum).name))

    cluster.start()
    try:
        codes = cluster.wait(timeout=timeout_secs, on_tick=tick)
    except TimeoutError:
        # A long soak's faults are worth their report even when training outlasted the timeout.
        print(f"chaos soak timed out after {timeout_secs:.0f} s:\n{_report(cluster, faults, logdir, {})}")
        raise
    finally:
        cluster.stop()
    return _report(cluster, faults, logdir, codes)


@dataclasses.dataclass
class IdsRead:
    """How often each id of a user-data soak was trained on: once, more (repeated), never (lost).

    `readers`: for each id read more than once, the files (one per reading process) that read it,
    so that a failure says whether a restarted process or the same one read again.
    """

    counts: collections.Counter
    total: int
    readers: dict[int, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def once(self) -> int:
        return sum(1 for n in self.counts.values() if n == 1)

    @property
    def repeated(self) -> int:
        """Extra reads: an id read 3 times counts 2."""
        return sum(n - 1 for n in self.counts.values() if n > 1)

    @property
    def lost(self) -> list[int]:
        return sorted(set(range(self.total)) - set(self.counts))

    def repeated_runs(self) -> list[tuple[int, int, list[str]]]:
        """Runs of consecutive repeated ids read by the same files: (first id, last id, files)."""
        runs: list[tuple[int, int, list[str]]] = []
        for i in sorted(self.readers):
            if runs and runs[-1][1] == i - 1 and runs[-1][2] == self.readers[i]:
                runs[-1] = (runs[-1][0], i, runs[-1][2])
            else:
                runs.append((i, i, self.readers[i]))
        return runs

    def __str__(self) -> str:
        more = sum(1 for n in self.counts.values() if n > 1)
        lines = [
            f"ids: {self.total}, read once {self.once}, repeated reads {self.repeated} "
            f"(ids read more than once: {more}), lost {len(self.lost)}"
        ]
        runs = self.repeated_runs()
        for first, last, files in runs[:10]:
            lines.append(f"  ids {first}-{last} read by {', '.join(files)}")
        if len(runs) > 10:
            lines.append(f"  ... {len(runs) - 10} more runs of repeated ids")
        return "\n".join(lines)


def ids_read(directory: str, total: int) -> IdsRead:
    """The ids the script recorded (one per line, in any number of files in `directory`)."""
    counts: collections.Counter = collections.Counter()
    readers: dict[int, list[str]] = collections.defaultdict(list)
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as f:
            ids = [int(x) for x in f.read().split()]
        counts.update(ids)
        for i in ids:
            readers[i].append(name)
    return IdsRead(counts, total, {i: files for i, files in readers.items() if len(files) > 1})


def _report(cluster: LocalCluster, faults: list[Fault], logdir: str, codes: dict) -> Report:
    events = read_chief_log(cluster.chief_task.log_path)
    back = account(faults, events)
    results = read_results(logdir)
    final = max((r["global_step"] for r in results.values()), default=0)
    return Report(faults, dict(cluster.restarts), codes, back, final, story(cluster))


def story(cluster: LocalCluster, limit: int = 80) -> list[str]:
    """Every task's lines that match _STORY, each after its task's name, in the order of their clocks.

    A line without a clock (an exit's one-line error) keeps the clock of the line before it.
    """
    told = []
    for task in cluster.tasks:
        try:
            with open(task.log_path, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        clock = "00:00:00"
        for n, line in enumerate(lines):
            if m := _TIME.match(line):
                clock = line[: m.end() - 1]
            if _STORY.search(line):
                told.append((clock, task.name, n, f"{task.name}: {line.strip()[:200]}"))
    told.sort()
    return [line for *_, line in told[-limit:]]
