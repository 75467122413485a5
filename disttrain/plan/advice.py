"""What to change: every one-step variation of a cluster and strategy, predicted and ranked.

Each change is predicted by the same cost model as an interval
(`interval.predict`: its transport's least, middle and most favourable
environment) and ranked by the low end of its examples/sec: where two
ranges overlap, the one that is better in the worse environment comes
first (and a range wholly above another has the higher low end anyway).
With no spread, the low end is the middle. A change that needs more
hosts (dedicated PS) says so; a bigger batch assumes a step's compute grows
linearly with the batch, and changes the optimisation (a larger global batch
needs its learning rate scaled), which the planner cannot judge.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from disttrain.plan import cost, interval, transports

BATCH_CHANGE = "twice the batch per GPU"


@dataclasses.dataclass(frozen=True)
class Change:
    """One variation: what it is, and its prediction (the interval's middle)."""

    what: str
    interval: interval.Interval
    gain: float  # middle examples/sec over the current layout's middle
    low_gain: float  # low end over the current layout's low end: what the ranking sorts by

    @property
    def prediction(self) -> cost.Prediction:
        return self.interval.middle


def _variations(model: cost.Model, shape: cost.Shape, strategy: cost.Strategy):
    """(description, model, shape, strategy) for each one-step change that makes sense here."""
    if strategy.uses_ps:
        yield from _ps_layout_variations(model, shape, strategy)
        yield from _ps_strategy_variations(model, shape, strategy)
    else:
        yield from _ring_variations(model, shape, strategy)
    yield from _common_variations(model, shape, strategy)


def _ps_layout_variations(model: cost.Model, s: cost.Shape, k: cost.Strategy):
    """A PS strategy's layout changes: half, twice or one PS per host, their hosts, disttrain's placement."""
    rep = dataclasses.replace
    for ps in sorted({max(1, s.ps // 2), s.ps * 2, s.hosts}):
        if ps != s.ps and not (s.ps_hosts == cost.COLOCATED and ps > s.hosts * s.workers_per_host):
            yield f"{ps} PS instead of {s.ps}", model, rep(s, ps=ps), k
    if s.ps_hosts == cost.DEDICATED:
        yield "PS colocated on the worker hosts", model, rep(s, ps_hosts=cost.COLOCATED), k
    else:
        yield (
            f"PS on {s.ps} dedicated hosts of their own (+{s.ps} hosts)",
            model,
            rep(s, ps_hosts=cost.DEDICATED),
            k,
        )
    if k.placement != cost.DISTTRAIN:
        named = "round robin" if k.placement == cost.ROUND_ROBIN else "greedy by bytes"
        yield f"disttrain's placement instead of {named}", model, s, rep(k, placement=cost.DISTTRAIN)


def _ps_strategy_variations(model: cost.Model, s: cost.Shape, k: cost.Strategy):
    """The PS strategy's changes of strategy: all-reduce, async with overlap, the hybrid or away from it."""
    rep = dataclasses.replace
    yield (
        "all-reduce instead of PS",
        model,
        rep(s, ps=0),
        cost.Strategy(cost.ALLREDUCE, transfer_bits=k.transfer_bits),
    )
    if k.kind == cost.SYNC_PS:
        yield (
            "async PS with overlap instead of sync PS",
            model,
            s,
            rep(k, kind=cost.ASYNC_PS, overlap=True),
        )
    if k.kind == cost.ASYNC_PS and not k.overlap:
        yield "async PS with overlap=True", model, s, rep(k, overlap=True)
    if k.kind == cost.HYBRID:
        yield "sync PS for the dense layers too, instead of the ring", model, s, rep(k, kind=cost.SYNC_PS)
        yield from _bucket_sizes(model, s, k)
    elif model.sparse_bytes and k.synchronous:
        yield (
            "the hybrid: tables on the PS, the dense layers over a ring",
            model,
            s,
            cost.Strategy(cost.HYBRID, transfer_bits=k.transfer_bits, transport=k.transport),
        )


def _ring_variations(model: cost.Model, s: cost.Shape, k: cost.Strategy):
    """All-reduce's changes: its bucket sizes, the hybrid (tables on PS), async PS with overlap."""
    rep = dataclasses.replace
    yield from _bucket_sizes(model, s, k)
    ps = s.hosts
    if model.sparse_bytes and (k.transport is None or k.transport.name == cost.GRPC):
        yield (
            f"the hybrid: tables on {ps} PS colocated, the dense layers over the ring",
            model,
            rep(s, ps=ps, ps_hosts=cost.COLOCATED),
            cost.Strategy(cost.HYBRID, bucket_bytes=k.bucket_bytes, transfer_bits=k.transfer_bits),
        )
    yield (
        f"async PS with overlap, {ps} PS colocated, instead of all-reduce",
        model,
        rep(s, ps=ps, ps_hosts=cost.COLOCATED),
        cost.Strategy(cost.ASYNC_PS, overlap=True),
    )


def _common_variations(model: cost.Model, s: cost.Shape, k: cost.Strategy):
    """The changes open to any strategy: towers instead of a worker per GPU, 16-bit transfer, the batch."""
    rep = dataclasses.replace
    if not s.towers and s.gpus_per_host > 1:
        ps = min(s.ps, s.hosts) if s.ps_hosts == cost.COLOCATED else s.ps
        yield (
            "one worker per host with a tower per GPU, instead of a worker per GPU",
            model,
            rep(s, towers=True, ps=ps),
            k,
        )
    if k.transfer_bits == 32:
        yield "16-bit transfer", model, s, rep(k, transfer_bits=16)
    yield (
        f"{BATCH_CHANGE} (compute assumed linear in the batch)",
        model.replace(step_time=model.step_time * 2, batch_size=model.batch_size * 2),
        s,
        k,
    )


def _bucket_sizes(model: cost.Model, shape: cost.Shape, strategy: cost.Strategy):
    """Buckets four times larger and smaller, for the strategies with a ring."""
    for factor, word in ((4, "larger"), (0.25, "smaller")):
        bucket = int(strategy.bucket_bytes * factor)
        yield (
            f"{bucket / 2**20:g} MiB buckets ({word})",
            model,
            shape,
            dataclasses.replace(strategy, bucket_bytes=bucket),
        )


def changes(
    model: cost.Model,
    shape: cost.Shape,
    strategy: cost.Strategy,
    constants: cost.Constants = cost.DEFAULTS,
    current: interval.Interval | None = None,
    spreads: Mapping[str, transports.Spread] = transports.SPREADS,
) -> list[Change]:
    """Every variation's interval, best low end first (including those that lose)."""
    current = current or interval.predict(model, shape, strategy, spreads, constants)
    found = []
    for what, m, s, k in _variations(model, shape, strategy):
        try:
            iv = interval.predict(m, s, k, spreads, constants)
        except cost.PlanError:
            continue  # not a valid layout for this cluster (e.g. backup workers > workers)
        found.append(
            Change(
                what,
                iv,
                iv.middle.examples_per_sec / current.middle.examples_per_sec,
                iv.low.examples_per_sec / current.low.examples_per_sec,
            )
        )
    return sorted(found, key=lambda c: -c.low_gain)


def best_layout(
    model: cost.Model,
    shape: cost.Shape,
    strategy: cost.Strategy,
    constants: cost.Constants = cost.DEFAULTS,
    rounds: int = 4,
    min_gain: float = 1.02,
    keep_sync: bool = True,
    spreads: Mapping[str, transports.Spread] = transports.SPREADS,
) -> tuple[interval.Interval, list[str]]:
    """Apply the best change by its low end again and again (at most `rounds`, each gaining `min_gain`).

    The batch is left alone (a larger global batch is an optimisation choice,
    not a layout), and with `keep_sync` a synchronous run stays synchronous
    (async PS trains differently). Returns the final interval and the
    changes, in order.
    """
    synchronous = strategy.synchronous
    current = interval.predict(model, shape, strategy, spreads, constants)
    steps: list[str] = []
    for _ in range(rounds):
        options = [
            c
            for c in changes(model, shape, strategy, constants, current, spreads)
            if not c.what.startswith(BATCH_CHANGE)
            and not (keep_sync and synchronous and c.prediction.strategy.kind == cost.ASYNC_PS)
        ]
        if not options or options[0].low_gain < min_gain:
            break
        best = options[0]
        steps.append(best.what)
        current, shape, strategy = best.interval, best.prediction.shape, best.prediction.strategy
    return current, steps
