"""Replica strategies: how gradients of many replicas reach the variables.

`Strategy` (base) documents what a strategy declares and overrides;
`PsStrategy` is the base of those with variables on PS tasks. Every table of
strategies elsewhere (the benchmark's, the planner's, gin's) is derived from
`__all__` through `concrete()`: a new strategy is listed here and nowhere else.

May import: base and graph.
"""

from __future__ import annotations

import inspect

from disttrain.strategies.allreduce import SyncAllReduce
from disttrain.strategies.async_ps import AsyncParameterServer
from disttrain.strategies.base import Strategy
from disttrain.strategies.building import Building, Step  # noqa: F401  (what minimize() builds and built)
from disttrain.strategies.hybrid import SyncHybrid
from disttrain.strategies.ps import PsStrategy
from disttrain.strategies.sync_ps import SyncParameterServer
from disttrain.strategies.tf_default import TFDefault

__all__ = [
    "AsyncParameterServer",
    "PsStrategy",
    "Strategy",
    "SyncAllReduce",
    "SyncHybrid",
    "SyncParameterServer",
    "TFDefault",
]


def concrete(baselines: bool = True) -> list[type[Strategy]]:
    """The strategy classes of `__all__` that can be built (bases left out), in `__all__`'s order.

    `baselines=False` leaves out the layouts kept only to compare against (`Strategy.baseline`).
    """
    found = [globals()[name] for name in __all__]
    return [
        cls
        for cls in found
        if isinstance(cls, type)
        and issubclass(cls, Strategy)
        and not inspect.isabstract(cls)
        and (baselines or not cls.baseline)
    ]


def by_kind() -> dict[str, type[Strategy]]:
    """`--strategy` name (`Strategy.kind`) -> class, for the strategies that are not baselines."""
    table: dict[str, type[Strategy]] = {}
    for cls in concrete(baselines=False):
        if cls.kind in table:
            raise TypeError(f"{cls.__name__} and {table[cls.kind].__name__} both declare kind {cls.kind!r}")
        table[cls.kind] = cls
    return table
