"""A CPU budget per emulated host: a cgroup per host, pinned to its own cores, capped by a quota.

Emulated hosts (bench.netem) share this machine's cores; without a budget four
tasks contend for two cores as separate hosts never do. `CpuBudgets` gives host i
a group of its own in the `cpu`, `cpuacct` and `cpuset` controllers (cgroup v1),
or one group with `cpu` and `cpuset` (cgroup v2, `cpu.max`), holding every process
started through `wrap(i, argv)`:

    cpuset   host i's cores: with a budget of at most one core, core i % N; with
             more, ceil(budget) cores of its own. Pinning is what makes the budget
             fair (FACTS.md, 2026-12-01: quotas alone put 8 x 0.22 core copies 1.4x
             apart, pinned they were within 7%); it also makes TensorFlow count the
             host's cores, not the machine's.
    quota    budget x period of CPU time per period (PERIOD_US, 20 ms: long periods
             let a host run a whole burst and then sit throttled mid-step).
    shares   SHARES: under contention a host is served before the machine's other
             processes (the benchmark itself, the tests), up to its quota.

Each core keeps HEADROOM of its time outside every budget, for the kernel's packet
work (the veth and bridge path runs in softirq; without IRQ time accounting it is
charged to whichever host's task it interrupts, and `got()` reports each core's
share of it) and the benchmark's own process. `usage()` reads each host's CPU
seconds and throttled periods; `got()` turns two readings and the machine's
per-core counters into what each host got, and the reason a run is refused when a
host may not have got its budget (a core with no idle time left).

Needs root and the controllers mounted. Groups are named `<prefix>-<pid>-<k>-<i>`
like netem's namespaces, so `cleanup_stale(prefix)` removes what a killed run left.
This module must not import TensorFlow (it and disttrain.base are stdlib only).
"""

from __future__ import annotations

import errno
import itertools
import math
import os
import re
import signal
import subprocess
import sys
import time
from typing import NamedTuple

from disttrain.base import machine

PERIOD_US = 20_000
SHARES = 8192  # cgroup v1 cpu.shares; v2 cpu.weight gets the same ratio to its default (100)
HEADROOM = 0.1  # of each core, left outside every budget
JUDGE_SECS = 2.0  # a shorter window is reported, not judged
IDLE_AT_LEAST = 0.02  # a core with less idle time than this may have kept a host from its budget
_V1 = ("cpu", "cpuacct", "cpuset")
_ROOT = "/sys/fs/cgroup"
_serial = itertools.count()


class BudgetError(RuntimeError):
    """A budget cannot be set or kept; the message says what and how to fix it."""


class HostCpu(NamedTuple):
    """One host's counters since its group was made (cumulative)."""

    cpu_secs: float
    periods: int
    throttled: int


def _v2_controllers(path: str) -> set[str]:
    try:
        with open(os.path.join(path, "cgroup.controllers")) as f:
            return set(f.read().split())
    except OSError:
        return set()


def _mode() -> tuple[str, dict[str, str]] | None:
    """('v1', {controller: mount}) or ('v2', {'v2': mount}), whichever gives cpu and cpuset; else None."""
    m = machine.cgroup_mounts()
    if all(c in m for c in _V1):
        return "v1", {c: m[c] for c in _V1}
    if "v2" in m and {"cpu", "cpuset"} <= _v2_controllers(m["v2"]):
        return "v2", {"v2": m["v2"]}
    return None


def check_permitted() -> str | None:
    """None if CPU budgets can be made here, else why not and what to do."""
    mode = _mode()
    if mode is None:
        return (
            "no cgroup with the cpu and cpuset controllers (v1: cpu, cpuacct and cpuset mounted; v2: "
            "both in cgroup.controllers of its root); see /proc/mounts"
        )
    for path in mode[1].values():
        if not os.access(path, os.W_OK):
            return f"cannot create cgroups under {path}: run as root"
    return None


def cores_on_each(num_hosts: int, cores: float, ncpus: int) -> list[tuple[int, ...]]:
    """The cores host i is pinned to: one core (i % ncpus) up to a budget of 1, else ceil(cores) of its own.

    BudgetError when a core would carry more budget than 1 - HEADROOM of its time,
    naming the largest budget that fits.
    """
    if not cores > 0:
        raise BudgetError(f"--host_cores must be > 0, got {cores}")
    per_host = max(1, math.ceil(cores - 1e-9))
    pinned = [tuple((i * per_host + j) % ncpus for j in range(per_host)) for i in range(num_hosts)]
    load = [0.0] * ncpus
    for cpus in pinned:
        for c in cpus:
            load[c] += cores / len(cpus)
    if per_host > ncpus or max(load) > 1 - HEADROOM + 1e-9:
        fits = largest_budget(num_hosts, ncpus)
        raise BudgetError(
            f"{num_hosts} host(s) at {cores:g} core(s) each do not fit this machine's {ncpus} core(s), "
            f"each keeping {HEADROOM:.0%} for the kernel's packet work: use --host_cores={fits:g} or less, "
            "or fewer hosts"
        )
    return pinned


def largest_budget(num_hosts: int, ncpus: int) -> float:
    """The largest budget per host that cores_on_each accepts, to 0.01 core."""
    if num_hosts <= ncpus:
        whole = ncpus // num_hosts  # each host ceil(b) cores of its own
        return math.floor(whole * (1 - HEADROOM) * 100) / 100
    return math.floor((1 - HEADROOM) / math.ceil(num_hosts / ncpus) * 100) / 100


def threads(cores: float) -> int:
    """TensorFlow's intra-op pool for a host of this budget: one thread per core it may use."""
    return max(1, math.ceil(cores - 1e-9))


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as exc:
        fix = "run as root" if exc.errno in (errno.EACCES, errno.EPERM) else "the kernel refused this value"
        raise BudgetError(f"writing {value!r} to {path} failed: {exc.strerror}; {fix}") from None


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _stat(path: str) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in _read(path).splitlines() if line.strip())}


def _kill_and_remove(group: str) -> None:
    """Kill what is left in a group's cgroup.procs, then remove the group; quiet if it is gone."""
    for _ in range(50):
        try:
            pids = [int(p) for p in _read(os.path.join(group, "cgroup.procs")).split()]
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(group)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)  # the killed processes are still leaving
    raise BudgetError(f"cannot remove {group}: processes in it did not die; kill them and rmdir it")


def cleanup_stale(prefix: str = "dt") -> list[str]:
    """Remove groups `<prefix>-<pid>-*` whose creating process is dead (a run killed with SIGKILL)."""
    mode = _mode()
    removed = []
    if mode is None:
        return removed
    pattern = re.compile(rf"{re.escape(prefix)}-(\d+)-\d+-f?\d+")
    for root in dict.fromkeys(mode[1].values()):
        for name in sorted(os.listdir(root)):
            m = pattern.fullmatch(name)
            if m and not os.path.exists(f"/proc/{m.group(1)}"):
                _kill_and_remove(os.path.join(root, name))
                removed.append(os.path.join(root, name))
    return removed


# A filler: keeps one core busy with what no one else wants (SCHED_IDLE yields to any other task).
_FILLER = "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True:\n    pass\n"


class CpuBudgets:
    """A CPU budget of `cores` for each of num_hosts hosts; a context manager.

    Processes started with argv from `wrap(i, argv)` (and their children) run in
    host i's group. Each core the hosts use also runs a filler at SCHED_IDLE in a
    group of its own, so that the core never idles: on a VM an idle core halts, and
    a host throttled mid-period then waits for the hypervisor to wake it (measured
    here: one copy of CIFAR-10 at 0.45 core ran 3.56 steps/s on an idle core, 4.16
    beside a filler, 3.8-3.9 beside three more copies). The fillers' time counts as
    idle (`got`). Removed on close() or leaving the with-block; processes still in a
    group then are killed.
    """

    def __init__(self, num_hosts: int, cores: float, prefix: str = "dt", period_us: int = PERIOD_US):
        self.ncpus = len(os.sched_getaffinity(0))
        self.pinned = cores_on_each(num_hosts, cores, self.ncpus)
        self.num_hosts, self.cores, self.period_us = num_hosts, cores, period_us
        self.used_cpus = sorted({c for p in self.pinned for c in p})
        self._stem = f"{prefix}-{os.getpid()}-{next(_serial)}"
        self.prefix = prefix
        self._groups: list[list[str]] = []  # per host: its directory in each hierarchy
        self._fillers: dict[int, list[str]] = {}  # per core: the filler's group directories

    def __enter__(self) -> CpuBudgets:
        reason = check_permitted()
        if reason is not None:
            raise BudgetError(f"CPU budgets unavailable: {reason}")
        cleanup_stale(self.prefix)
        self._v1 = _mode()[0] == "v1"  # read once: usage() runs at every chief line
        try:
            for i in range(self.num_hosts):
                self._groups.append(self._make(f"{i}", self.pinned[i], quota=True))
            for c in self.used_cpus:
                self._fillers[c] = self._make(f"f{c}", (c,), quota=False)
                argv = self._enter(self._fillers[c], [sys.executable, "-c", _FILLER])
                subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
                )
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _make(self, suffix: str, cpus: tuple[int, ...], quota: bool) -> list[str]:
        """A group on `cpus`: a host's (its quota and SHARES) or a filler's (no quota); its directories."""
        mode, roots = _mode()
        dirs = {key: os.path.join(root, f"{self._stem}-{suffix}") for key, root in roots.items()}
        made = list(dict.fromkeys(dirs.values()))  # co-mounted controllers: one directory
        for d in made:
            os.makedirs(d, exist_ok=True)
        us = max(1000, round(self.cores * self.period_us))
        cpu_list = ",".join(map(str, cpus))
        cpu = dirs["cpu" if mode == "v1" else "v2"]
        if mode == "v1":
            mems = _read(os.path.join(roots["cpuset"], "cpuset.mems")).strip()
            _write(os.path.join(dirs["cpuset"], "cpuset.mems"), mems)
            _write(os.path.join(dirs["cpuset"], "cpuset.cpus"), cpu_list)
            if quota:
                _write(os.path.join(cpu, "cpu.cfs_period_us"), str(self.period_us))
                _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(us))
            _write(os.path.join(cpu, "cpu.shares"), str(SHARES if quota else 2))
        else:
            _write(os.path.join(roots["v2"], "cgroup.subtree_control"), "+cpu +cpuset")
            _write(os.path.join(cpu, "cpuset.cpus"), cpu_list)
            if quota:
                _write(os.path.join(cpu, "cpu.max"), f"{us} {self.period_us}")
            _write(os.path.join(cpu, "cpu.weight"), str(min(10000, SHARES * 100 // 1024) if quota else 1))
        if not quota and os.path.exists(os.path.join(cpu, "cpu.idle")):
            # A filler's group competes as one entity beside the others: SCHED_IDLE inside it is not
            # enough; the group itself is idle (Linux 5.15+), else of the least weight.
            _write(os.path.join(cpu, "cpu.idle"), "1")
        return made

    @staticmethod
    def _enter(dirs: list[str], argv: list[str]) -> list[str]:
        enter = "; ".join(f'echo $$ > "{d}/cgroup.procs"' for d in dirs)
        return ["/bin/sh", "-c", f'{enter} && exec "$@"', "sh", *argv]

    def wrap(self, i: int, argv: list[str]) -> list[str]:
        """argv run inside host i's group: a shell enters it, then execs argv (same pid)."""
        return self._enter(self._groups[i], argv)

    def _cpu(self, dirs: list[str]) -> tuple[float, dict[str, int]]:
        """A group's CPU seconds and its cpu.stat."""
        if self._v1:
            cpuacct = next(d for d in dirs if os.path.exists(os.path.join(d, "cpuacct.usage")))
            cpu = next(d for d in dirs if os.path.exists(os.path.join(d, "cpu.stat")))
            return int(_read(os.path.join(cpuacct, "cpuacct.usage"))) / 1e9, _stat(
                os.path.join(cpu, "cpu.stat")
            )
        st = _stat(os.path.join(dirs[0], "cpu.stat"))
        return st["usage_usec"] / 1e6, st

    def usage(self) -> list[HostCpu]:
        """Each host's CPU seconds, CFS periods and throttled periods since it was made."""
        out = []
        for dirs in self._groups:
            secs, st = self._cpu(dirs)
            out.append(HostCpu(secs, st["nr_periods"], st["nr_throttled"]))
        return out

    def filler_seconds(self) -> dict[int, float]:
        """CPU seconds each core's filler has had since it started: that core's time no one else wanted."""
        return {c: self._cpu(dirs)[0] for c, dirs in self._fillers.items()}

    def close(self) -> None:
        """Kill what is left in the groups (the fillers too) and remove them; idempotent."""
        groups, self._groups = self._groups + list(self._fillers.values()), []
        self._fillers = {}
        for dirs in groups:
            for d in dirs:
                _kill_and_remove(d)

    def describe(self) -> str:
        return (
            f"{self.num_hosts} host(s) x {self.cores:g} core(s), {self.period_us / 1000:g} ms period, "
            f"pinned to cores {[list(p) for p in self.pinned]}"
        )


def core_busy() -> tuple[tuple[int, int, int], ...]:
    """(busy, total, interrupts) jiffies of each core since boot, from /proc/stat's cpuN lines.

    Interrupts are the ticks that found the core in hard or soft interrupt context: the kernel's packet
    work (veth, the bridge, tbf). Without IRQ time accounting (this VM's kernel) a cgroup is charged
    for that time too, whichever host's task it interrupted; this says how much there was.
    """
    out = []
    with open("/proc/stat") as f:
        for line in f:
            if re.match(r"cpu\d+ ", line):
                v = list(map(int, line.split()[1:9]))
                idle = v[3] + v[4]
                out.append((sum(v) - idle, sum(v), v[5] + v[6]))
    return tuple(out)


class Reading(NamedTuple):
    """The budgets' counters at one moment: each host's, each core's busy and total jiffies, the fillers'."""

    t: float
    hosts: tuple[HostCpu, ...]
    cores: tuple[tuple[int, int, int], ...]  # core_busy()
    fillers: dict[int, float]  # CPU seconds per core

    @property
    def filler_total(self) -> float:
        return sum(self.fillers.values())


def read(budgets: CpuBudgets) -> Reading:
    return Reading(time.monotonic(), tuple(budgets.usage()), core_busy(), budgets.filler_seconds())


def got(start: Reading, end: Reading, cores: float, pinned: list[tuple[int, ...]]) -> dict:
    """What each host got between two readings, and why the window is refused (None: every host could
    get its budget).

    Refused when a core the hosts are pinned to had less than IDLE_AT_LEAST of its
    time idle: the scheduler gives a runnable host its time whenever its core is
    idle, so only a full core can have kept a host from its budget; and when a host
    used more than its quota (the quota did not hold).
    """
    secs = end.t - start.t
    hosts = []
    for i, (h0, h1) in enumerate(zip(start.hosts, end.hosts, strict=True)):
        periods = h1.periods - h0.periods
        used = (h1.cpu_secs - h0.cpu_secs) / secs if secs > 0 else 0.0
        hosts.append(
            {
                "host": i,
                "cores": list(pinned[i]),
                "used_cores": round(used, 4),
                "of_budget": round(used / cores, 3),
                "throttled_share": round((h1.throttled - h0.throttled) / periods, 3) if periods else 0.0,
            }
        )
    idle, interrupts = [], []  # the fillers' time counts as idle: they take only what no one else wants
    tick = os.sysconf("SC_CLK_TCK")
    for c, ((busy0, all0, irq0), (busy1, all1, irq1)) in enumerate(zip(start.cores, end.cores, strict=True)):
        total = all1 - all0
        filled = (end.fillers.get(c, 0.0) - start.fillers.get(c, 0.0)) * tick
        idle.append(round(min(1.0, 1 - (busy1 - busy0 - filled) / total), 3) if total else 1.0)
        interrupts.append(round((irq1 - irq0) / total, 3) if total else 0.0)
    full = [c for c in sorted({c for p in pinned for c in p}) if idle[c] < IDLE_AT_LEAST]
    over = [h["host"] for h in hosts if h["of_budget"] > 1 + quota_slack(secs)]
    reason = None
    if secs < JUDGE_SECS:  # /proc/stat counts in ticks of 10 ms: too few to judge a core's idle time
        full, over = [], []
    if full:
        on = [h["host"] for h in hosts if set(h["cores"]) & set(full)]
        reason = (
            f"core(s) {full} had no idle time left ({', '.join(f'{idle[c]:.0%}' for c in full)} idle), so "
            f"host(s) {on} may not have got their {cores:g} core(s): something outside the budgets (another "
            "process, the kernel's packet work) took their time; run on a quiet machine or lower --host_cores"
        )
    elif over:
        reason = f"host(s) {over} used more than their {cores:g} core(s): the quota did not hold"
    judged = secs >= JUDGE_SECS
    return {
        "window_seconds": round(secs, 2),
        "hosts": hosts,
        "core_idle": idle,
        "core_interrupts": interrupts,
        "judged": judged,
        "refused": reason,
    }


def quota_slack(secs: float) -> float:
    """How far over its budget a host may read in a window of `secs` while its quota held.

    The quota holds per period, so a window sees up to two periods' quota more at its edges,
    and the kernel charges time in ticks a little after it is used.
    """
    return 0.05 + 2 * PERIOD_US / 1e6 / secs if secs > 0 else float("inf")


FAIR = 0.05  # copies on budgets of their own: every rate within this of every other


def spread(rates: list[float]) -> float:
    """The fastest over the slowest, less one (0.05: the fastest is 5% faster)."""
    return max(rates) / min(rates) - 1 if rates and min(rates) > 0 else float("inf")


def fairness(k: int, alone: list[dict], together: dict) -> dict:
    """One check: K copies together and one copy alone before and after (each {"steps_per_sec": [...],
    "host_budget": ...} or {"error": ...}); fair when every copy together is within FAIR of every other
    and of the mean of the two alone."""
    check = {"copies": k, "alone": alone, "together": together}
    if any("error" in x for x in [*alone, together]):
        return dict(check, alone_steps_per_sec=None, spread=None, within=None, fair=False)
    mean = sum(x["steps_per_sec"][0] for x in alone) / len(alone)
    s = spread([mean, *together["steps_per_sec"]])
    within = spread(together["steps_per_sec"])  # the copies in one window: no drift between them
    return dict(
        check, alone_steps_per_sec=round(mean, 4), spread=round(s, 4), within=round(within, 4), fair=s <= FAIR
    )


def describe(check: dict) -> str:
    """A check's line: the rates together and alone, the spread, and the verdict."""
    if check["spread"] is None:
        why = next(x["error"] for x in [*check["alone"], check["together"]] if "error" in x)
        return f"FAILED: {why}"
    rates = ", ".join(f"{r:.2f}" for r in check["together"]["steps_per_sec"])
    used = ", ".join(f"{h['used_cores']:.2f}" for h in check["together"]["host_budget"]["hosts"])
    alone = " and ".join(f"{x['steps_per_sec'][0]:.2f}" for x in check["alone"])
    return (
        f"together {rates} steps/s (cores used {used}); alone before and after {alone}: "
        f"spread {check['spread']:.1%} ({check['within']:.1%} among the copies together), "
        f"{'fair' if check['fair'] else 'NOT FAIR'} (at most {FAIR:.0%})"
    )
