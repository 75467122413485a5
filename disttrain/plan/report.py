"""The plan as a table and as JSON: the prediction with its range, its bottleneck, and the changes ranked."""

from __future__ import annotations

from collections.abc import Sequence

from disttrain.plan import advice, cost, interval

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
