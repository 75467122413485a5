"""The published runs predicted from their published inputs: each split's errors and coverage, and tables.

The runs and their sources are data (`plan.runs`, read from `plan/data/`):
a calibration set, the only rows any constant was chosen or checked
against (`Constants.ps_cores` is fitted on the seed's one-host rows), and
four held-out sets, none used to choose anything: their errors and
coverage are computed here, not fitted or stored. Every row is predicted as
an interval (`plan.interval`) from the spread of its transport's published
environments (`plan.transports`), micro-benchmarks and vendor figures, not
any run here, and at least the planner's own error on the calibration rows
(`interval.MODEL_ERROR`).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

from disttrain.plan import advice, cost, interval, transports
from disttrain.plan.runs import (  # noqa: F401  the names callers import from here
    CALIBRATION,
    CALIBRATION_CASES,
    CASES,
    CLOUD_TCP,
    CLOUD_TCP_CASES,
    HELD_OUT,
    HELD_OUT_CASES,
    HELD_OUT_SPLITS,
    HOROVOD_16,
    HOROVOD_64,
    HOROVOD_SCALE,
    PCIE_RING_CASES,
    PCIE_RINGS,
    RING,
    RING_CASES,
    SEED,
    SPLITS,
    TF_BENCH_29,
    TF_CNN,
    Case,
)

# The transports and host buses, with their sources and spreads, live in `transports`; these names stay.
GRPC, NCCL_TCP, NCCL_RDMA = transports.GRPC, transports.NCCL_TCP, transports.NCCL_RDMA
TRANSPORTS, TRANSPORT_SOURCES = transports.TRANSPORTS, transports.TRANSPORT_SOURCES
PCIE, PCIE_TWO_ROOTS, NVLINK = transports.PCIE, transports.PCIE_TWO_ROOTS, transports.NVLINK
HOST_BUSES, HOST_BUS_SOURCES = transports.HOST_BUSES, transports.HOST_BUS_SOURCES


@dataclasses.dataclass(frozen=True)
class Result:
    """A case predicted: its interval, and the efficiencies in the case's own terms (low, middle, high).

    `predicted` is the interval's efficiencies, or, for a case scaled
    against one host, each over the same end's prediction for one host.
    """

    case: Case
    interval: interval.Interval
    predicted: tuple[float, float, float]
    bytes_only: cost.Prediction  # without the PS-process ceiling (Constants.ps_cores=None)
    model: cost.Model

    @property
    def prediction(self) -> cost.Prediction:
        return self.interval.middle

    @property
    def error(self) -> float:
        return self.predicted[1] / self.case.published_efficiency - 1

    @property
    def inside(self) -> bool:
        return self.predicted[0] <= self.case.published_efficiency <= self.predicted[2]


def predict_case(
    case: Case,
    model: cost.Model,
    constants: cost.Constants = cost.DEFAULTS,
    spreads=transports.SPREADS,
    error: float | None = None,
) -> Result:
    """error: the planner's own error (`interval.MODEL_ERROR` when None; 0: the spread alone)."""
    shape = cost.Shape(hosts=case.hosts, ps=case.ps, **case.shape)
    error = interval.MODEL_ERROR if error is None else error
    iv = interval.predict(model, shape, case.strategy, spreads, constants, error=0.0)
    predicted = iv.efficiencies
    if case.one_host_images_per_sec is not None:  # each end of the spread over the same end for one host
        one = interval.predict(
            model, dataclasses.replace(shape, hosts=1), case.strategy, spreads, constants, error=0.0
        )
        predicted = tuple(n / o for n, o in zip(predicted, one.efficiencies, strict=True))
    predicted = interval.widen(predicted, error)  # the planner's own error, in the case's terms
    iv = interval.with_error(iv, error)
    loose = cost.predict(model, shape, case.strategy, dataclasses.replace(constants, ps_cores=None))
    return Result(case, iv, predicted, loose, model)


def predict_all(load_config: Callable, cases=CASES) -> list[Result]:
    """Every case; `load_config(gin_files, bindings)` parses gin (the script's edge does it)."""
    from disttrain.plan import models  # TensorFlow: only when runs are predicted

    built: dict[tuple[tuple[str, ...], int], cost.Model] = {}
    out = []
    for case in cases:
        key = (case.gin_files, case.batch_size)
        if key not in built:
            config = load_config(list(case.gin_files), [f"TrainConfig.batch_size={case.batch_size}"])
            built[key] = models.model_from_config(config, 1.0, case.model)
        model = built[key].replace(step_time=case.batch_size / case.one_gpu_images_per_sec)
        out.append(predict_case(case, model))
    return out


@dataclasses.dataclass(frozen=True)
class Summary:
    """A split's errors and coverage, computed from its rows' predictions (never stored)."""

    rows: int
    median_abs_error: float
    max_abs_error: float
    within_15: int
    within_25: int
    inside: int  # published figure inside [low, high]


def summary(results: list[Result]) -> Summary:
    errors = [abs(r.error) for r in results]
    if not errors:
        return Summary(0, 0.0, 0.0, 0, 0, 0)
    return Summary(
        len(errors),
        statistics.median(errors),
        max(errors),
        sum(e <= 0.15 for e in errors),
        sum(e <= 0.25 for e in errors),
        sum(r.inside for r in results),
    )


def _summary_line(name: str, s: Summary) -> str:
    return (
        f"{name} ({s.rows} runs): inside the interval {s.inside} of {s.rows}; middle: median |error| "
        f"{100 * s.median_abs_error:.0f}%, max {100 * s.max_abs_error:.0f}%, {s.within_15} within 15%, "
        f"{s.within_25} within 25%"
    )


def _sources(results: list[Result]) -> list[str]:
    return list(dict.fromkeys(r.case.source for r in results))


def _row(r: Result, tags: dict[str, str]) -> str:
    c = r.case
    layout = f"{c.ps} PS" if c.ps else "ring"
    per = "towers" if c.shape["towers"] else "per GPU"
    low, middle, high = r.predicted
    versus = "host" if c.one_host_images_per_sec is not None else "GPU"
    return (
        f"[{tags[c.source]}] {c.model:12s} {c.gpus:4d} {c.hosts:3d}x{c.shape['gpus_per_host']:<2d} "
        f"{layout:5s} {per:7s} {c.transport:9s} {c.shape['link_gbit']:5g} {c.batch_size:5d} {versus:4s} "
        f"{c.published_efficiency:9.3f} {low:6.3f} {middle:6.3f} {high:6.3f} "
        f"{'yes' if r.inside else 'NO':>3s} {100 * r.error:+6.0f}%  {r.prediction.bottleneck}"
        + (f"; width: {r.interval.driver}" if r.interval.driver else "")
        + ("  (ps_cores fitted here)" if c.calibrated else "")
    )


def table(results: list[Result]) -> str:
    """Each split apart with its coverage and errors, all held-out runs together, then every source."""
    tags = {source: chr(ord("A") + i) for i, source in enumerate(_sources(results))}
    header = (
        f"{'src':3s} {'model':12s} {'GPUs':>4s} {'hosts':>6s} {'layout':5s} {'workers':7s} {'transport':9s} "
        f"{'Gbit':>5s} {'batch':>5s} {'vs':4s} {'published':>9s} {'low':>6s} {'middle':>6s} {'high':>6s} "
        f"{'in?':>3s} {'error':>7s}  bottleneck (middle); what drives the width"
    )
    lines = []
    for split in SPLITS:
        rows = [r for r in results if r.case.split == split]
        if rows:
            lines += [
                _summary_line(f"{split} set", summary(rows)),
                header,
                *(_row(r, tags) for r in rows),
                "",
            ]
    held = [r for r in results if r.case.split in HELD_OUT_SPLITS]
    if held:
        s = summary(held)
        lines += [
            _summary_line("all held-out runs", s)
            + f" (inside: {_pct(s.inside, s.rows)}, middle within 25%: {_pct(s.within_25, s.rows)};"
            " the targets: 80% each)",
            "",
        ]
    lines.append(
        "efficiency: images/s over GPUs x one GPU's published rate (vs GPU), or over hosts x one host's "
        "(vs host), or as published; low and high: the transport's constants at their least and most "
        "favourable published environment, or the middle moved by the planner's own error on its calibration "
        f"runs ({100 * interval.MODEL_ERROR:.0f}%), whichever is farther (docs/planner.md)"
    )
    lines.append("sources:")
    lines += [f"  [{tag}] {source}" for source, tag in tags.items()]
    lines.append("transports and host buses:")
    lines += [f"  {name}: {source}" for name, source in TRANSPORT_SOURCES.items()]
    lines += [f"  {name}: {source}" for name, source in HOST_BUS_SOURCES.items()]
    return "\n".join(lines)


def _pct(count: int, rows: int) -> str:
    return f"{100 * count / rows:.0f}%" if rows else "-"


def seed_answer(result: Result) -> tuple[cost.Prediction, interval.Interval, list[str]]:
    """The seed's cluster with disttrain: its placement alone, then the best changes one after another.

    Returns (the same layout with disttrain's placement, the recommended layout's interval, the changes).
    """
    strategy = dataclasses.replace(result.prediction.strategy, placement=cost.DISTTRAIN)
    same = cost.predict(result.model, result.prediction.shape, strategy)
    best, steps = advice.best_layout(result.model, result.prediction.shape, strategy)
    return same, best, steps


def answers_table(results: list[Result]) -> str:
    """The seed's 128-GPU cases with disttrain: the same layout, a PS layout with towers, the best one."""
    lines = ["the seed's cluster with disttrain (predicted efficiency, synchronous as the seed ran):"]
    for r in results:
        if r.case.source != SEED or r.case.calibrated:
            continue
        same, best, steps = seed_answer(r)
        shape = dataclasses.replace(r.prediction.shape, towers=True)
        towers = cost.predict(
            r.model, shape, dataclasses.replace(r.prediction.strategy, placement=cost.DISTTRAIN)
        )
        lines.append(
            f"  {r.case.model:13s} TF default {r.prediction.efficiency:.3f}; disttrain's placement alone "
            f"{same.efficiency:.3f}; + towers (sync PS, {shape.ps} PS) {towers.efficiency:.3f}; "
            f"recommended {best.middle.efficiency:.3f} ({best.middle.examples_per_sec:.0f} img/s; "
            f"{best.low.efficiency:.3f}-{best.high.efficiency:.3f}): "
            + "; ".join(steps)
            + f" -> {best.middle.strategy.describe()}, bottleneck {best.middle.bottleneck}"
        )
    return "\n".join(lines)
