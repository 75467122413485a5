"""A prediction as a range: the least and most favourable environment of its transport, the planner's own
error, and the middle.

`predict` runs the cost model three times: with every constant of the
strategy's transport at its middle (`cost.predict` as it is), at its
pessimistic end, and at its optimistic end (`transports.Spread`). It then
moves each constant alone from one end to the other and names the one that
moves the efficiency most: what drives the width. The spread's ends are
the environments found: a cluster whose links fall outside them can land
outside too (measure the links: `plan.links`).

`Constants.ps_cores`, the PS process's ceiling, is spread beside gRPC's
constants (`transports.PS_CORES`): it moves only layouts with a PS. What it
does not spread: the shape's own inputs (link rate, latency, one GPU's
step), the host bus, and the strategy's own settings (bucket size, placement).

The planner's own error widens the range too (`MODEL_ERROR`): what the
model leaves out (stragglers, input pipelines, a framework's own overhead,
a published run's noise) moves a run whatever its transport. Its size is
the planner's error on its calibration runs, by split conformal prediction:
of n runs no constant was fitted to, the ceil((n + 1) x 0.8)-th smallest
|middle / published - 1|, so that about 80% of runs like them fall inside
(tests/unit/test_plan.py recomputes it). Each end is the farther of the
transport's end and the middle moved by that error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from disttrain.plan import cost, transports

NEGLIGIBLE = 1e-3  # a constant that moves the efficiency less than this drives nothing
COVERAGE = 0.8  # the share of runs the range is meant to hold
# The planner's error on its calibration runs: conformal_error of the 18 it fitted nothing to (their 16th
# smallest |error|: the seed's 128-GPU Inception-v3, -22%); test_plan recomputes it.
MODEL_ERROR = 0.222


def conformal_error(errors: Sequence[float], coverage: float = COVERAGE) -> float:
    """The ceil((n + 1) x coverage)-th smallest of n |errors| (split conformal prediction)."""
    ranked = sorted(abs(e) for e in errors)
    if not ranked:
        raise ValueError("no errors to take a quantile of")
    return ranked[min(math.ceil((len(ranked) + 1) * coverage), len(ranked)) - 1]


def widen(efficiencies: tuple[float, float, float], error: float) -> tuple[float, float, float]:
    """(low, middle, high) with each end at least `error` of the middle away: |middle / x - 1| = error.

    The high end moved by the error stops at 1 (linear scaling), or at the middle if that is above 1.
    """
    low, middle, high = efficiencies
    return min(low, middle / (1 + error)), middle, max(high, min(middle / (1 - error), max(1.0, middle)))


def _scaled(p: cost.Prediction, factor: float) -> cost.Prediction:
    """The prediction with its throughput times `factor` (its bottleneck and bytes unchanged)."""
    return dataclasses.replace(
        p,
        round_time=p.round_time / factor,
        examples_per_sec=p.examples_per_sec * factor,
        replica_steps_per_sec=p.replica_steps_per_sec * factor,
        efficiency=p.efficiency * factor,
    )


def model_error_label(error: float) -> str:
    return f"the planner's own error on its calibration runs, {100 * error:.0f}%"


_LABELS = {
    transports.LINK_SHARE: "link share",
    transports.PER_MESSAGE: "cost per message or hop",
    transports.CPU_PER_BYTE: "CPU per MB",
    transports.PS_CORES: "PS process ceiling",
}


def _value(field: str, value: float) -> str:
    if field == transports.LINK_SHARE:
        return f"{value:.2f}"
    if field == transports.CPU_PER_BYTE:
        return f"{value * 1e9:.2f} ms"  # seconds per byte -> ms per MB
    if field == transports.PS_CORES:
        return f"{value:.2f} cores"
    return f"{value * 1e6:.1f} us" if value < 1e-3 else f"{value * 1e3:.2f} ms"


def describe(spread: transports.Spread, field: str) -> str:
    """'nccl_tcp link share 0.21-0.98': the constant and its two ends."""
    pessimistic, optimistic = spread.bounds(field)
    low, high = sorted((pessimistic, optimistic))
    return f"{spread.transport.name} {_LABELS[field]} {_value(field, low)}-{_value(field, high)}"


@dataclasses.dataclass(frozen=True)
class Interval:
    """Three predictions of one layout, and the constant that drives the distance between them.

    driver: "" when nothing spreads (the transport has no spread, or no
    constant of it moves this layout's efficiency by `NEGLIGIBLE` or more).
    """

    low: cost.Prediction
    middle: cost.Prediction
    high: cost.Prediction
    driver: str

    @property
    def efficiencies(self) -> tuple[float, float, float]:
        return self.low.efficiency, self.middle.efficiency, self.high.efficiency

    def contains(self, efficiency: float) -> bool:
        return self.low.efficiency <= efficiency <= self.high.efficiency

    def as_dict(self) -> dict:
        return {
            "low": self.low.efficiency,
            "middle": self.middle.efficiency,
            "high": self.high.efficiency,
            "low_examples_per_sec": self.low.examples_per_sec,
            "high_examples_per_sec": self.high.examples_per_sec,
            "width_from": self.driver,
        }


def spread_of(strategy: cost.Strategy, spreads: Mapping[str, transports.Spread]) -> transports.Spread | None:
    """The spread of the strategy's transport (gRPC when it names none), None if there is none."""
    name = strategy.transport.name if strategy.transport is not None else cost.GRPC
    return spreads.get(name)


def _grpc(constants: cost.Constants) -> cost.Transport:
    """gRPC as `constants` hold it (a strategy with no transport uses them)."""
    return cost.Transport(cost.GRPC, constants.goodput, constants.per_message_s, constants.rpc_cpu_s_per_byte)


def _with(strategy: cost.Strategy, transport: cost.Transport) -> cost.Strategy:
    return dataclasses.replace(strategy, transport=transport)


def predict(
    model: cost.Model,
    shape: cost.Shape,
    strategy: cost.Strategy,
    spreads: Mapping[str, transports.Spread] = transports.SPREADS,
    constants: cost.Constants = cost.DEFAULTS,
    error: float | None = None,
) -> Interval:
    """The layout at the pessimistic, middle and optimistic ends of its transport's spread.

    error: the planner's own error that widens both ends (`MODEL_ERROR` when None; 0: the spread alone).
    """
    return with_error(
        _spread(model, shape, strategy, spreads, constants), MODEL_ERROR if error is None else error
    )


def with_error(iv: Interval, error: float) -> Interval:
    """`iv` with each end at least `error` of the middle away.

    The driver names the error where its width exceeds the spread's; otherwise the spread's constant,
    and which end the error moved, if any.
    """
    if not error or iv.middle.efficiency <= 0:
        return iv
    ends = widen((iv.middle.efficiency,) * 3, error)
    own_low, own_high = _scaled(iv.middle, ends[0] / ends[1]), _scaled(iv.middle, ends[2] / ends[1])
    low = min(iv.low, own_low, key=lambda p: p.efficiency)
    high = max(iv.high, own_high, key=lambda p: p.efficiency)
    if ends[2] - ends[0] > iv.high.efficiency - iv.low.efficiency or not iv.driver:
        return Interval(low, iv.middle, high, model_error_label(error))
    moved = [name for name, end, own in (("low", low, own_low), ("high", high, own_high)) if end is own]
    also = f"; the {' and '.join(moved)} end from {model_error_label(error)}" if moved else ""
    return Interval(low, iv.middle, high, iv.driver + also)


def _spread(model, shape, strategy, spreads, constants) -> Interval:
    middle = cost.predict(model, shape, strategy, constants)
    spread = spread_of(strategy, spreads)
    if spread is None:
        return Interval(middle, middle, middle, "")
    # The ends are the spread's; the middle stays the strategy's own (or, for gRPC, the constants'), and
    # the PS ceiling's middle the constants'.
    spread = dataclasses.replace(
        spread, transport=strategy.transport or _grpc(constants), ps_cores=constants.ps_cores
    )

    def run(end: str, fields=transports.FIELDS) -> cost.Prediction:
        moved = _with(strategy, spread.at(end, fields))
        return cost.predict(model, shape, moved, spread.constants_at(end, constants, fields))

    worst = run(transports.PESSIMISTIC)
    best = run(transports.OPTIMISTIC)
    widths = {}
    for field in transports.FIELDS:
        if spread.spreads(field):
            one_best = run(transports.OPTIMISTIC, (field,))
            one_worst = run(transports.PESSIMISTIC, (field,))
            widths[field] = one_best.efficiency - one_worst.efficiency
    moving = {f: w for f, w in widths.items() if w >= NEGLIGIBLE}
    driver = describe(spread, max(moving, key=moving.get)) if moving else ""
    low = min(worst, middle, key=lambda p: p.efficiency)
    high = max(best, middle, key=lambda p: p.efficiency)
    return Interval(low, middle, high, driver)
