"""The plan as a table and as JSON: the prediction with its range, its bottleneck, and the changes ranked;
and the docs' tables of the published runs as the planner predicts them (`calibration_table`)."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence

from disttrain.plan import advice, cost, interval, measured, published, runs, transports

_PUBLISHED = "the published spread (docs/planner.md); --link_file for your own links"


def _mb(x: float) -> str:
    return f"{x / 1e6:.1f} MB"


def _range(iv: interval.Interval) -> str:
    low, middle, high = iv.efficiencies
    return f"{middle:.3f} (low {low:.3f}, high {high:.3f})"


def table(
    iv: interval.Interval, model: cost.Model, ranked: Sequence[advice.Change], top: int = 8, links: str = ""
) -> str:
    """The prediction with its range and the best `top` changes by their low end, for the console.

    links: where the transport's constants came from when not the published
    spread (a measured link file).
    """
    p = iv.middle
    busiest = p.busiest_link
    dense, rows = cost.moved_bytes(model, p.strategy)
    summed = (
        f" (the strategy sums its tables of at most {p.strategy.densify_below_bytes:,} bytes whole: "
        f"{_mb(dense)} dense + {_mb(rows)} of rows per step)"
        if (dense, rows) != (model.dense_bytes, model.sparse_bytes)
        else ""
    )
    lines = [
        f"model: {model.name}, {_mb(model.dense_bytes)} dense"
        + (f" + {_mb(model.sparse_bytes)} of rows per step" if model.sparse_bytes else "")
        + summed
        + f", batch {model.batch_size} per GPU, one GPU step {model.step_time * 1e3:.1f} ms",
        f"cluster: {p.shape.describe()} ({p.shape.workers} worker(s), {p.shape.gpus} GPU(s))",
        f"strategy: {p.strategy.describe()}",
        f"transport constants: {links or _PUBLISHED}",
        "",
        f"  bytes per round on the busiest link  {_mb(busiest.bytes_per_round)} each way "
        f"(host {busiest.host}: {busiest.roles})",
        f"  bytes per round on the average link  {_mb(p.mean_link_bytes)} each way",
        f"  PS balance (busiest / mean)          {p.ps_balance:.2f}"
        if p.ps_balance is not None
        else "  PS balance                           - (no PS)",
        f"  predicted round time                 {p.round_time * 1e3:.1f} ms (one step of every worker)",
        f"  predicted throughput                 {p.examples_per_sec:.1f} examples/s "
        f"({iv.low.examples_per_sec:.1f}-{iv.high.examples_per_sec:.1f}; "
        f"{p.replica_steps_per_sec:.2f} batches/s)",
        f"  scaling efficiency vs N x one GPU    {_range(iv)}",
        f"  width of the range from              {iv.driver or 'nothing (no constant moves it by 0.001)'}",
        f"  bottleneck                           {p.bottleneck}"
        + (f" (low end: {iv.low.bottleneck})" if iv.low.bottleneck != p.bottleneck else ""),
        "  time terms per round (s)             "
        + ", ".join(f"{k} {v:.3f}" for k, v in p.terms.items() if v),
        "",
        "what to change, ranked by the low end of its range (gain of the middle, then of the low end):",
    ]
    shown = [c for c in ranked if c.low_gain > 1.005 or c.gain > 1.005][:top]
    for c in shown:
        lines.append(
            f"  {c.gain:5.2f}x ({c.low_gain:.2f}x)  {c.what}: "
            f"{c.prediction.examples_per_sec:.1f} examples/s, efficiency {_range(c.interval)}, "
            f"bottleneck {c.prediction.bottleneck}"
        )
    if not shown:
        lines.append(
            "  nothing predicted to gain more than 0.5%: "
            + ("compute-bound" if p.bottleneck == "compute" else "the layout is as good as these changes")
        )
    return "\n".join(lines)


def as_json(iv: interval.Interval, model: cost.Model, ranked: Sequence[advice.Change]) -> dict:
    """Everything in `table`, and every change (those that lose too), as a JSON-ready dict."""
    return {
        "model": {
            "name": model.name,
            "dense_bytes": model.dense_bytes,
            "sparse_bytes_per_step": model.sparse_bytes,
            "tensors": model.tensors,
            "batch_size": model.batch_size,
            "step_time_seconds": model.step_time,
        },
        "prediction": iv.middle.as_dict() | {"interval": iv.as_dict()},
        "changes": [
            {
                "change": c.what,
                "gain": c.gain,
                "low_gain": c.low_gain,
                "examples_per_sec": c.prediction.examples_per_sec,
                "scaling_efficiency": c.prediction.efficiency,
                "interval": c.interval.as_dict(),
                "bottleneck": c.prediction.bottleneck,
                "cluster": c.prediction.as_dict()["cluster"],
                "strategy": c.prediction.as_dict()["strategy"],
            }
            for c in ranked
        ],
    }


# ---- the docs' tables: the published runs as the planner predicts them now --------------------------

TABLE_SPLITS = {
    "plan_calibration": runs.CALIBRATION,
    "plan_held_out": runs.HELD_OUT,
    "plan_cloud_tcp": runs.CLOUD_TCP,
    "plan_nccl_rings": runs.RING,
    "plan_pcie_rings": runs.PCIE_RINGS,
}
_COMPUTED = (
    "computed by the planner from the runs in disttrain/plan/data/ "
    "(`disttrain-plan --published` prints the same with every source)"
)


def load_config(gin_files, bindings):
    """The zoo's config from gin, as `disttrain-plan` parses it (the edge's parser, imported only here)."""
    from disttrain.edges import cli

    return cli.fresh_train_config(gin_files, bindings)


@functools.cache
def published_results() -> tuple[published.Result, ...]:
    """Every published run predicted (TensorFlow builds each zoo model once), cached for the tables."""
    return tuple(published.predict_all(load_config))


def _markdown(header: Sequence[str], body: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in body])


def _short(bottleneck: str) -> str:
    """'CPU of PS 0' from 'CPU of PS 0: gRPC bytes ...'; 'link of host 0' from 'link of host 0 (...) ...'."""
    head = re.sub(r" \([^)]*\)", "", bottleneck.split(":")[0])
    return head.replace(" in the step's path", "")


def _tags(results: Sequence[published.Result]) -> dict[str, str]:
    return {s: chr(ord("A") + i) for i, s in enumerate(dict.fromkeys(r.case.source for r in results))}


def _files(split: str) -> dict[str, tuple[str, str, str]]:
    """citation -> (file, table key, the file's title) of every table in `split`."""
    found = {}
    for name in runs.set_info(split)["files"]:
        doc = runs.source_file(name)
        for t in doc["tables"]:
            if t["set"] == split:
                found[t["citation"]] = (name + ".json", t["key"], doc["source"])
    return found


def _layout(c: runs.Case) -> str:
    if c.ps:
        return f"{c.ps} PS"
    bucket = c.strategy.bucket_bytes
    return "ring, per tensor" if bucket <= 1 else f"ring, {bucket / 2**20:g} MiB buckets"


def _misses(r: published.Result) -> bool:
    return not r.inside or abs(r.error) > 0.25


_SET_HEADER = (
    "src",
    "model",
    "GPUs",
    "hosts x GPUs",
    "layout",
    "workers",
    "transport",
    "Gbit/s",
    "batch",
    "vs",
    "published",
    "low",
    "middle",
    "high",
    "inside",
    "error",
    "bottleneck (middle)",
)


def _set_row(r: published.Result, tag: str) -> tuple:
    c = r.case
    low, middle, high = r.predicted
    return (
        tag,
        c.model + (" (ps_cores fitted)" if c.calibrated else ""),
        c.gpus,
        f"{c.hosts}x{c.shape['gpus_per_host']}",
        _layout(c),
        "towers" if c.shape["towers"] else "per GPU",
        c.transport,
        f"{c.shape['link_gbit']:g}",
        c.batch_size,
        "host" if c.one_host_images_per_sec is not None else "GPU",
        f"{c.published_efficiency:.3f}",
        f"{low:.3f}",
        f"{middle:.3f}",
        f"{high:.3f}",
        "yes" if r.inside else "**no**",
        f"{100 * r.error:+.0f}%",
        _short(r.prediction.bottleneck),
    )


def _explained(rows: Sequence[published.Result], tags: dict[str, str]) -> list[str]:
    """A line per reason the data gives, naming the rows it explains that miss now."""
    missed: dict[str, dict[tuple[str, str], list[published.Result]]] = {}
    for r in rows:
        if r.case.why and _misses(r):
            missed.setdefault(r.case.why, {}).setdefault((tags[r.case.source], r.case.model), []).append(r)
    if not missed:
        return []
    lines = ["", "Rows outside the range or off by more than 25%, as the data explains them:", ""]
    for why, where in missed.items():
        found = [
            f"[{tag}] {model} at {', '.join(str(r.case.gpus) for r in rs)} GPUs "
            f"({', '.join(f'{100 * r.error:+.0f}%' for r in rs)})"
            for (tag, model), rs in where.items()
        ]
        lines.append(f"- {'; '.join(found)}: {why}.")
    return lines


def set_table(split: str, results: Sequence[published.Result] | None = None) -> str:
    """One set's runs as markdown: published against low, middle and high, the error, and the sources."""
    results = published_results() if results is None else results
    tags, files = _tags(results), _files(split)
    rows = [r for r in results if r.case.split == split]
    sources = "; ".join(
        f"[{tags[c]}] `{files[c][0]}` ({files[c][1]})" for c in dict.fromkeys(r.case.source for r in rows)
    )
    lines = [
        _markdown(_SET_HEADER, [_set_row(r, tags[r.case.source]) for r in rows]),
        "",
        f"Sources, in disttrain/plan/data/: {sources}.",
        *_explained(rows, tags),
    ]
    return "\n".join(lines)


def summary_table(results: Sequence[published.Result] | None = None) -> str:
    """Each set's coverage and errors, and all held-out runs together, as markdown."""
    results = published_results() if results is None else results
    body = []
    groups = [(split, [r for r in results if r.case.split == split]) for split in runs.SPLITS]
    groups.append(("all held-out runs", [r for r in results if r.case.split in runs.HELD_OUT_SPLITS]))
    for name, rows in groups:
        s = published.summary(rows)
        body.append(
            (
                f"**{name}**" if name.startswith("all") else name,
                s.rows,
                f"{s.inside} ({_pct(s.inside, s.rows)})",
                f"{s.within_25} ({_pct(s.within_25, s.rows)})",
                s.within_15,
                f"{100 * s.median_abs_error:.0f}%",
                f"{100 * s.max_abs_error:.0f}%",
            )
        )
    header = (
        "set",
        "runs",
        "inside the range",
        "middle within 25%",
        "within 15%",
        "median \\|error\\|",
        "max",
    )
    note = f"*Error: the middle over the published efficiency, minus 1; {_COMPUTED}.*"
    return _markdown(header, body) + "\n\n" + note


def _pct(count: int, rows: int) -> str:
    return f"{100 * count / rows:.0f}%" if rows else "-"


def seed_table(results: Sequence[published.Result] | None = None) -> str:
    """The seed's 128-GPU cluster kept synchronous: TF's layout, disttrain's placement, towers, the advice."""
    results = published_results() if results is None else results
    body = []
    for r in results:
        if r.case.source != runs.SEED or r.case.calibrated:
            continue
        same, best, steps = published.seed_answer(r)
        shape = dataclasses.replace(r.prediction.shape, towers=True)
        placed = dataclasses.replace(r.prediction.strategy, placement=cost.DISTTRAIN)
        towers = cost.predict(r.model, shape, placed)
        body.append(
            (
                r.case.model,
                f"{r.case.published_efficiency:.3f}",
                f"{r.prediction.efficiency:.3f}",
                f"{same.efficiency:.3f}",
                f"{towers.efficiency:.3f} ({_short(towers.bottleneck)})",
                f"{best.middle.efficiency:.3f} ({best.low.efficiency:.3f}-{best.high.efficiency:.3f}), "
                f"{best.middle.examples_per_sec:.0f} img/s: "
                + ("towers, " if best.middle.shape.towers else "")
                + best.middle.strategy.describe(),
            )
        )
    header = (
        "model",
        "published (TF's layout)",
        "predicted, TF's layout",
        "disttrain's placement, same layout",
        "+ a worker per host with towers",
        "recommended (low-high)",
    )
    return _markdown(header, body) + f"\n\n*Scaling efficiency against 128 x one K80; {_COMPUTED}.*"


def _value(field: str, value: float) -> str:
    if field == transports.LINK_SHARE:
        return f"{value:.2f}"
    if field == transports.CPU_PER_BYTE:
        return f"{value * 1e9:.2f} ms"
    if field == transports.PS_CORES:
        return f"{value:.2f}"
    return f"{value * 1e3:.2f} ms" if value >= 2e-4 else f"{value * 1e6:.1f} us"


_FIELD_NAMES = {
    transports.LINK_SHARE: "share of the link",
    transports.PER_MESSAGE: "per message or ring hop",
    transports.CPU_PER_BYTE: "CPU per MB, each end",
    transports.PS_CORES: "PS process ceiling, cores (PS layouts)",
}


def spreads_table() -> str:
    """Each transport constant's middle, its two ends and the environments found, from `transports`."""
    body = []
    for name, spread in transports.SPREADS.items():
        for field in transports.FIELDS:
            middle = spread.ps_cores if field == transports.PS_CORES else getattr(spread.transport, field)
            points = spread.points.get(field, ())
            if not middle and not points or (field == transports.PS_CORES and name != cost.GRPC):
                continue  # nothing to show: no constant (NCCL's CPU per MB is 0) and no spread
            low, high = sorted(spread.bounds(field))
            found = [_value(field, p.value) for p in points if not p.fitted]
            fitted = [_value(field, p.value) for p in points if p.fitted]
            body.append(
                (
                    f"`{name}` {_FIELD_NAMES[field]}",
                    _value(field, middle),
                    f"{_value(field, low)}-{_value(field, high)}" if points else "-",
                    ", ".join(found) or "-",
                    ", ".join(fitted) or "-",
                )
            )
    header = ("transport, constant", "middle", "low-high", "published or measured", "fitted (calibration)")
    return (
        _markdown(header, body)
        + "\n\n*From disttrain/plan/transports.py, which quotes each point's source; fitted: where one "
        "calibration source's rows have a median error of zero (`plan.calibrate`).*"
    )


def emulated_table() -> str:
    """The benchmark runs on emulated hosts of `data/benchmark_emulated_hosts.json`, predicted again."""
    doc = measured.recorded()
    checks = measured.recorded_checks(load_config)
    body = []
    for r, c in zip(doc["runs"], checks, strict=True):
        low, high = c.predicted_range
        layout = f"{r['ps']} PS {r['layout']}" if r["ps"] else "ring"
        body.append(
            (
                f"{r['model']} b{r['batch_size']}",
                r["strategy"] + (" overlap" if c.prediction.strategy.overlap else ""),
                r["workers"],
                layout,
                f"{r['link_mbit']:g}",
                f"{r['reference_cpu_ms']:g}",
                f"{r['other_busy_cores']:.2f}",
                f"{c.measured:.3f}",
                f"{c.predicted:.3f} ({low:.3f}-{high:.3f})",
                "yes" if low <= c.measured <= high else "**no**",
                f"{100 * c.error:+.0f}%",
                _short(c.prediction.bottleneck),
            )
        )
    header = (
        "model",
        "strategy",
        "worker hosts",
        "PS",
        "Mbit/s",
        "C, ms",
        "others' cores",
        "measured steps/s",
        "predicted (low-high)",
        "inside",
        "error",
        "bottleneck",
    )
    errors = sorted(abs(c.error) for c in checks)
    within = sum(e <= 0.15 for e in errors)
    note = (
        f"*{doc['source']}; {within} of {len(checks)} within 15%. C: one process's CPU seconds per step, "
        "the step the planner takes; others' cores: what other processes kept busy on the machine during the "
        "run. From `disttrain/plan/data/benchmark_emulated_hosts.json`, predicted again by the planner.*"
    )
    return _markdown(header, body) + "\n\n" + note


# The seed's cluster as it ran, the guide's example (docs/planner.md gives the same command line).
EXAMPLE_COMMAND = (
    "disttrain-plan --gin_file=inception_v3_sync.gin --gin_param=TrainConfig.batch_size=32 \\\n"
    "    --hosts=8 --gpus_per_host=16 --notowers --ps=8 --link_gbit=20 --placement=round_robin "
    "--step_time_ms=1826 --top=4"
)


def example() -> str:
    """What `EXAMPLE_COMMAND` prints, as a fenced block (the same steps as `disttrain-plan`'s)."""
    from disttrain.plan import models  # TensorFlow: only when the example is built

    config = load_config(["inception_v3_sync.gin"], ["TrainConfig.batch_size=32"])
    strategy = models.strategy_from_config(config, cost.SYNC_PS, cost.ROUND_ROBIN)
    shape = cost.Shape(
        hosts=8, gpus_per_host=16, towers=False, ps=8, link_gbit=20.0, host_bus=transports.PCIE
    )
    model = models.model_from_config(config, 1.826)
    iv = interval.predict(model, shape, strategy)
    ranked = advice.changes(model, shape, strategy, cost.DEFAULTS, iv, transports.SPREADS)
    return "```\n" + EXAMPLE_COMMAND + "\n```\n\nprints:\n\n```\n" + table(iv, model, ranked, top=4) + "\n```"


def calibration_table(name: str) -> str:
    """The docs' table `name` as markdown: one of `TABLE_NAMES` (a set's runs, their summary, the seed's
    cluster answered, the transports' spreads)."""
    if name == "plan_summary":
        return summary_table()
    if name == "plan_seed":
        return seed_table()
    if name == "plan_spreads":
        return spreads_table()
    if name == "plan_example":
        return example()
    if name == "plan_emulated":
        return emulated_table()
    if name in TABLE_SPLITS:
        return set_table(TABLE_SPLITS[name])
    raise KeyError(f"no planner table {name!r}: expected one of {', '.join(TABLE_NAMES)}")


TABLE_NAMES = ("plan_example", "plan_spreads", "plan_summary", *TABLE_SPLITS, "plan_seed", "plan_emulated")
