"""The measurement tables of README.md and docs/, generated from the report files in the repository.

A page holds a generated table between two lines of its own:

    <!-- table: headline -->
    (written here: a table and one line with its date and sources)
    <!-- /table -->

`python bin/tables.py` (installed: `disttrain-tables`) rewrites every such block of README.md and
docs/**/*.md from the reports; `--check` rewrites nothing and exits 1 naming each block that is
stale and each NAME that is not in TABLES (disttrain/scripts/tables.py). Markers inside a fenced
code block are text, not blocks.

Report files, each written by a tool's `--out` and never edited by hand:
- the benchmark's (`bin/benchmark.py --out`) in docs/reports/bench/; the DLRM runs in docs/images/;
- time to accuracy's (`bin/accuracy.py --out`) in docs/images/, beside their plots.
A report that is missing renders as "not measured". A benchmark run the report marks failed,
skipped or diverged never counts.

TABLES maps NAME to its renderer: a function returning the block's markdown, given the repository's
root as `root=` if it has a parameter of that name (else called with no argument). Registering one
is one line: the function, a `functools.partial` of one, or "module:function" to import it only
when a page uses it, e.g. `"calibration": "disttrain.plan.calibration:table"`. A renderer reads
files; it measures nothing.

Analysis side: nothing in the core imports this module.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import importlib
import inspect
import json
import os
import re
from collections.abc import Callable, Sequence

BENCH = "docs/reports/bench"  # the benchmark's reports, by case
IMAGES = "docs/images"  # time to accuracy's reports beside their plots; the DLRM benchmark runs

START = re.compile(r"^\s*<!--\s*table:\s*(\S+?)\s*-->\s*$")
END = re.compile(r"^\s*<!--\s*/table\s*-->\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
NOT_MEASURED = "not measured"


class TableError(Exception):
    """A page's blocks cannot be read (a start without its end, or nested blocks)."""


# ---- markdown ------------------------------------------------------------------------------------


def markdown(header: Sequence[str], body: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in body])


def load(root: str, path: str) -> dict | None:
    """The JSON report at `path` (relative to root), or None when the repository has none."""
    full = os.path.join(root, path)
    if not os.path.exists(full):
        return None
    with open(full) as f:
        return json.load(f)


def reports_in(root: str, folder: str) -> dict[str, dict]:
    """Every JSON report in `folder` (relative to root), by its full path, in name order."""
    found = sorted(glob.glob(os.path.join(root, folder, "*.json")))
    return {path: load(root, os.path.relpath(path, root)) for path in found}


def when(dates: Sequence[str | None]) -> str:
    """'measured 2026-12-02', or a range, from the reports' dates; 'date not recorded' without one."""
    known = sorted({d for d in dates if d})
    if not known:
        return "date not recorded"
    return f"measured {known[0]}" + (f" to {known[-1]}" if len(known) > 1 else "")


def caption(text: str) -> str:
    return f"*{text[0].upper()}{text[1:]}.*"


# ---- the benchmark's reports ---------------------------------------------------------------------

DISTTRAIN, TF_DEFAULT = "disttrain", "tf_default"
PEERS = {  # TF 2's strategies as the benchmark runs them (disttrain/bench/tf2.py), as tables name them
    "tf2_pss": "TF 2 PSS",
    "tf2_pss_minsize": "TF 2 PSS, MinSize",
    "tf2_mwms": "TF 2 MWMS",
}
STRATEGY_NAMES = {  # disttrain:<kind> and the baseline as the DLRM table names them
    "disttrain:hybrid": "SyncHybrid",
    "disttrain:sync_ps": "SyncParameterServer",
    "disttrain:allreduce": "SyncAllReduce",
    "disttrain:async_ps": "AsyncParameterServer",
    TF_DEFAULT: "TF's default",
}
MEASURES = {  # a case's measure -> (the run's field, how a figure reads)
    "one_process": ("scaling_efficiency", "{:.2f}x"),  # x N one processes (N x one process alone)
    "bound": ("efficiency_vs_bound", "{:.2f} of the bound"),
    "steps": ("counted_steps_per_sec", "{:.2f} steps/s"),
}


def bench_date(report: dict) -> str | None:
    """The day a benchmark ran (UTC where the report says so, else its local start), YYYY-MM-DD."""
    config = report.get("config") or {}
    return (config.get("started_utc") or config.get("started") or "")[:10] or None


def family(system: str) -> str:
    """'disttrain' for disttrain under any strategy (`disttrain:hybrid`), else the system's name."""
    return DISTTRAIN if system.partition(":")[0] == DISTTRAIN else system


def trained(run: dict) -> bool:
    """A run that counts: measured, neither failed (trained nothing), skipped nor diverged."""
    return not (run.get("error") or run.get("skipped") or run.get("diverged")) and (
        run.get("counted_steps_per_sec") is not None
    )


@dataclasses.dataclass(frozen=True)
class Case:
    """One row: a benchmark report in the repository, and what its figures are measured against."""

    label: str
    report: str  # relative to the repository's root
    measure: str = "one_process"  # of MEASURES
    workers: int | None = None  # only the runs at this worker count (None: every run)

    def runs(self, report: dict) -> list[dict]:
        return [r for r in report["runs"] if self.workers is None or r["workers"] == self.workers]


def best(case: Case, report: dict, systems: Callable[[str], bool], measure: str | None = None):
    """The best counted (value, system) of the runs whose system passes `systems`, or the cell's text:
    '-' (none in this run), 'failed' (none trained), 'no reference' (one process alone failed)."""
    key = MEASURES[measure or case.measure][0]
    runs = [r for r in case.runs(report) if systems(r["system"])]
    if not runs:
        return "-"
    good = [r for r in runs if trained(r)]
    if not good:
        return "failed"
    valued = [(r[key], r["system"]) for r in good if r.get(key) is not None]
    return max(valued) if valued else "no reference"


def figure(found, measure: str, named: bool = False) -> str:
    if isinstance(found, str):
        return found
    value, system = found
    text = MEASURES[measure][1].format(value)
    return f"{text} ({PEERS.get(system, system)})" if named else text


def is_disttrain(system: str) -> bool:
    return family(system) == DISTTRAIN


def is_peer(system: str) -> bool:
    return system in PEERS


def is_tf_default(system: str) -> bool:
    return system == TF_DEFAULT


def bench_caption(reports: Sequence[dict | None], what: str) -> str:
    found = [r for r in reports if r is not None]
    if not found:
        return caption(f"{NOT_MEASURED} yet: {what}")
    return caption(f"{when([bench_date(r) for r in found])}; {what}")


HEADLINE = [
    Case("CIFAR-10 batch 32, 1 PS + 1 worker, a link at seed 000's ratio (1)", f"{BENCH}/cifar_ratio1.json"),
    Case("the same, 16-bit transfer (the docs' setting for a slow link)", f"{BENCH}/cifar_ratio1_bf16.json"),
    Case("76 MB MLP, Adam, 1 PS + 1 worker, loopback", f"{BENCH}/mlp_1ps.json"),
    Case(
        "the MLP on 4 emulated hosts, links at ratio 2.5, async PS",
        f"{BENCH}/mlp_4hosts_async.json",
        measure="bound",
    ),
    Case(
        "the MLP on 4 emulated hosts, links at ratio 2.5, all-reduce",
        f"{BENCH}/mlp_4hosts_ring.json",
        measure="bound",
    ),
]


HEADLINE_SYSTEMS = (  # the headline table's columns and the plot's bars, in order
    ("disttrain", is_disttrain),
    ("best TF 2 peer", is_peer),
    ("TF's default layout", is_tf_default),
)


def headline(root: str) -> str:
    """README's results: per case, disttrain, the best TF 2 peer and TF's default layout, same run.

    Its caption carries no date: README's front page holds none. The day each report was measured is
    in docs/benchmark.md's targets table, generated from the same reports.
    """
    body = []
    for case in HEADLINE:
        report = load(root, case.report)
        if report is None:
            body.append([case.label, *[NOT_MEASURED] * len(HEADLINE_SYSTEMS)])
            continue
        body.append(
            [
                case.label,
                *(
                    figure(best(case, report, chosen), case.measure, named=chosen is is_peer)
                    for _, chosen in HEADLINE_SYSTEMS
                ),
            ]
        )
    table = markdown(["case", *(name for name, _ in HEADLINE_SYSTEMS)], body)
    return (
        table
        + "\n\n"
        + caption(
            "Each row's systems in one run, as a multiple of one process alone in that run or a share of "
            f"the layout's bound (async: N x the slowest worker); -: not in that run; a link at ratio r "
            "moves the model's bytes in r x one process's step, each emulated host on a CPU budget of its "
            f"own, so a row means the same on any machine; reports in {BENCH}/, measured as "
            "docs/benchmark.md's targets table says"
        )
    )


HEADLINE_PLOT = f"{BENCH}/headline.png"
SHORT = {  # HEADLINE's labels as the plot's axis names them
    HEADLINE[0].label: "CIFAR-10, 1 PS + 1 worker\nlink ratio 1",
    HEADLINE[1].label: "the same,\n16-bit transfer",
    HEADLINE[2].label: "MLP 76 MB, 1 PS + 1 worker\nloopback",
    HEADLINE[3].label: "MLP, 4 hosts, ratio 2.5\nasync PS",
    HEADLINE[4].label: "MLP, 4 hosts, ratio 2.5\nall-reduce",
}


def headline_plot(root: str) -> str | None:
    """README's plot of the headline table, written to HEADLINE_PLOT; a one-line reason if none was.

    One group of bars per measured case: disttrain, the best TF 2 peer and TF's default layout, each
    as its row's measure (x one process alone, or share of the bound: 1.0 is the line either way).
    """
    measured = [(c, r) for c in HEADLINE if (r := load(root, c.report)) is not None]
    if not measured:
        return "no headline report yet, so no plot was written"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed, so no plot was written: pip install 'disttrain[bench]' adds it"
    systems = HEADLINE_SYSTEMS
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(systems)
    for k, (name, chosen) in enumerate(systems):
        values = [best(c, r, chosen) for c, r in measured]
        heights = [0.0 if isinstance(v, str) else v[0] for v in values]
        bars = ax.bar([i + (k - 1) * width for i in range(len(measured))], heights, width, label=name)
        for bar, v in zip(bars, values, strict=True):
            ax.annotate(
                v if isinstance(v, str) else f"{v[0]:.2f}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(measured)), [SHORT.get(c.label, c.label) for c, _ in measured], fontsize=7)
    ax.set_ylim(0, 1.25)
    ax.set_ylabel("x one process, or share of the bound")
    ax.set_title("Same-run ratios", fontsize=9)
    ax.legend(fontsize=8, loc="upper center", ncol=len(systems), frameon=False)
    fig.tight_layout()
    fig.savefig(os.path.join(root, HEADLINE_PLOT), dpi=110)
    plt.close(fig)
    return None


@dataclasses.dataclass(frozen=True)
class Target:
    """A target of docs/benchmark.md: its case and what disttrain must reach there."""

    name: str
    case: Case
    goals: tuple[tuple[str, float], ...] = ()  # (measure, at least this) for disttrain
    ahead_of: tuple[str, ...] = ()  # or: ahead of these peers in the same run (case.measure)

    @property
    def goal(self) -> str:
        if self.ahead_of:
            return "ahead of " + " and ".join(PEERS[p] for p in self.ahead_of)
        return " and ".join(
            MEASURES[m][1].format(v) + (" one process" if m == "one_process" else "") for m, v in self.goals
        )

    def met(self, report: dict) -> str:
        if self.ahead_of:
            own = best(self.case, report, is_disttrain)
            peer = best(self.case, report, lambda s: s in self.ahead_of)
            if isinstance(own, str) or isinstance(peer, str):
                return "-"
            return "yes" if own[0] > peer[0] else "no"
        verdicts = []
        for measure, value in self.goals:
            own = best(self.case, report, is_disttrain, measure)
            if isinstance(own, str):
                return "-"
            verdicts.append(own[0] >= value)
        return "yes" if all(verdicts) else "no"


MLP_4_HOSTS = "MLP batch 32, 4 emulated hosts, links at ratio 2.5, PS colocated"
CIFAR_2_WORKERS = "CIFAR-10 batch 128, 2 local workers (bound: compute)"
TARGETS = [
    Target(
        "1",
        Case(
            "76 MB MLP, Adam, batch 128, 1 PS + 1 worker, loopback (bound: compute)", f"{BENCH}/mlp_1ps.json"
        ),
        goals=(("one_process", 0.75),),
    ),
    Target(
        "2",
        Case(
            "CIFAR-10 batch 32, 1 PS + 1 worker, a link at seed 000's ratio (1)", f"{BENCH}/cifar_ratio1.json"
        ),
        goals=(("one_process", 0.85),),
    ),
    Target(
        "2, 16-bit",
        Case("the same with `transfer_dtype='bfloat16'`", f"{BENCH}/cifar_ratio1_bf16.json"),
        goals=(("one_process", 0.85), ("bound", 0.9)),
    ),
    Target("3, async PS", Case(MLP_4_HOSTS, f"{BENCH}/mlp_4hosts_async.json", "bound"), (("bound", 0.9),)),
    Target("3, all-reduce", Case(MLP_4_HOSTS, f"{BENCH}/mlp_4hosts_ring.json", "bound"), (("bound", 0.9),)),
    Target(
        "5, async PS",
        Case(CIFAR_2_WORKERS, f"{BENCH}/cifar_b128_async.json"),
        ahead_of=("tf2_pss", "tf2_pss_minsize"),
    ),
    Target("5, all-reduce", Case(CIFAR_2_WORKERS, f"{BENCH}/cifar_b128_ring.json"), ahead_of=("tf2_mwms",)),
]


def both(case: Case, report: dict, systems: Callable[[str], bool]) -> str:
    """'0.92x / 0.92': the best counted run as a multiple of one process and as a share of the bound."""
    one = best(case, report, systems, "one_process")
    if isinstance(one, str):
        return one
    bound = best(case, report, systems, "bound")
    return f"{one[0]:.2f}x / " + (f"{bound[0]:.2f}" if not isinstance(bound, str) else bound)


def as_run(report: dict) -> str:
    """What a case defined by ratios was on the machine that ran it: '124 Mbit/s, 0.45 core a host'."""
    cfg, parts = report["config"], []
    if cfg.get("link_ratio") and cfg.get("link_mbit"):
        parts.append(f"{cfg['link_mbit']:.0f} Mbit/s")
    if cfg.get("host_cores"):
        parts.append(f"{cfg['host_cores']:g} core a host")
    return ", ".join(parts)


def targets(root: str) -> str:
    """docs/benchmark.md's targets: every system of each target's run, x one process / of the bound."""
    header = ["target", "case", "disttrain", "TF's default", *PEERS.values(), "goal (disttrain)", "met"]
    body, reports = [], []
    for target in TARGETS:
        report = load(root, target.case.report)
        reports.append(report)
        here = as_run(report) if report else ""
        head = [target.name, target.case.label + (f" ({here})" if here else "")]
        if report is None:
            body.append([*head, *[NOT_MEASURED] * (2 + len(PEERS)), target.goal, "-"])
            continue
        cells = [both(target.case, report, is_disttrain), both(target.case, report, is_tf_default)]
        cells += [both(target.case, report, lambda s, p=p: s == p) for p in PEERS]
        body.append([*head, *cells, target.goal, target.met(report)])
    what = (
        "each target's systems in one run; a multiple of N x one process alone in that run (1.00x: "
        "linear scaling) / a share of the layout's bound (async: N x the slowest worker); -: not in "
        f"that run; reports in {BENCH}/"
    )
    return markdown(header, body) + "\n\n" + bench_caption(reports, what)


def link_bytes(root: str, path: str = f"{BENCH}/mlp_4hosts_async.json") -> str:
    """Target 4: the busiest and least busy host link's MB per global step in target 3's async run."""
    report = load(root, path)
    header = ["system", "busiest link, MB per step", "least busy link", "expected busiest"]
    if report is None:
        body = [[NOT_MEASURED, "", "", ""]]
    else:
        body = []
        for run in report["runs"]:
            if not trained(run) or run.get("busiest_link_bytes_per_step") is None:
                continue
            body.append(
                [
                    PEERS.get(run["system"], STRATEGY_NAMES.get(run["system"], run["system"])),
                    f"{run['busiest_link_bytes_per_step'] / 1e6:.1f}",
                    f"{run['min_link_bytes_per_step'] / 1e6:.1f}",
                    f"{run['expected_busiest_link_bytes_per_step'] / 1e6:.1f}",
                ]
            )
    what = f"interface counters of each emulated host, per global step; report {path}"
    return markdown(header, body) + "\n\n" + bench_caption([report], what)


DLRM = [  # (setting, report): the benchmark's DLRM, disttrain's strategies beside TF's default
    ("2 workers, 2 PS, loopback", f"{IMAGES}/dlrm_hybrid_loopback.json"),
    ("2 workers, 2 PS, emulated 1 Gbit/s", f"{IMAGES}/dlrm_hybrid_emulated.json"),
    ("4 workers, 2 PS, emulated 250 Mbit/s", f"{IMAGES}/dlrm_hybrid_4w_250.json"),
    ("4 workers, 2 PS, emulated 1 Gbit/s", f"{IMAGES}/dlrm_hybrid_4w_1000.json"),
]


def dlrm(root: str) -> str:
    """Per setting, one process alone and each system's counted steps/s with its share of the bound."""
    systems = ["disttrain:hybrid", "disttrain:sync_ps", "disttrain:allreduce", TF_DEFAULT]
    header = ["setting", "one process", *(STRATEGY_NAMES[s] for s in systems)]
    body, reports = [], []
    for setting, path in DLRM:
        report = load(root, path)
        reports.append(report)
        if report is None:
            body.append([setting, *[NOT_MEASURED] * (1 + len(systems))])
            continue
        ref = (report.get("reference") or {}).get("steps_per_sec")
        row = [setting, f"{ref:.2f}" if ref else "failed"]
        for system in systems:
            runs = [r for r in report["runs"] if r["system"] == system]
            good = [r for r in runs if trained(r)]
            if not good:
                row.append("failed" if runs else "-")
                continue
            run = max(good, key=lambda r: r["counted_steps_per_sec"])
            share = run.get("efficiency_vs_bound")
            row.append(
                f"{run['counted_steps_per_sec']:.2f}" + (f" ({share:.2f})" if share is not None else "")
            )
        body.append(row)
    what = (
        "steps/s as the benchmark counts them (sync: the cluster's rate; async: N x the slowest worker), "
        f"in brackets the share of the layout's bound; reports {IMAGES}/dlrm_hybrid_*.json"
    )
    return markdown(header, body) + "\n\n" + bench_caption(reports, what)


# ---- time to accuracy's reports ------------------------------------------------------------------


def accuracy_date(report: dict) -> str | None:
    """The day a time-to-accuracy report was started: its own field, else its default log directory's."""
    if report.get("started_utc"):
        return report["started_utc"][:10]
    m = re.search(r"(\d{4})(\d{2})(\d{2})-\d{6}", report.get("logdir") or "")
    return f"{m[1]}-{m[2]}-{m[3]}" if m else None


def accuracy_caption(reports: dict[str, dict | None]) -> str:
    names = ", ".join(f"`{os.path.basename(p)}`" for p in reports)
    missing = [p for p, r in reports.items() if r is None]
    where = f"report{'s' if len(reports) > 1 else ''} {names} in {IMAGES}/"
    if len(missing) == len(reports):
        return caption(f"{NOT_MEASURED} yet: {where}")
    found = [r for r in reports.values() if r is not None]
    return caption(f"{when([accuracy_date(r) for r in found])}; {where}")


def setting(row: dict) -> str:
    """'allreduce, accumulate 2' / 'allreduce, batch x2': a row's system and settings that change it."""
    text = row["system"]
    if row.get("accumulate_steps", 1) != 1:
        text += f", accumulate {row['accumulate_steps']}"
    if row.get("batch_scale", 1) != 1:
        text += f", batch x{row['batch_scale']}"
    return text


def _ratio(value, reference) -> str:
    return f"{value / reference:.2f}" if value is not None and reference else "-"


def _columns() -> dict[str, Callable[[dict, dict], str]]:
    """Time to accuracy's columns: header -> f(row, its one-process reference row)."""
    return {
        "system": lambda r, ref: r["system"],
        "workers": lambda r, ref: str(r["workers"]),
        "steps/run": lambda r, ref: str(r.get("steps_per_run", 1)),
        "accumulate": lambda r, ref: str(r.get("accumulate_steps", 1)),
        "start-up s": lambda r, ref: f"{r['startup_secs']:.1f}",
        "s to target": lambda r, ref: "-" if r["secs_to_target"] is None else f"{r['secs_to_target']:.1f}",
        "time x one process": lambda r, ref: _ratio(r["secs_to_target"], ref.get("secs_to_target")),
        "examples to target": lambda r, ref: (
            "not reached" if r["examples_to_target"] is None else str(r["examples_to_target"])
        ),
        "examples/s": lambda r, ref: (
            "-" if r.get("examples_per_sec") is None else f"{r['examples_per_sec']:.0f}"
        ),
        "examples/s x one process": lambda r, ref: _ratio(
            r.get("examples_per_sec"), ref.get("examples_per_sec")
        ),
        "final held-out acc. %": lambda r, ref: f"{100 * r['final_accuracy']:.1f}",
        "vs one process (points)": lambda r, ref: (
            f"{100 * (r['final_accuracy'] - ref['final_accuracy']):+.1f}" if "final_accuracy" in ref else "-"
        ),
    }


TIME_TO_TARGET = (
    "system",
    "workers",
    "start-up s",
    "s to target",
    "time x one process",
    "examples to target",
    "final held-out acc. %",
    "vs one process (points)",
)
SPEED = (
    "system",
    "steps/run",
    "examples/s",
    "examples/s x one process",
    "s to target",
    "time x one process",
    "final held-out acc. %",
)


def accuracy_runs(
    path: str, columns: Sequence[str], root: str, keep: Callable[[dict], bool] = lambda row: True
) -> str:
    """One row per run of a time-to-accuracy report (those `keep` passes), each against one process at
    its settings."""
    from disttrain.bench import accuracy  # TensorFlow; only when a page shows one of these tables

    report = load(root, path)
    if report is None:
        return (
            markdown(columns, [[NOT_MEASURED] + [""] * (len(columns) - 1)])
            + "\n\n"
            + accuracy_caption({path: None})
        )
    every = _columns()
    rows = report["rows"]
    body = []
    for r in filter(keep, rows):
        if "failed" in r:
            body.append([setting(r), f"failed: {r['failed']}"] + [""] * (len(columns) - 2))
            continue
        ref = accuracy.reference_row(rows, r) or {}
        cells = [every[c](r, ref) for c in columns]
        body.append([setting(r) if c == "system" else cell for c, cell in zip(columns, cells, strict=True)])
    return markdown(columns, body) + "\n\n" + accuracy_caption({path: report})


def _pm(mean: float, se: float | None, scale: float = 1.0, sign: str = "") -> str:
    return f"{scale * mean:{sign}.1f}" + (f" ± {scale * se:.1f}" if se is not None else "")


def accuracy_paired(groups: Sequence[Sequence[str]], root: str) -> str:
    """Seed-paired differences (16-bit against float32, accumulation against one step of the same
    global batch), points, mean ± SE over seeds; each group of reports is merged before pairing."""
    from disttrain.bench import accuracy

    header = ["task", "system", "against", "seeds", "against: final acc. %"]
    header += ["difference: final (points)", "mean of last 3 (points)"]
    body, reports = [], {}
    for paths in groups:
        found = {p: load(root, p) for p in paths}
        reports.update(found)
        if any(r is None for r in found.values()):
            body.append([NOT_MEASURED, ", ".join(os.path.basename(p) for p in paths), "", "", "", "", ""])
            continue
        rows = [r for report in found.values() for r in report["rows"]]
        means = {accuracy._settings_of(e): e for e in accuracy.over_seeds(rows)}
        for e in accuracy.paired_differences(rows):
            changed = dict(e, **accuracy.twin(e)[1])
            twin = means.get(accuracy._settings_of(changed))
            body.append(
                [
                    e["task"],
                    setting(e),
                    setting(changed),
                    len(e["seeds"]),
                    _pm(twin["final"], twin["final_se"], 100) if twin else "-",
                    _pm(e["final_points"], e["final_points_se"], sign="+"),
                    _pm(e["last3_points"], e["last3_points_se"], sign="+"),
                ]
            )
    return markdown(header, body) + "\n\n" + accuracy_caption(reports)


def accuracy_interleaved(reports: Sequence[tuple[str, str]], root: str) -> str:
    """Per machine and system, examples/s and time to target as multiples of one process at each seed."""
    header = [
        "machine",
        "system",
        "examples/s x one process, by seed",
        "mean",
        "time to target x one process",
    ]
    body, found = [], {}
    for machine, path in reports:
        report = found[path] = load(root, path)
        if report is None:
            body.append([machine, NOT_MEASURED, "", "", ""])
            continue
        rows = [r for r in report["rows"] if "failed" not in r]
        alone = {r.get("seed", 0): r for r in rows if r["system"] == "one_process"}
        systems: dict[str, list[dict]] = {}
        for r in rows:
            if r["system"] != "one_process":
                systems.setdefault(setting(r), []).append(r)
        for name, members in systems.items():
            pairs = [(r, alone[r.get("seed", 0)]) for r in sorted(members, key=lambda r: r.get("seed", 0))]
            pairs = [(r, a) for r, a in pairs if r.get("examples_per_sec") and a.get("examples_per_sec")]
            speeds = [r["examples_per_sec"] / a["examples_per_sec"] for r, a in pairs]
            times = [_ratio(r["secs_to_target"], a["secs_to_target"]) for r, a in pairs]
            mean = f"{sum(speeds) / len(speeds):.2f}" if speeds else "-"
            body.append([machine, name, ", ".join(f"{s:.2f}" for s in speeds), mean, ", ".join(times)])
    return markdown(header, body) + "\n\n" + accuracy_caption(found)


DIGITS_SYSTEMS = ("one_process", "async", "async_compensated", "async_overlap", "async_overlap_compensated")
DIGITS_SYSTEMS += ("sync_ps", "allreduce", "tf2_mwms")


def _images(name: str) -> str:
    return f"{IMAGES}/accuracy_{name}.json"


# ---- the registry --------------------------------------------------------------------------------

Renderer = Callable[..., str]
SEEDS_DIR = "docs/reports/seeds"  # issue 48's seeds: TF's default layout beside disttrain, in one run


@dataclasses.dataclass(frozen=True)
class Seed:
    """A report this project exists for, reproduced: what `disttrain-diagnose` says of TF's default
    layout there, and what its first change gained, disttrain run beside it in the same benchmark."""

    name: str
    asked: str
    case: Case
    diagnosed: Callable[[str], bool] = is_tf_default  # whose verdict (the control: disttrain's own)

    def row(self, report: dict | None) -> list[str]:
        head = [self.name, self.asked, self.case.label]
        if report is None:
            return [*head, NOT_MEASURED, "-", "-", "-"]
        runs = self.case.runs(report)
        read = next((r for r in runs if self.diagnosed(r["system"]) and trained(r)), None)
        if read is None or "verdict" not in read:
            return [*head, "failed" if read is None else "not read", "-", "-", "-"]
        expected, own = read.get("predicted_gain"), best(self.case, report, is_disttrain, "steps")
        # What disttrain's layout got beside TF's default (nothing to compare for disttrain's own verdict).
        unpaired = isinstance(own, str) or self.diagnosed is is_disttrain
        got = None if unpaired else own[0] / read["counted_steps_per_sec"]
        half = "-" if None in (expected, got) else ("yes" if got - 1 >= (expected - 1) / 2 else "no")
        return [
            *head,
            f"`{read['verdict']}`",
            "-" if expected is None else f"+{100 * (expected - 1):.0f}%",
            "-" if got is None else f"{100 * (got - 1):+.0f}%",
            half,
        ]


SEEDS = [
    Seed(
        "000",
        "1 PS host and 1 worker over 1 GbE: ten times slower than one machine",
        Case(
            "CIFAR-10 batch 32, 1 PS + 1 worker, an emulated link moving the model in one process's step",
            f"{SEEDS_DIR}/seed000.json",
        ),
    ),
    Seed(
        "001",
        "1 PS serving a 76 MB model with Adam to 4 workers: 2 steps/s instead of 150",
        Case("76 MB MLP, Adam, batch 128, 1 PS + 4 workers, loopback", f"{SEEDS_DIR}/seed001.json"),
    ),
    Seed(
        "control",
        "a compute-bound run of disttrain's must not be told to change (its verdict here)",
        Case(CIFAR_2_WORKERS + ", async PS with overlap", f"{SEEDS_DIR}/control.json"),
        diagnosed=is_disttrain,
    ),
]


def seeds(root: str) -> str:
    """docs/diagnose.md's seeds: TF's default layout's verdict, the gain its first change predicts,
    and what disttrain, which makes that change, got beside it in the same run."""
    header = ["seed", "asked", "case", "verdict (TF's default layout)", "expected", "got", "at least half"]
    reports = [load(root, seed.case.report) for seed in SEEDS]
    body = [seed.row(report) for seed, report in zip(SEEDS, reports, strict=True)]
    what = (
        "one benchmark run per seed with TF's default layout and disttrain (its first change applied); "
        "the control's verdict is disttrain's own; "
        "expected: the first change's predicted gain; got: disttrain's counted steps/s over TF's "
        f"default's in that run; reports in {SEEDS_DIR}/"
    )
    return markdown(header, body) + "\n\n" + bench_caption(reports, what)


BUDGET_DIR = "docs/reports/budget"  # bin/benchmark.py --budget_check's reports (issue 49)


def budget_fairness(root: str) -> str:
    """docs/benchmark.md's fairness of a CPU budget per host: K copies of one step together, each on its
    own budget, beside one copy alone before and after, from every report in BUDGET_DIR."""
    header = [
        "budget",
        "copies",
        "together, steps/s",
        "among them",
        "alone before, after",
        "spread",
        "fair (5%)",
    ]
    body, reports = [], reports_in(root, BUDGET_DIR)
    for report in reports.values():
        cores = f"{report['config']['host_cores']:g} core"
        for check in report["checks"]:
            if check["spread"] is None:
                body.append([cores, check["copies"], "FAILED", "-", "-", "-", "no"])
                continue
            rates = check["together"]["steps_per_sec"]
            alone = ", ".join(f"{x['steps_per_sec'][0]:.2f}" for x in check["alone"])
            together = f"{min(rates):.2f}-{max(rates):.2f}" if len(rates) > 1 else f"{rates[0]:.2f}"
            within = f"{max(rates) / min(rates) - 1:.1%}"  # the copies in one window
            fair = "yes" if check["fair"] else "no"
            body.append([cores, check["copies"], together, within, alone, f"{check['spread']:.1%}", fair])
    if not body:
        return NOT_MEASURED
    models = sorted({f"{r['config']['model']} batch {r['config']['batch_size']}" for r in reports.values()})
    what = (
        f"{', '.join(models)}; each copy one intra-op thread, pinned, a quota per 20 ms; spread: the fastest "
        "over the slowest of the copies together and the mean alone; "
        f"`--budget_check` reports in {BUDGET_DIR}/, "
        + when([r["config"].get("started_utc", "")[:10] or None for r in reports.values()])
    )
    return markdown(header, body) + "\n\n" + caption(what)


SCALING_DIR = "docs/reports/scaling"  # issue 49's scaling runs: hosts of their own, 1 to 8 of them
RATIO_DIR = "docs/reports/ratio"  # target 2 on a second budget: a case defined by ratio keeps its figures


def _system_name(run: dict) -> str:
    name = PEERS.get(run["system"]) or STRATEGY_NAMES.get(run["system"])
    if name:
        return name
    return "TF's default" if run["system"] == TF_DEFAULT else f"disttrain ({run['strategy']})"


def _hosts(run: dict) -> int:
    return run["workers"] + (run["ps"] if run.get("layout") == "dedicated" else 0)


def _repeat_efficiencies(run: dict) -> list[float]:
    """The x one process of each counted repeat of a run (with processes alone beside it)."""
    return [x["scaling_efficiency"] for x in run.get("repeats", []) if x.get("scaling_efficiency")]


def scaling(root: str) -> str:
    """The seeds' table of our own: per system and worker count, examples/s and the efficiency against N x
    one host under the same budget (alone beside the run), with its spread over the repeats, from every
    report in SCALING_DIR."""
    header = [
        "model",
        "system",
        "workers",
        "hosts",
        "examples/s",
        "x N one host",
        "over repeats",
        "of the bound",
    ]
    body, reports = [], reports_in(root, SCALING_DIR)
    for report in reports.values():
        cfg = report["config"]
        model = f"{cfg['model']} b{cfg['batch_size']}"
        for run in sorted(report["runs"], key=lambda r: (_system_name(r), r["workers"])):
            if not trained(run):
                cells = ["-"] * 3 + [run.get("error", "").split("\n")[0][:60] or "failed"]
            else:
                effs = _repeat_efficiencies(run)
                spread = f"{min(effs):.2f}-{max(effs):.2f}" if len(effs) > 1 else "one run"
                bound = run.get("efficiency_vs_bound")
                cells = [
                    f"{run['counted_examples_per_sec']:.0f}",
                    f"{run['scaling_efficiency']:.2f}",
                    spread,
                    f"{bound:.2f}" if bound is not None else "-",
                ]
            body.append([model, _system_name(run), run["workers"], _hosts(run), *cells])
    if not body:
        return NOT_MEASURED
    budgets = sorted({f"{r['config'].get('host_cores')}" for r in reports.values()})
    ratios = sorted({f"{r['config'].get('link_ratio')}" for r in reports.values()})
    what = (
        f"every host on a CPU budget of {', '.join(budgets)} core and links at ratio {', '.join(ratios)} "
        "to one host's step (`--host_cores`, `--link_ratio`); x N one host: counted examples/s over N x "
        "one process alone beside the run on the same budget; "
        f"reports in {SCALING_DIR}/ and the plot beside each"
    )
    return markdown(header, body) + "\n\n" + bench_caption(list(reports.values()), what)


RATIO_CASES = (  # target 2 on two budgets, its link set by ratio: (what changed, report)
    ("0.45 core a host, `--link_ratio=1`", f"{BENCH}/cifar_ratio1.json"),
    ("0.22 core a host, `--link_ratio=1`", f"{RATIO_DIR}/cifar_ratio1_022.json"),
)


def _over_repeats(run: dict | None) -> str:
    """'0.61 (0.60-0.62)': a run's x one process alone beside it, and its range over the repeats."""
    if run is None or not trained(run) or run.get("scaling_efficiency") is None:
        return "-" if run is None else "failed"
    effs, repeats = _repeat_efficiencies(run), len(run.get("repeats", []))
    spread = f" ({min(effs):.2f}-{max(effs):.2f})" if len(effs) > 1 else ""
    counted = f" ({len(effs)} of {repeats} repeats counted)" if len(effs) < repeats else ""
    return f"{run['scaling_efficiency']:.2f}{spread}{counted}"


def link_ratio(root: str) -> str:
    """Issue 49's proof: target 2 on two CPU budgets (a machine twice as slow) keeps its figures when its
    link is set by ratio."""
    header = [
        "run",
        "one process alone, steps/s",
        "link",
        "ratio",
        "disttrain, x one process",
        "TF's default",
    ]
    body, found = [], []
    for what, path in RATIO_CASES:
        report = load(root, path)
        if report is None:
            body.append([what, *[NOT_MEASURED] * 5])
            continue
        found.append(report)
        cfg, ref = report["config"], report["reference"]
        step = 1 / ref["steps_per_sec"]
        ratio = cfg["model_bytes"] * 8 / (cfg["link_mbit"] * 1e6) / step
        by = {r["system"]: r for r in report["runs"]}
        body.append(
            [
                what,
                f"{ref['steps_per_sec']:.2f}",
                f"{cfg['link_mbit']:.0f} Mbit/s",
                f"{ratio:.2f}",
                _over_repeats(by.get("disttrain")),
                _over_repeats(by.get("tf_default")),
            ]
        )
    what = (
        "CIFAR-10 batch 32, 1 PS + 1 worker host, disttrain's async PS with overlap; x one process: over "
        "the processes alone beside the run on the same budget, in the repeat the benchmark kept (its median "
        "quiet one), and the range over the repeats; a repeat is not counted when a host may not have got "
        "its budget; ratio: the link's time for the model's bytes over one process's step; reports in "
        f"{BENCH}/ and {RATIO_DIR}/"
    )
    return markdown(header, body) + "\n\n" + bench_caption(found, what)


def scaling_plots(root: str) -> list[str]:
    """A plot of efficiency against hosts, a line per system, beside each report of SCALING_DIR; the paths
    written (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for path, report in reports_in(root, SCALING_DIR).items():
        fig, ax = plt.subplots(figsize=(6, 4))
        lines: dict[str, list[tuple[int, float]]] = {}
        for run in report["runs"]:
            if trained(run) and run.get("scaling_efficiency") is not None:
                lines.setdefault(_system_name(run), []).append((_hosts(run), run["scaling_efficiency"]))
        for name, points in sorted(lines.items()):
            points.sort()
            ax.plot([h for h, _ in points], [e for _, e in points], marker="o", label=name)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xlabel("emulated hosts (workers and PS hosts)")
        ax.set_ylabel("x N one host (same budget, same window)")
        ax.set_ylim(0, 1.2)
        cfg = report["config"]
        ax.set_title(
            f"{cfg['model']} batch {cfg['batch_size']}: {cfg.get('host_cores')} core a host, "
            f"links at ratio {cfg.get('link_ratio')}",
            fontsize=9,
        )
        ax.legend(fontsize=8, frameon=False)
        fig.tight_layout()
        out = os.path.splitext(path)[0] + ".png"
        fig.savefig(out, dpi=110)
        plt.close(fig)
        written.append(os.path.relpath(out, root))
    return written


TABLES: dict[str, Renderer | str] = {
    "headline": headline,
    "budget_fairness": budget_fairness,
    "scaling": scaling,
    "link_ratio": link_ratio,
    "seeds": seeds,
    "targets": targets,
    "link_bytes": link_bytes,
    "dlrm": dlrm,
    "accuracy_teacher": functools.partial(accuracy_runs, _images("teacher"), TIME_TO_TARGET),
    "accuracy_digits": functools.partial(
        accuracy_runs,
        _images("digits"),
        TIME_TO_TARGET,
        keep=lambda row: row["workers"] in (1, 4) and row["system"] in DIGITS_SYSTEMS,
    ),
    "accuracy_steps_per_run": functools.partial(accuracy_runs, _images("teacher_steps_per_run"), SPEED),
    "accuracy_accumulation_speed": functools.partial(
        accuracy_runs,
        _images("teacher_16bit_accumulation"),
        (SPEED[0], *SPEED[2:]),
        keep=lambda row: row["system"] in ("one_process", "allreduce"),
    ),
    "accuracy_16bit_seeds": functools.partial(
        accuracy_paired,
        [
            [_images("teacher_16bit_cosine_seeds")],
            [_images("teacher_async_16bit_cosine_seeds")],
            [_images("digits_seeds")],
        ],
    ),
    "accuracy_accumulation_seeds": functools.partial(
        accuracy_paired,
        [
            [_images("teacher_accumulate_cosine_seeds"), _images("teacher_batch_scale_cosine_seeds")],
            [
                _images("teacher_async_accumulate_cosine_seeds"),
                _images("teacher_async_batch_scale_cosine_seeds"),
            ],
            [_images("digits_accumulate_seeds"), _images("digits_batch_scale_seeds")],
        ],
    ),
    "accuracy_interleaved": functools.partial(
        accuracy_interleaved,
        [("AMD", _images("teacher_interleaved")), ("Intel Xeon", _images("teacher_interleaved_intel"))],
    ),
    # Not measurements: docs/design.md's tables that the code holds as data.
    "endings": "disttrain.runtime.endings:table",
}


def _plan(name: str) -> str:
    """A table of the planner's runs (docs/planner.md), rendered by the planner itself (its data files)."""
    from disttrain.plan import report  # lazily: the planner builds the zoo's models

    return report.calibration_table(name)


PLAN_TABLES = (
    "plan_example",
    "plan_spreads",
    "plan_summary",
    "plan_calibration",
    "plan_held_out",
    "plan_cloud_tcp",
    "plan_nccl_rings",
    "plan_pcie_rings",
    "plan_seed",
    "plan_emulated",
)
TABLES.update({name: functools.partial(_plan, name) for name in PLAN_TABLES})


def renderer(name: str) -> Renderer:
    entry = TABLES[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
    return entry


def render(name: str, root: str) -> str:
    """The markdown of table `name` from the repository at `root` (KeyError for an unknown name)."""
    fn = renderer(name)
    takes_root = "root" in inspect.signature(fn).parameters
    return (fn(root=root) if takes_root else fn()).strip("\n")


# ---- pages and their blocks ----------------------------------------------------------------------


def pages(root: str) -> list[str]:
    """README.md and every docs/**/*.md, relative to root."""
    found = ["README.md"] if os.path.exists(os.path.join(root, "README.md")) else []
    docs = glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True)
    return found + sorted(os.path.relpath(p, root) for p in docs)


@dataclasses.dataclass(frozen=True)
class Block:
    name: str
    start: int  # index of the start marker's line
    end: int  # index of the end marker's line


def blocks(lines: Sequence[str], page: str = "page") -> list[Block]:
    """The table blocks of a page's lines; markers inside fenced code are text."""
    found, open_at, name, fence = [], None, None, None
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if m and open_at is None:
            fence = m[1] if fence is None else (None if m[1] == fence else fence)
            continue
        if fence:
            continue
        start = START.match(line)
        if start:
            if open_at is not None:
                raise TableError(
                    f"{page}:{i + 1}: table {start[1]} starts inside table {name} (line {open_at + 1})"
                )
            open_at, name = i, start[1]
        elif END.match(line):
            if open_at is None:
                raise TableError(f"{page}:{i + 1}: <!-- /table --> with no table started")
            found.append(Block(name, open_at, i))
            open_at = None
    if open_at is not None:
        raise TableError(f"{page}:{open_at + 1}: table {name} has no <!-- /table --> line")
    return found


def body(table: str) -> list[str]:
    """A block's lines between its markers: the table, then a blank line (the start marker's line is
    a whole HTML comment, so the table may follow it directly)."""
    return [*(line + "\n" for line in table.split("\n")), "\n"]


def update(root: str, check: bool = False) -> tuple[list[str], list[str]]:
    """Rewrite every block of every page from the reports (with check: only compare).

    Returns (blocks rewritten or, with check, stale; problems: unknown names, unreadable pages).
    """
    changed, problems, cache = [], [], {}
    for page in pages(root):
        path = os.path.join(root, page)
        with open(path) as f:
            lines = f.readlines()
        try:
            found = blocks(lines, page)
        except TableError as e:
            problems.append(str(e))
            continue
        out, last = [], 0
        for block in found:
            out += lines[last : block.start + 1]
            last = block.end
            if block.name not in TABLES:
                problems.append(
                    f"{page}:{block.start + 1}: unknown table {block.name!r} (known: {', '.join(TABLES)})"
                )
                out += lines[block.start + 1 : block.end]
                continue
            if block.name not in cache:
                cache[block.name] = body(render(block.name, root))
            new = cache[block.name]
            if lines[block.start + 1 : block.end] != new:
                changed.append(f"{page}:{block.start + 1}: table {block.name}")
            out += new
        out += lines[last:]
        if not check and out != lines:
            with open(path, "w") as f:
                f.writelines(out)
    return changed, problems
