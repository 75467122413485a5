"""A prediction as a range: the least and most favourable environment of its transport, and the middle.

`predict` runs the cost model three times: with every constant of the
strategy's transport at its middle (`cost.predict` as it is), at its
pessimistic end, and at its optimistic end (`transports.Spread`). It then
moves each constant alone from one end to the other and names the one that
moves the efficiency most: what drives the width. The ends are the
environments found, not a statistical interval: a cluster whose links fall
outside them can land outside too (measure the links: `plan.links`).

`Constants.ps_cores`, the PS process's ceiling, is spread beside gRPC's
constants (`transports.PS_CORES`): it moves only layouts with a PS. What it
does not spread: the shape's own inputs (link rate, latency, one GPU's
step), the host bus, and the strategy's own settings (bucket size, placement).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from disttrain.plan import cost, transports

NEGLIGIBLE = 1e-3  # a constant that moves the efficiency less than this drives nothing

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
) -> Interval:
    """The layout at the pessimistic, middle and optimistic ends of its transport's spread."""
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
