"""TensorFlow's default between-graph layout, as a Strategy: the benchmark's baseline.

What a TF 1.x tutorial does: `tf.device(tf.train.replica_device_setter(...))`
around the model, variables dealt round robin to the PS tasks by count (not
by bytes), asynchronous updates with the plain optimizer. An embedding table
(a variable the model reads by rows) is created with
`partitioner=tf.compat.v1.fixed_size_partitioner(num_ps)`, as TF's guides
have users do for big tables, so its num_ps parts of contiguous rows are dealt
round robin like any variable. None of disttrain's placement applies: no
plan, no partitioning by bytes, no greedy balancing, dense variables never
split. Registered for gin as `@TFDefault`; the benchmark runs it as its
`tf_default` system. It is also the smallest complete strategy, which
docs/writing-a-strategy.md walks through.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import tensorflow as tf

from disttrain.graph import placement
from disttrain.strategies.base import Strategy

v1 = tf.compat.v1


class _RoundRobin:
    """TF's replica_device_setter, with the `tower()` hook the base class calls (a no-op:
    replica_device_setter puts every non-variable op on the worker device)."""

    plan = None  # minimize() hands a setter its plan; TF's default has none

    def __init__(self, num_ps: int, worker_device: str):
        self._fn: Callable | None = placement.round_robin_setter(num_ps, worker_device) if num_ps else None

    def __call__(self, op: tf.Operation) -> str:
        return self._fn(op) if self._fn is not None else op.device

    @contextlib.contextmanager
    def tower(self, device: str):
        del device
        yield


def table_partitioning_getter(tables: Callable[[], frozenset[str]], num_ps: int) -> Callable:
    """A variable-scope custom getter giving the named tables `fixed_size_partitioner(num_ps)`.

    `tables()` is read at each variable's creation. A partitioner the model
    gave explicitly wins; other variables are created as asked.
    """

    def getter(getter, name, *args, **kwargs):
        if name in tables() and kwargs.get("partitioner") is None:
            kwargs["partitioner"] = v1.fixed_size_partitioner(num_ps)
        return getter(name, *args, **kwargs)

    return getter


class TFDefault(Strategy):
    """Round-robin `replica_device_setter` placement, async updates, plain optimizer.

    Embedding tables are split into num_ps parts by TF's fixed-size
    partitioner. Without PS tasks (one process alone) it places and splits
    nothing.
    """

    kind = "async_ps"  # what it does, as the cost model and the benchmark count it
    synchronous = False
    uses_ps = True
    baseline = True  # a system to compare against, not a --strategy choice

    def device_setter(self):
        """Variables go round robin by count, as `replica_device_setter` deals them."""
        return _RoundRobin(self.cluster.num_ps, self.cluster.task_device or None)

    def variable_getter(self):
        """The tables `plan_from` noted get TF's partitioner."""
        num_ps = self.cluster.num_ps
        return table_partitioning_getter(
            lambda: (self.tables or frozenset()) if num_ps else frozenset(), num_ps
        )

    def apply_gradients(self, optimizer, grads_and_vars, global_step):
        return self.when_data(lambda: optimizer.apply_gradients(grads_and_vars, global_step=global_step))
