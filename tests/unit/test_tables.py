"""bin/tables.py: the pages' generated tables from the report files (disttrain/bench/tables.py).

A fixture repository with one benchmark report shaped as `bin/benchmark.py --out` writes it: the
headline renders its row (a failed run never counts), the cases without a report read "not
measured", and `--check` names a stale block and an unknown table. Then the repository itself:
every block of README.md and docs/ is what its reports give.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from disttrain.bench import tables
from tests import REPO


def bench_run(system: str, scaling: float, bound: float, **more) -> dict:
    """A run row as the benchmark's report holds one (the fields the tables read, and a few more)."""
    row = {
        "system": system,
        "strategy": "async_ps",
        "synchronous": False,
        "layout": "dedicated",
        "workers": 1,
        "ps": 1,
        "error": None,
        "counted_steps_per_sec": 10 * scaling,
        "scaling_efficiency": scaling,
        "efficiency_vs_bound": bound,
        "diverged": False,
    }
    row.update(more)
    return row


def bench_report(runs: list[dict], started_utc: str = "2026-12-02T09:30:00Z") -> dict:
    return {
        "config": {
            "gin_files": ["gin/bench/cifar10_b32.gin"],
            "model": "Cifar10",
            "batch_size": 32,
            "network": "emulated",
            "link_mbit": 1000.0,
            "started": started_utc[:10] + " 09:30:00",
            "started_utc": started_utc,
        },
        "reference": {"steps_per_sec": 10.0, "examples_per_sec": 320.0},
        "runs": runs,
    }


PAGE = """# Results

Before.

<!-- table: headline -->
<!-- /table -->

```
<!-- table: not_a_block_inside_code -->
```

After.
"""


@pytest.fixture
def repo(tmp_path):
    """A repository with README.md holding the headline block, and the CIFAR-10 case's report."""
    os.makedirs(tmp_path / "docs" / "reports" / "bench")
    (tmp_path / "README.md").write_text(PAGE)
    runs = [
        bench_run("disttrain", 0.92, 0.92),
        bench_run("tf_default", 0.46, 0.46),
        bench_run("tf2_pss", 0.45, 0.45),
        bench_run("tf2_pss_minsize", 0.47, 0.47),
        # Faster on paper, but it trained nothing: never counted.
        bench_run("tf2_pss", 0.99, 0.99, error="did not train: the global step did not move"),
    ]
    report = tmp_path / tables.HEADLINE[0].report
    report.write_text(json.dumps(bench_report(runs)))
    return tmp_path


def test_the_headline_renders_a_reports_row_and_not_measured_without_one(repo):
    text = tables.render("headline", str(repo))
    cifar, mlp, *_ = text.splitlines()[2:]
    assert cifar == f"| {tables.HEADLINE[0].label} | 0.92x | 0.47x (TF 2 PSS, MinSize) | 0.46x |"
    assert mlp == f"| {tables.HEADLINE[1].label} | not measured | not measured | not measured |"
    # README's front page holds no date: the caption points to where the reports' dates are.
    assert not re.search(r"\d{4}-\d{2}-\d{2}", text), text
    assert text.splitlines()[-1].endswith("measured as docs/benchmark.md's targets table says.*")


def test_a_seeds_row_reads_tf_defaults_verdict_and_what_disttrain_got_beside_it(tmp_path):
    os.makedirs(tmp_path / tables.SEEDS_DIR)
    verdict = "moving variables and gradients takes 25 ms of a 139 ms step: train with disttrain's ..."
    runs = [
        bench_run(
            "tf_default", 0.69, 0.69, verdict=verdict, top_change="train with ...", predicted_gain=1.33
        ),
        bench_run("disttrain", 0.87, 0.87),
    ]
    (tmp_path / tables.SEEDS[0].case.report).write_text(json.dumps(bench_report(runs)))
    # Seed 001: the cores were all busy, so its first change predicts nothing.
    busy = [bench_run("tf_default", 0.32, 0.32, verdict="this machine's 2 cores ...", predicted_gain=None)]
    (tmp_path / tables.SEEDS[1].case.report).write_text(json.dumps(bench_report(busy)))
    first, second = tables.render("seeds", str(tmp_path)).splitlines()[2:4]
    assert first.endswith(f"| `{verdict}` | +33% | +26% | yes |"), first
    assert second.endswith("| `this machine's 2 cores ...` | - | - | - |"), second  # and no disttrain run
    gone = tmp_path / "gone"
    os.makedirs(gone)
    assert "| not measured | - | - | - |" in tables.render("seeds", str(gone))


def test_a_budget_check_renders_a_row_per_k_with_its_spread_and_verdict(tmp_path):
    os.makedirs(tmp_path / tables.BUDGET_DIR)
    alone = [{"steps_per_sec": [2.0]}, {"steps_per_sec": [2.1]}]
    checks = [
        {
            "copies": 2,
            "alone": alone,
            "together": {"steps_per_sec": [2.0, 2.06]},
            "spread": 0.03,
            "fair": True,
        },
        {"copies": 8, "alone": alone, "together": {"error": "refused"}, "spread": None, "fair": False},
    ]
    config = {"host_cores": 0.22, "model": "Cifar10", "batch_size": 32, "started_utc": "2026-12-07T09:05:57Z"}
    (tmp_path / tables.BUDGET_DIR / "c.json").write_text(json.dumps({"config": config, "checks": checks}))
    text = tables.render("budget_fairness", str(tmp_path))
    two, eight = text.splitlines()[2:4]
    assert two == "| 0.22 core | 2 | 2.00-2.06 | 3.0% | 2.00, 2.10 | 3.0% | yes |"
    assert eight == "| 0.22 core | 8 | FAILED | - | - | - | no |"
    assert text.endswith("measured 2026-12-07.*")


def test_the_scaling_table_gives_each_systems_efficiency_against_n_hosts_alone_and_its_spread(tmp_path):
    os.makedirs(tmp_path / tables.SCALING_DIR)
    repeats = [{"scaling_efficiency": 0.9}, {"scaling_efficiency": 0.94}]
    runs = [
        bench_run("disttrain", 0.92, 0.95, workers=4, counted_examples_per_sec=230.0, repeats=repeats),
        bench_run("tf_default", 0.3, 0.31, workers=4, counted_examples_per_sec=75.0),
        bench_run("tf2_mwms", 0.0, 0.0, workers=4, layout="ring", ps=0, error="exited with code 1\nlog"),
    ]
    report = bench_report(runs)
    report["config"] |= {"host_cores": 0.18, "link_ratio": 1.0}
    (tmp_path / tables.SCALING_DIR / "cifar10.json").write_text(json.dumps(report))
    rows = tables.render("scaling", str(tmp_path)).splitlines()[2:5]
    assert rows[0] == "| Cifar10 b32 | TF 2 MWMS | 4 | 4 | - | - | - | exited with code 1 |"
    assert rows[1] == "| Cifar10 b32 | TF's default | 4 | 5 | 75 | 0.30 | one run | 0.31 |"
    assert rows[2] == "| Cifar10 b32 | disttrain (async_ps) | 4 | 5 | 230 | 0.92 | 0.90-0.94 | 0.95 |"
    plots = tables.scaling_plots(str(tmp_path))
    assert plots == [f"{tables.SCALING_DIR}/cifar10.png"] and (tmp_path / plots[0]).stat().st_size > 0


def test_the_link_ratio_table_shows_each_budgets_rate_ratio_and_figures_and_what_is_missing(tmp_path):
    os.makedirs(tmp_path / tables.BENCH)
    repeats = [{"scaling_efficiency": 0.6}, {"scaling_efficiency": 0.64}]
    refused = [{"scaling_efficiency": 0.4}, {"error": "refused: core(s) [1] had no idle time left"}]
    runs = [
        bench_run("disttrain", 0.64, 0.7, repeats=repeats),
        bench_run("tf_default", 0.4, 0.4, repeats=refused),
    ]
    report = bench_report(runs)
    # 4 MB in 1 x a 0.25 s step: 128 Mbit/s; the table recomputes the ratio from the rate and the reference.
    report["config"] |= {"link_ratio": 1.0, "link_mbit": 128.0, "model_bytes": 4e6, "host_cores": 0.45}
    report["reference"]["steps_per_sec"] = 4.0
    (tmp_path / tables.BENCH / "cifar_ratio1.json").write_text(json.dumps(report))
    rows = tables.render("link_ratio", str(tmp_path)).splitlines()[2:4]
    assert rows[0] == (
        "| 0.45 core a host, `--link_ratio=1` | 4.00 | 128 Mbit/s | 1.00 | 0.64 (0.60-0.64) "
        "| 0.40 (1 of 2 repeats counted) |"
    )
    assert rows[1].startswith("| 0.22 core a host, `--link_ratio=1` | not measured |")
    # The targets table names the rate and budget the ratio came to on the machine that ran it.
    assert "seed 000's ratio (1) (128 Mbit/s, 0.45 core a host)" in tables.render("targets", str(tmp_path))


def test_readmes_first_forty_lines_hold_no_date():
    with open(os.path.join(REPO, "README.md")) as f:
        first = "".join(f.readlines()[:40])
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b|\b1[12]-[0-3]\d\b", first), first


def test_update_writes_the_block_and_check_then_passes_and_names_what_goes_stale(repo):
    changed, problems = tables.update(str(repo), check=True)
    assert changed == ["README.md:5: table headline"] and problems == []

    changed, problems = tables.update(str(repo))
    assert changed == ["README.md:5: table headline"] and problems == []
    page = (repo / "README.md").read_text()
    assert page.startswith("# Results\n\nBefore.\n\n<!-- table: headline -->\n| case |")
    assert "0.47x (TF 2 PSS, MinSize)" in page and page.endswith("```\n\nAfter.\n")
    assert tables.update(str(repo), check=True) == ([], [])

    report = repo / tables.HEADLINE[0].report
    report.write_text(json.dumps(bench_report([bench_run("disttrain", 0.95, 0.95)])))
    (repo / "docs" / "guide.md").write_text("<!-- table: no_such_table -->\nold\n<!-- /table -->\n")
    changed, problems = tables.update(str(repo), check=True)
    assert changed == ["README.md:5: table headline"]
    assert len(problems) == 1 and problems[0].startswith("docs/guide.md:1: unknown table 'no_such_table'")
    assert "0.47x" in (repo / "README.md").read_text(), "--check rewrote a page"


def test_a_block_left_open_is_named():
    with pytest.raises(tables.TableError, match="page.md:2: table headline has no <!-- /table --> line"):
        tables.blocks(["text\n", "<!-- table: headline -->\n", "more\n"], "page.md")


def test_every_block_of_the_repository_is_up_to_date():
    changed, problems = tables.update(REPO, check=True)
    assert not problems, problems
    assert not changed, f"stale: {changed}; run python bin/tables.py and commit the pages"
