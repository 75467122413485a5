"""CPU budgets per emulated host: where hosts are pinned, what fits, and how a window is read (no cgroups).

The cgroups themselves, with real processes, are tested in tests/netem/test_budget.py.
"""

from __future__ import annotations

import pytest

from disttrain.bench import budget
from disttrain.bench.budget import HostCpu, Reading


@pytest.mark.parametrize(
    "hosts, cores, ncpus, pinned",
    [
        (1, 0.9, 2, [(0,)]),
        (3, 0.3, 2, [(0,), (1,), (0,)]),
        (8, 0.22, 2, [(0,), (1,)] * 4),
        (1, 1.8, 2, [(0, 1)]),  # more than a core: cores of its own
        (2, 1.5, 4, [(0, 1), (2, 3)]),
    ],
)
def test_hosts_are_pinned_round_robin_one_core_each_or_cores_of_their_own(hosts, cores, ncpus, pinned):
    assert budget.cores_on_each(hosts, cores, ncpus) == pinned


@pytest.mark.parametrize("hosts, ncpus", [(1, 2), (2, 2), (3, 2), (8, 2), (9, 2), (10, 2), (5, 4)])
def test_the_largest_budget_fits_and_a_hundredth_more_does_not(hosts, ncpus):
    fits = budget.largest_budget(hosts, ncpus)
    budget.cores_on_each(hosts, fits, ncpus)
    with pytest.raises(budget.BudgetError, match=f"use --host_cores={fits:g} or less"):
        budget.cores_on_each(hosts, fits + 0.01, ncpus)


def test_nine_hosts_on_two_cores_leave_each_core_its_headroom():
    # 5 hosts on core 0: 5 x 0.18 = 0.9 of it, 10% left for the kernel's packet work.
    assert budget.largest_budget(9, 2) == 0.18


@pytest.mark.parametrize("cores", [0, -0.5, float("nan")])
def test_a_budget_of_nothing_is_refused_in_one_line(cores):
    with pytest.raises(budget.BudgetError, match="must be > 0"):
        budget.cores_on_each(2, cores, 2)


@pytest.mark.parametrize("cores, threads", [(0.1, 1), (0.9, 1), (1.0, 1), (1.01, 2), (1.8, 2), (3.0, 3)])
def test_tensorflow_gets_a_thread_per_core_the_budget_may_use(cores, threads):
    assert budget.threads(cores) == threads


def _reading(t, hosts, cores, fillers=None):
    """cores: (busy, total) jiffies, or (busy, total, in interrupts)."""
    cores = tuple((*c, 0)[:3] for c in cores)
    return Reading(t, tuple(HostCpu(*h) for h in hosts), cores, fillers or {})


def test_a_window_reports_each_hosts_cpu_against_its_budget_and_its_throttled_periods():
    tick = budget.os.sysconf("SC_CLK_TCK")
    start = _reading(0.0, [(0.0, 0, 0), (0.0, 0, 0)], [(0, 0), (0, 0)])
    # 10 s: host 0 used 4.5 s (0.45 core) throttled in 400 of 500 periods; host 1 idled. Each core
    # was busy 60% of the time, the filler took 30% of core 0's; core 1 spent 5% in interrupts.
    end = _reading(
        10.0,
        [(4.5, 500, 400), (1.0, 500, 0)],
        [(6 * tick, 10 * tick), (6 * tick, 10 * tick, tick // 2)],
        {0: 3.0},
    )
    got = budget.got(start, end, 0.45, [(0,), (1,)])
    assert got["hosts"][0] == {
        "host": 0,
        "cores": [0],
        "used_cores": 0.45,
        "of_budget": 1.0,
        "throttled_share": 0.8,
    }
    assert got["hosts"][1]["of_budget"] == pytest.approx(0.222, abs=1e-3)
    assert got["core_idle"] == [0.7, 0.4]  # the filler's time is idle time
    assert got["core_interrupts"] == [0.0, 0.05]
    assert got["refused"] is None


def test_a_window_whose_core_had_no_idle_time_is_refused_naming_the_core_and_its_hosts():
    tick = budget.os.sysconf("SC_CLK_TCK")
    start = _reading(0.0, [(0.0, 0, 0)] * 3, [(0, 0), (0, 0)])
    end = _reading(10.0, [(3.0, 500, 0)] * 3, [(10 * tick, 10 * tick), (5 * tick, 10 * tick)])
    got = budget.got(start, end, 0.45, [(0,), (1,), (0,)])
    assert "core(s) [0] had no idle time left" in got["refused"]
    assert "host(s) [0, 2]" in got["refused"]


def test_a_host_over_its_quota_is_refused():
    tick = budget.os.sysconf("SC_CLK_TCK")
    start = _reading(0.0, [(0.0, 0, 0)], [(0, 0)])
    end = _reading(10.0, [(6.0, 500, 0)], [(6 * tick, 10 * tick)])
    assert "used more than their 0.45 core(s)" in budget.got(start, end, 0.45, [(0,)])["refused"]


def test_fair_means_every_copy_within_five_percent_of_every_other_and_of_the_mean_alone():
    alone = [{"steps_per_sec": [4.0]}, {"steps_per_sec": [4.2]}]
    fair = budget.fairness(2, alone, {"steps_per_sec": [4.0, 4.19], "host_budget": None})
    assert fair["alone_steps_per_sec"] == 4.1 and fair["fair"]
    assert fair["within"] == pytest.approx(4.19 / 4.0 - 1, abs=1e-4)
    unfair = budget.fairness(2, alone, {"steps_per_sec": [3.8, 4.2], "host_budget": None})
    assert unfair["spread"] == pytest.approx(4.2 / 3.8 - 1, abs=1e-4) and not unfair["fair"]
    failed = budget.fairness(2, [{"error": "it died"}, alone[1]], {"steps_per_sec": [4.0, 4.0]})
    assert failed["spread"] is None and not failed["fair"]
    assert budget.describe(failed) == "FAILED: it died"
