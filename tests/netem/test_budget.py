"""CPU budgets per emulated host, with real cgroups and real processes (needs root).

Budgets are checked by what the kernel counts: a busy loop on a budget of 0.2 core
gets 0.2 core and is throttled; a process outside the budgets that takes a budget's
core is seen and the window refused; a task reads its own limit (base.machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from disttrain.bench import budget
from disttrain.launch import read_results

pytestmark = pytest.mark.netem

PREFIX = "dtt"  # not the benchmark's "dtbench", so a benchmark running alongside is untouched
BUSY = "import time\nt = time.time()\nwhile time.time() - t < {secs}: pass\n"


@pytest.fixture(autouse=True)
def _permitted():
    reason = budget.check_permitted()
    if reason is not None:
        pytest.skip(reason)


def _groups() -> list[str]:
    return [n for n in os.listdir("/sys/fs/cgroup/cpu") if n.startswith(PREFIX + "-")]


def test_a_busy_host_gets_its_budget_and_no_more_and_everything_is_removed_after():
    with budget.CpuBudgets(2, 0.2, prefix=PREFIX) as b:
        assert len(_groups()) == 4  # two hosts, a filler on each of the two cores
        start = budget.read(b)
        p = subprocess.Popen(b.wrap(0, [sys.executable, "-c", BUSY.format(secs=4)]))
        p.wait(timeout=30)
        got = budget.got(start, budget.read(b), b.cores, b.pinned)
    host0, host1 = got["hosts"]
    window = got["window_seconds"]
    assert host0["used_cores"] * window == pytest.approx(0.2 * 4, rel=0.15)  # 4 s at 0.2 core
    assert host0["throttled_share"] > 0.5  # a busy loop wants all of every period
    assert host1["used_cores"] < 0.01
    assert got["refused"] is None, got
    assert _groups() == []
    assert "while True" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_a_process_outside_the_budgets_on_a_budgets_core_gets_the_window_refused():
    with budget.CpuBudgets(1, 0.2, prefix=PREFIX) as b:
        (core,) = b.pinned[0]
        code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nprint('on', flush=True)\n" + BUSY.format(
            secs=6
        )
        hog = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert hog.stdout.readline().strip() == "on"
            start = budget.read(b)
            time.sleep(3)  # the hog keeps the core busy at the default weight: the filler gets nothing
            got = budget.got(start, budget.read(b), b.cores, b.pinned)
        finally:
            hog.kill()
            hog.wait(timeout=10)
    assert got["refused"] and f"core(s) [{core}] had no idle time left" in got["refused"], got


def test_a_task_in_a_budget_counts_its_limit_as_its_cores_and_its_groups_time_as_busy():
    probe = (
        "import json, time\nfrom disttrain.base import machine\nb0 = machine.busy_seconds()\n"
        + BUSY.format(secs=2)
        + "busy = machine.busy_seconds() - b0\n"
        + "print(json.dumps([machine.limit(), machine.cores(), busy, machine.describe()]))"
    )
    with budget.CpuBudgets(1, 0.3, prefix=PREFIX) as b:
        out = subprocess.run(
            b.wrap(0, [sys.executable, "-c", probe]), capture_output=True, text=True, timeout=60
        )
    limit, cores, busy, text = json.loads(out.stdout)
    assert limit == pytest.approx(0.3) and cores == pytest.approx(0.3)
    assert busy == pytest.approx(0.3 * 2, rel=0.2)  # its own group's time, not the machine's
    assert text == "its CPU limit of 0.3 core(s)"


def test_groups_left_by_a_killed_benchmark_are_removed_by_the_next():
    code = (
        "import os, sys, time\nsys.path.insert(0, os.getcwd())\nfrom disttrain.bench import budget\n"
        f"b = budget.CpuBudgets(1, 0.2, prefix={PREFIX!r}).__enter__()\n"
        "print('up', flush=True)\ntime.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"
    assert _groups()
    p.kill()
    p.wait(timeout=10)
    deadline = time.monotonic() + 10
    removed = budget.cleanup_stale(PREFIX)
    while _groups() and time.monotonic() < deadline:  # the filler may still be leaving
        removed += budget.cleanup_stale(PREFIX)
        time.sleep(0.2)
    assert removed and _groups() == []


def _needs_hosts():
    from disttrain.bench import netem

    reason = netem.check_permitted()
    if reason is not None:
        pytest.skip(reason)


def test_a_budgeted_benchmark_reports_each_hosts_budget_and_divides_by_a_host_alone_in_the_same_window(
    tmp_path,
):
    from tests.bench.test_benchmark import TINY_EMULATED, _explain, benchmark

    _needs_hosts()
    args = [*TINY_EMULATED, "--host_cores=0.4", "--warmup_steps=10", "--measure_steps=30"]
    done, report, _ = benchmark(args, tmp_path, timeout=600)
    assert done.returncode == 0, _explain(done)
    assert report["config"]["host_cores"] == 0.4
    ref = report["reference"]
    alone = ref["host_budget"]
    assert alone["hosts"][0]["of_budget"] <= 1 + budget.quota_slack(alone["window_seconds"])
    (run,) = report["runs"]
    hosts = run["host_budget"]["hosts"]
    assert len(hosts) == 4  # the worker's host, the PS's, and two processes alone beside them
    slack = budget.quota_slack(run["host_budget"]["window_seconds"])
    assert all(h["of_budget"] <= 1 + slack for h in hosts), hosts
    assert hosts[-1]["of_budget"] > 0.8  # the process alone computes all along
    # Each core's share of time in interrupts (the kernel's packet work) is reported beside the hosts.
    assert len(run["host_budget"]["core_interrupts"]) == os.cpu_count()
    assert all(0 <= x < 0.5 for x in run["host_budget"]["core_interrupts"])
    assert run["alongside_steps_per_sec"] > 0
    assert run["scaling_efficiency"] == pytest.approx(
        run["counted_steps_per_sec"] / run["alongside_steps_per_sec"]
    )
    assert run["ideal_steps_per_sec"] == pytest.approx(run["alongside_steps_per_sec"])
    # The worker, in its budget, counts the budget as its cores.
    (worker,) = [r for r in read_results(run["logdir"]).values() if r["task"].startswith("/job:worker")]
    assert worker["breakdown"]["cores_limited"] and worker["breakdown"]["machine_cores"] == pytest.approx(0.4)
    assert " alone " in done.stdout  # the table's column


def test_a_budget_that_does_not_fit_is_refused_before_anything_starts_naming_the_largest_that_does(tmp_path):
    from tests.bench.test_benchmark import TINY_EMULATED, benchmark

    _needs_hosts()
    done, report, _ = benchmark([*TINY_EMULATED, "--workers=4", "--host_cores=0.5"], tmp_path, timeout=120)
    assert done.returncode != 0 and report is None
    (line,) = [x for x in done.stderr.splitlines() if x.strip()]  # 4 workers, a PS, and two alongside
    assert line.endswith(
        "--host_cores=0.5: 7 host(s) at 0.5 core(s) each do not fit this machine's 2 core(s), each keeping "
        "10% for the kernel's packet work: use --host_cores=0.22 or less, or fewer hosts"
    ), line


def test_a_budget_check_runs_copies_together_and_alone_and_says_whether_they_agree(tmp_path):
    from tests.bench.test_benchmark import TINY, _explain, benchmark

    args = ["--gin_file=gin/bench/mlp.gin", f"--gin_file={TINY}", "--host_cores=0.4", "--budget_check=2"]
    done, report, _ = benchmark([*args, "--warmup_steps=10", "--measure_steps=30"], tmp_path, timeout=600)
    (check,) = report["checks"]
    assert done.returncode == (0 if check["fair"] else 1), _explain(done)
    assert check["copies"] == 2 and len(check["together"]["steps_per_sec"]) == 2
    assert [len(x["steps_per_sec"]) for x in check["alone"]] == [1, 1]  # before and after
    got = check["together"]["host_budget"]
    assert [h["cores"] for h in got["hosts"]] == [[0], [1]]  # a core each
    # Busy hosts got most of their 0.4 core, and the quota held (to the slack the refusal allows).
    slack = budget.quota_slack(got["window_seconds"])
    assert all(0.75 < h["of_budget"] <= 1 + slack for h in got["hosts"]), (got, slack)
    assert check["spread"] == pytest.approx(
        budget.spread([check["alone_steps_per_sec"], *check["together"]["steps_per_sec"]]), abs=1e-3
    )
    assert f"2 copies: together {check['together']['steps_per_sec'][0]:.2f}" in done.stdout


@pytest.mark.parametrize(
    "args, why",
    [
        (["--budget_check=2"], "--budget_check needs --host_cores (the budget to check)"),
        (["--budget_check=0", "--host_cores=0.2"], "--budget_check=0: need copy counts >= 1, e.g. 2,4,8"),
        (["--budget_check=12", "--host_cores=0.2"], "use --host_cores=0.15 or less, or fewer hosts"),
    ],
)
def test_a_budget_check_without_a_budget_or_copies_is_refused_in_one_line(tmp_path, args, why):
    from tests.bench.test_benchmark import TINY, benchmark

    done, report, _ = benchmark(["--gin_file=gin/bench/mlp.gin", f"--gin_file={TINY}", *args], tmp_path)
    assert done.returncode != 0 and report is None
    (line,) = [x for x in done.stderr.splitlines() if x.strip()]
    assert line.endswith(why), line
