"""This machine's cores and how busy they are, as Linux's /proc/stat counts them (every process)."""

from __future__ import annotations

import os


def busy_seconds() -> float:
    """CPU seconds all cores of this machine have been busy since boot (any process); 0 where unknown."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    except (OSError, ValueError):
        return 0.0
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def cores() -> int:
    """The cores `busy_seconds` counts: every core of the machine, whatever this process may use."""
    return os.cpu_count() or 1
