"""The spread the calibration set's own environments give each transport constant (and the PS ceiling).

Each calibration source ran in one environment. For a constant of a
transport, the value that environment implies is the one at which that
source's rows (those the constant moves) have a median error of zero: a fit
per environment, on calibration rows only: the value on a log grid over a
wide search range nearest a zero median error (an end of the range when the
rows come within `TOLERANCE` of zero only there: the environment is at least
that good, or bad). A source whose rows no value brings within `TOLERANCE`
implies nothing about that constant. The values found are stored as
points of the transport's spread (`transports.CALIBRATION_POINTS`), beside
the micro-benchmarks; `fit` recomputes them, and a test checks that the
stored ones still match. No held-out row is read here.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from disttrain.plan import cost, published, transports

# Where each constant is searched, and the smallest move of a row's efficiency that counts as moved.
_SEARCH = {
    transports.LINK_SHARE: (0.05, 1.0),
    transports.PER_MESSAGE: (1e-7, 1e-2),
    transports.CPU_PER_BYTE: (0.05e-9, 20e-9),
    # The PS process's ceiling: up to 32 cores, a p2.8xlarge's vCPUs (the smallest calibration host).
    transports.PS_CORES: (0.1, 32.0),
}
_MOVES = 0.01
# A source implies a value only where its rows' median error comes this close to zero.
TOLERANCE = 0.02


@dataclasses.dataclass(frozen=True)
class Fit:
    """A constant's value implied by one calibration source's rows."""

    transport: str
    field: str
    source: str
    value: float
    rows: int
    median_error: float  # at `value`: not 0 when no value in the search range reaches it


def _transport(case: published.Case) -> cost.Transport:
    return case.strategy.transport or transports.GRPC


def _efficiency(result: published.Result, field: str, value: float) -> float:
    case = result.case
    constants = cost.DEFAULTS
    if field == transports.PS_CORES:
        transport = _transport(case)
        constants = dataclasses.replace(constants, ps_cores=value)
    else:
        transport = dataclasses.replace(_transport(case), **{field: value})
    strategy = dataclasses.replace(case.strategy, transport=transport)
    shape = cost.Shape(hosts=case.hosts, ps=case.ps, **case.shape)
    return cost.predict(result.model, shape, strategy, constants).efficiency


def _median_error(rows: Sequence[published.Result], field: str, value: float) -> float:
    return statistics.median(_efficiency(r, field, value) / r.case.published_efficiency - 1 for r in rows)


def _solve(rows: Sequence[published.Result], field: str, steps: int = 97) -> tuple[float, float]:
    """(value, median error there): the value on a log grid over the search range nearest a zero median."""
    lo, hi = _SEARCH[field]
    grid = [lo * (hi / lo) ** (i / (steps - 1)) for i in range(steps)]
    errors = {v: _median_error(rows, field, v) for v in grid}
    best = min(grid, key=lambda v: abs(errors[v]))
    return best, errors[best]


def fit(results: Sequence[published.Result]) -> list[Fit]:
    """Every (transport, constant, calibration source) whose rows the constant moves, and its value."""
    calibration = [r for r in results if r.case.split == published.CALIBRATION and not r.case.calibrated]
    found = []
    for name in transports.TRANSPORTS:
        for field in transports.FIELDS:
            lo, hi = _SEARCH[field]
            for source in dict.fromkeys(r.case.source for r in calibration):
                rows = [
                    r
                    for r in calibration
                    if r.case.source == source
                    and _transport(r.case).name == name
                    and abs(_efficiency(r, field, lo) - _efficiency(r, field, hi)) > _MOVES
                ]
                if rows:
                    value, error = _solve(rows, field)
                    if abs(error) <= TOLERANCE:
                        found.append(Fit(name, field, source, value, len(rows), error))
    return found
