"""The benchmark's report as a table, a JSON file and a plot.

The report is the dict `bench.runner.Benchmark.run()` returns; nothing here
measures anything. matplotlib (the `bench` extra) is imported only to plot.
"""

from __future__ import annotations

import json
import os

COLUMNS = (  # (header, key or function of a row, format)
    ("system", "system", "{}"),
    ("strategy", "strategy", "{}"),
    ("N", "workers", "{}"),
    ("P", "ps", "{}"),
    ("layout", "layout", "{}"),
    ("steps/s", "steps_per_sec", "{:.2f}"),
    ("slowest", "min_worker_steps_per_sec", "{:.2f}"),
    ("counted", "counted_steps_per_sec", "{:.2f}"),
    ("ideal", "ideal_steps_per_sec", "{:.2f}"),
    ("alone", "alongside_steps_per_sec", "{:.2f}"),  # --host_cores: one process beside the run
    ("scaling", "scaling_efficiency", "{:.2f}"),
    ("bound", "bound_steps_per_sec", "{:.2f}"),
    ("by", "bound_limited_by", "{}"),
    ("vs bound", "efficiency_vs_bound", "{:.2f}"),
    ("max MB/st", "busiest_link_bytes_per_step", "MB"),
    ("min MB/st", "min_link_bytes_per_step", "MB"),
    ("exp MB/st", "expected_busiest_link_bytes_per_step", "MB"),
    ("PS max/mean", "ps_load_max_over_mean", "{:.2f}"),
    ("worker MB", "worker_peak_memory_mb", "{:.0f}"),
    ("others", "other_busy_cores", "{:.1f}"),
)
NOISY_CORES = 0.3  # other processes busier than this during a run: its figures are suspect


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    if fmt == "MB":
        return f"{value / 1e6:.1f}"
    return fmt.format(value)


def lookup_line(cfg: dict) -> str:
    """What a step moves of a model with embedding tables: D whole, R of the tables' rows."""
    return (
        f"per replica step: D {cfg['dense_bytes'] / 1e6:.1f} MB dense (whole), "
        f"R {cfg['sparse_bytes_per_step'] / 1e6:.2f} MB of table rows with their indices "
        f"({100 * cfg['table_fraction_per_step']:.2f}% of {cfg['table_bytes'] / 1e6:.1f} MB of tables), "
        "pulled and pushed; the bound and exp MB/st count these"
    )


def table(report: dict) -> str:
    """The runs as a fixed-width table, with the reference and the legend's essentials."""
    cfg = report["config"]
    ref = report.get("reference") or {}
    lines = []
    link = f" at {cfg['link_mbit']:g} Mbit/s" if cfg.get("link_mbit") else ""
    lines.append(
        f"{cfg['model']} ({cfg['model_bytes'] / 1e6:.1f} MB), batch {cfg['batch_size']}, "
        f"{cfg['network']}{link}, threads intra {cfg['intra_op_threads']} inter {cfg['inter_op_threads']}, "
        f"{cfg['cpus']} CPUs"
    )
    if cfg.get("sparse_bytes_per_step"):
        lines.append(lookup_line(cfg))
    if any(r.get("transfer_bytes_per_value") == 2 for r in report["runs"]):
        lines.append("disttrain sends floats in 16 bits (transfer_dtype): its bound and exp MB/st count so")
    if ref.get("steps_per_sec"):
        others = ref.get("other_busy_cores")
        lines.append(
            f"one process alone: {ref['steps_per_sec']:.2f} steps/s "
            f"({ref['examples_per_sec']:.1f} examples/s)"
            + (f", others {others:.1f}" if others is not None else "")
        )
    elif ref.get("error"):
        lines.append(f"one process alone: FAILED ({ref['error'].splitlines()[0]})")
    header = [h for h, _, _ in COLUMNS]
    rows = []
    for run in report["runs"]:
        rows.append([_cell(run, key, fmt) for _, key, fmt in COLUMNS])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines.append("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for run, r in zip(report["runs"], rows, strict=True):
        line = "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True))
        if run.get("error") or run.get("skipped"):
            line += "   " + (f"FAILED: {run['error']}" if run.get("error") else f"skipped: {run['skipped']}")
            line = line.splitlines()[0]
        lines.append(line)
    lines.append(
        "steps = batches of one replica; counted = N x slowest worker (async) or the cluster's rate (sync); "
        "ideal = N x one process; MB/st = link MB per global step; others = cores other processes used"
    )
    diverged = [r for r in report["runs"] if r.get("diverged")]
    if diverged:
        lines.append(
            f"warning: the loss rose tenfold in {len(diverged)} run(s) (N = "
            + ", ".join(str(r["workers"]) for r in diverged)
            + "): a diverged model's step time is not the model's; lower the learning rate"
        )
    noisy = [r for r in [ref, *report["runs"]] if (r.get("other_busy_cores") or 0) > NOISY_CORES]
    if noisy:
        lines.append(
            f"warning: other processes kept > {NOISY_CORES} cores busy during {len(noisy)} measurement(s) "
            "on this machine: re-run when it is quiet"
        )
    return "\n".join(lines)


def summary(report: dict) -> str:
    """A few closing lines: the best run per system and what failed."""
    lines = ["summary:"]
    best: dict[str, dict] = {}
    for run in report["runs"]:
        if run.get("error") or run.get("counted_steps_per_sec") is None:
            continue
        if (
            run["system"] not in best
            or run["counted_steps_per_sec"] > best[run["system"]]["counted_steps_per_sec"]
        ):
            best[run["system"]] = run
    for system, run in best.items():
        parts = [f"  {system}: best {run['counted_steps_per_sec']:.2f} counted steps/s at N={run['workers']}"]
        if run.get("scaling_efficiency") is not None:
            parts.append(f"scaling {run['scaling_efficiency']:.2f}")
        if run.get("efficiency_vs_bound") is not None:
            parts.append(f"{run['efficiency_vs_bound']:.2f} of the bound ({run['bound_limited_by']}-bound)")
        lines.append(", ".join(parts))
    failed = [r for r in report["runs"] if r.get("error")]
    if (report.get("reference") or {}).get("error"):
        lines.append(f"  reference FAILED: {report['reference']['error'].splitlines()[0]}")
    for run in failed:
        lines.append(
            f"  FAILED {run['system']} N={run['workers']} P={run['ps']}: {run['error'].splitlines()[0]}"
        )
    if len(lines) == 1:
        lines.append("  no run completed")
    return "\n".join(lines)


def write_json(report: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, path)


def plot(report: dict, path: str) -> str | None:
    """Throughput (examples/s counted) against workers, with the ideal and bound lines.

    Returns None, or a one-line reason if matplotlib is missing (`pip install .[bench]`).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed, so no plot was written: pip install 'disttrain[bench]' adds it"
    cfg = report["config"]
    batch = cfg["batch_size"]
    ref = (report.get("reference") or {}).get("steps_per_sec")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series, bounds = _plotted_points(report["runs"], batch)
    workers = sorted({r["workers"] for r in report["runs"]})
    _draw_lines(ax, series, bounds, workers, ref, batch)
    ax.set_title(_plot_title(cfg))
    ax.set_xlabel("workers")
    ax.set_ylabel("examples/s (async: N x slowest worker)")
    ax.set_xticks(workers or [1])
    measured = [y for points in series.values() for _, y in points] + [
        y for points in bounds.values() for _, y in points
    ]
    ideal = max(workers) * ref * batch if ref and workers else 0
    if measured and ideal > 5 * max(measured):
        ax.set_yscale("log")  # network-bound: the ideal line would flatten everything else
    else:
        ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # nothing to plot when every run failed
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _plotted_points(runs: list[dict], batch: int) -> tuple[dict[tuple, list], dict[tuple, list]]:
    """(workers, examples/s) counted per (system, strategy, PS, layout), and bound per (PS, layout)."""
    series: dict[tuple, list] = {}
    bounds: dict[tuple, list] = {}
    for run in runs:
        key = (run["system"], run["strategy"], run["ps"], run["layout"])
        if run.get("counted_steps_per_sec") is not None:
            series.setdefault(key, []).append((run["workers"], run["counted_steps_per_sec"] * batch))
        if run.get("bound_steps_per_sec") is not None:
            bounds.setdefault((run["ps"], run["layout"]), []).append(
                (run["workers"], run["bound_steps_per_sec"] * batch)
            )
    return series, bounds


def _draw_lines(ax, series: dict, bounds: dict, workers: list[int], ref: float | None, batch: int) -> None:
    """Draw on `ax` the measured lines, the bounds and, with a reference rate `ref`, the ideal."""
    for (system, strategy, ps, layout), points in sorted(series.items()):
        xs, ys = zip(*sorted(points), strict=True)
        name = f"{system} ({strategy}" + (f", {ps} PS {layout})" if ps else ", all-reduce)")
        ax.plot(xs, ys, marker="o", label=name)
    for (ps, layout), points in sorted(bounds.items()):
        xs, ys = zip(*sorted(set(points)), strict=True)
        ax.plot(
            xs,
            ys,
            linestyle=":",
            marker="_",
            markersize=14,
            color="grey",
            label=f"bound ({ps} PS {layout})" if ps else "bound (ring)",
        )
    if ref and workers:
        ax.plot(
            workers,
            [n * ref * batch for n in workers],
            linestyle="--",
            marker="_",
            markersize=14,
            color="black",
            label="ideal: N x one process",
        )


def _plot_title(cfg: dict) -> str:
    """The plot's title: model, batch, network and link, and D + R for a model with tables."""
    link = f", {cfg['link_mbit']:g} Mbit/s" if cfg.get("link_mbit") else ""
    rows = (
        f", D {cfg['dense_bytes'] / 1e6:.1f} MB + R {cfg['sparse_bytes_per_step'] / 1e6:.2f} MB/step"
        if cfg.get("sparse_bytes_per_step")
        else ""
    )
    return f"{cfg['model']} batch {cfg['batch_size']}, {cfg['network']}{link}{rows}"
