"""The cores this process may use and how busy they are: its cgroup's CPU limit where it has one, else
the cores it may run on, as Linux's /proc/stat counts them (every process on them).

A task in a container or an emulated host with a CPU quota (cgroup v1 `cpu.cfs_quota_us`, v2
`cpu.max`) may use that many cores' worth of time, however many the machine has; how busy "its
cores" were is then its group's own CPU time over the quota.
"""

from __future__ import annotations

import os


def cgroup_mounts() -> dict[str, str]:
    """Mount point of each cgroup v1 controller ('cpu', 'cpuacct', 'cpuset', ...), and 'v2' for the
    unified hierarchy; {} where /proc/mounts cannot be read."""
    found: dict[str, str] = {}
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 4:
                    continue
                if parts[2] == "cgroup":
                    for option in parts[3].split(","):
                        found.setdefault(option, parts[1])
                elif parts[2] == "cgroup2":
                    found.setdefault("v2", parts[1])
    except OSError:
        pass
    return found


def _own_groups() -> dict[str, str]:
    """This process's group directory per controller ('cpu', 'cpuacct'; 'v2'), where mounted."""
    mounts, found = cgroup_mounts(), {}
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else ["v2"]:
            if c in ("cpu", "cpuacct", "v2") and c in mounts:
                found[c] = os.path.join(mounts[c], path.lstrip("/"))
    return found


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _limited_group() -> tuple[float, str, str] | None:
    """(cores, the group holding the tightest quota, 'v1' or 'v2') on the way up from this process's
    group; None without a quota."""
    groups = _own_groups()
    best = None
    for kind, key in (("v1", "cpu"), ("v2", "v2")):
        d = groups.get(key)
        while d and os.path.isdir(d):
            if kind == "v1":
                quota, period = (
                    _read(os.path.join(d, "cpu.cfs_quota_us")),
                    _read(os.path.join(d, "cpu.cfs_period_us")),
                )
                values = (quota, period) if quota and period else None
            else:
                text = _read(os.path.join(d, "cpu.max"))
                values = tuple(text.split()) if text else None
            if values and values[0].strip() not in ("-1", "max") and int(values[1]) > 0:
                cores = int(values[0]) / int(values[1])
                if best is None or cores < best[0]:
                    best = (cores, d, kind)
            parent = os.path.dirname(d)
            if parent == d or not os.path.exists(os.path.join(parent, "cgroup.procs")):
                break
            d = parent
        if best is not None:
            return best
    return None


def limit() -> float | None:
    """The cores' worth of CPU time this process's cgroup may use (its quota), or None without one."""
    found = _limited_group()
    return found[0] if found else None


def cores() -> float:
    """The cores `busy_seconds` counts: the cgroup's quota where there is one, else the cores this
    process may run on."""
    return limit() or float(len(os.sched_getaffinity(0)))


def describe(n: float | None = None) -> str:
    """'this machine's 2 cores', or 'its CPU limit of 0.45 core(s)' in a cgroup with a quota."""
    n = cores() if n is None else n
    return f"its CPU limit of {n:g} core(s)" if limit() is not None else f"this machine's {n:g} cores"


def busy_seconds() -> float:
    """CPU seconds the cores `cores` counts have been busy: the limited cgroup's own CPU time (every
    process in it), else the busy time of the cores this process may run on (any process); 0 where
    unknown."""
    found = _limited_group()
    if found is not None:
        _, d, kind = found
        if kind == "v2":
            stat = _read(os.path.join(d, "cpu.stat")) or ""
            usage = dict(line.split() for line in stat.splitlines() if line.strip())
            return int(usage.get("usage_usec", 0)) / 1e6
        mounts = cgroup_mounts()
        if "cpuacct" in mounts:  # the same relative path in cpuacct's hierarchy (the same one if co-mounted)
            text = _read(os.path.join(mounts["cpuacct"], os.path.relpath(d, mounts["cpu"]), "cpuacct.usage"))
            if text:
                return int(text) / 1e9
    mine = os.sched_getaffinity(0)
    busy = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name = line.split(" ", 1)[0]
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in mine:
                    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, line.split()[1:9])
                    busy += user + nice + system + irq + softirq + steal
    except (OSError, ValueError):
        return 0.0
    return busy / os.sysconf("SC_CLK_TCK")
