"""Following one run's processes: log lines become samples, with CPU and link counters.

`watch` polls the replicas' logs every 50 ms until `bench.measure` says every
replica has its warm-up and measured intervals, and fails the run if a task
exits (with the reason its log gives), if the run times out, or if its lines
show it trained nothing (`bench.measure.trained_nothing`). Whenever the chief
logs a line it also reads the CPU time of every task, of this benchmark
process and of the whole machine (/proc), and the link byte counters
(emulated hosts), so that the measured window's counters are aligned with the
chief's global steps.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Callable

from disttrain.base import machine
from disttrain.bench import measure as measure_lib
from disttrain.edges import local

MACHINE, BENCHMARK = "machine", "benchmark"  # CPU counters next to each task's
FILLERS = "fillers"  # the CPU budgets' fillers (bench.budget), with --host_cores
_POLL_SECS = 0.05


class RunFailed(Exception):
    """One run did not reach steady state; the benchmark records it and goes on."""


@dataclasses.dataclass
class Proc:
    """A task's process and its log; `lines_path`, if given, is where its throughput lines are instead.

    (TF 2's ParameterServerStrategy runs every worker's steps from one
    coordinator, which writes each worker's lines to a file of its own.)
    """

    name: str
    proc: subprocess.Popen
    log_path: str
    lines_path: str | None = None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process, all threads (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def other_cores(m: measure_lib.Measurement) -> float | None:
    """Cores kept busy during the window by processes other than the run's (a noise gauge)."""
    used = m.cpu_seconds()
    if not used or MACHINE not in used or m.window_seconds <= 0:
        return None
    own = sum(v for k, v in used.items() if k != MACHINE)
    return max(0.0, used[MACHINE] - own) / m.window_seconds


def log_tail(path: str, lines: int = 6) -> str:
    """The last non-empty lines of a task's log."""
    try:
        with open(path, errors="replace") as f:
            kept = [x.rstrip() for x in f if x.strip()]
    except OSError:
        return ""
    return "\n".join(kept[-lines:])


ERROR_PREFIX = "disttrain: error: "  # launch.fail's one line on a task's stderr (in its log)


def exit_reason(tail: str) -> str:
    """Why a task ended, from the last lines of its log: its `disttrain: error:` line, else its last line.

    A disttrain task says why in one line on stderr; a TF 2 peer or a crash
    ends with `sys.exit`'s message or a traceback's last line. TensorFlow's
    C++ log lines, which can come after, are passed over. Empty if nothing is left.
    """
    lines = [x.strip() for x in tail.splitlines() if x.strip() and not local._TF_CPP_LOG.match(x)]
    for line in reversed(lines):
        if line.startswith(ERROR_PREFIX):
            return line[len(ERROR_PREFIX) :]
    return lines[-1] if lines else ""


def _counters(procs: list[Proc]) -> dict[str, float]:
    cpu = {p.name: cpu_seconds(p.proc.pid) for p in procs}
    t = os.times()  # this benchmark and the `ip` commands it ran (reaped children)
    cpu[BENCHMARK] = t.user + t.system + t.children_user + t.children_system
    cpu[MACHINE] = machine.busy_seconds()
    return cpu


def watch(
    procs: list[Proc],
    replicas: list[str],
    chief: str,
    every_n: int,
    examples_per_step: int,
    warmup: int,
    measure: int,
    timeout: float,
    link_bytes: Callable[[], tuple] | None = None,
    budget: Callable[[], object] | None = None,
    progress: Callable[[str], None] | None = None,
    progress_secs: float = 20.0,
) -> measure_lib.Measurement:
    """Samples of `replicas` until `warmup` + `measure` intervals each are in (see bench.measure).

    Raises RunFailed if any of `procs` exits first or `timeout` seconds pass.
    `link_bytes` and `budget` read the links' and the CPU budgets' counters at each chief line.
    `progress` gets a line every `progress_secs`.
    """
    by_name = {p.name: p for p in procs}
    followers = {r: local.LogFollower(by_name[r].lines_path or by_name[r].log_path) for r in replicas}
    samples: dict[str, list[measure_lib.Sample]] = {r: [] for r in replicas}
    start = last_progress = time.monotonic()
    with local.interrupt_between_ticks() as interrupted:  # Ctrl-C: see local.interrupt_between_ticks
        while not interrupted():
            for r, follower in followers.items():
                samples[r] += _new_samples(follower, procs, r == chief, link_bytes, budget)
            result = measure_lib.measure(samples, chief, every_n, examples_per_step, warmup, measure)
            if result is not None:
                why = measure_lib.trained_nothing(samples, result.t_start, every_n)
                if why is not None:
                    raise RunFailed(f"{why}\nlogs in {os.path.dirname(procs[0].log_path)}")
                return result
            exited = _exit_failure(procs)
            if exited is not None:
                raise RunFailed(exited)
            now = time.monotonic()
            if now - start > timeout:
                raise RunFailed(
                    f"no steady state after {timeout:.0f} s (raise --run_timeout or lower --measure_steps); "
                    f"logs in {os.path.dirname(procs[0].log_path)}"
                )
            if progress is not None and now - last_progress >= progress_secs:
                last_progress = now
                done = ", ".join(str(len(s) * every_n) for s in samples.values())
                progress(f"steps per replica {done} (need >= {(warmup + measure) * every_n})")
            time.sleep(_POLL_SECS)
        raise KeyboardInterrupt


def _new_samples(
    follower: local.LogFollower,
    procs: list[Proc],
    counters: bool,
    link_bytes: Callable[[], tuple] | None,
    budget: Callable[[], object] | None,
) -> list[measure_lib.Sample]:
    """Samples of a replica's new throughput lines; with `counters` (the chief), CPU and link counters too."""
    found = []
    for line in follower.new_lines():
        parsed = measure_lib.parse_line(line)
        if parsed is None:
            continue
        del parsed["task"]
        if counters:
            parsed["cpu_seconds"] = _counters(procs)
            if link_bytes is not None:
                parsed["link_bytes"] = link_bytes()
            if budget is not None:
                parsed["budget"] = reading = budget()
                parsed["cpu_seconds"][FILLERS] = reading.filler_total  # the benchmark's own, not others'
        found.append(measure_lib.Sample(t=time.monotonic(), **parsed))
    return found


def _exit_failure(procs: list[Proc]) -> str | None:
    """Why the run failed if one of `procs` has exited: its name, exit code, reason and the end of its log."""
    for p in procs:
        code = p.proc.poll()
        if code is not None:
            tail = log_tail(p.log_path, 40)
            why = exit_reason(tail)
            return (
                f"{p.name} exited with code {code} before the measurement ended: {why}\n"
                f"log {p.log_path}:\n" + "\n".join(tail.splitlines()[-6:])
            )
    return None


def wait_until_quiet(
    max_cores: float, timeout: float, log: Callable[[str], None], sample_secs: float = 5.0
) -> float:
    """Wait until the machine's other processes use < `max_cores` cores over `sample_secs`.

    For shared machines: called between runs, when none of the benchmark's tasks is
    running, so all busy CPU but this process's is someone else's. Gives up after
    `timeout` seconds (the run then goes ahead, and its `others` column says how noisy
    it was). Returns the last reading.
    """
    deadline = time.monotonic() + timeout
    told = False
    while True:
        t = os.times()
        own0, busy0 = t.user + t.system, machine.busy_seconds()
        time.sleep(sample_secs)
        t = os.times()
        others = max(0.0, machine.busy_seconds() - busy0 - (t.user + t.system - own0)) / sample_secs
        if others < max_cores or time.monotonic() > deadline:
            if told:
                log(f"  other processes use {others:.1f} cores: going ahead")
            return others
        if not told:
            log(f"  waiting for a quiet machine: others use {others:.1f} cores (< {max_cores} wanted)")
            told = True


stop = local.stop_processes  # one implementation for the benchmark and LocalCluster
