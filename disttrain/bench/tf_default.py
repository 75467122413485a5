"""TensorFlow's default between-graph layout, as a Strategy, for side-by-side benchmarks.

What a TF 1.x tutorial does: `tf.device(tf.train.replica_device_setter(...))`
around the model, variables dealt round robin to the PS tasks by count (not
by bytes, never split), asynchronous updates with the plain optimizer. None
of disttrain's placement applies: no plan, no partitioning, no greedy
balancing. Registered for gin as `@TFDefault`; only the benchmark uses it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import tensorflow as tf

from disttrain import placement
from disttrain.strategies.base import Strategy

v1 = tf.compat.v1


class _RoundRobin:
    """TF's replica_device_setter, with the `tower()` hook the base class calls (a no-op:
    replica_device_setter puts every non-variable op on the worker device)."""

    def __init__(self, num_ps: int, worker_device: str):
        self._fn: Callable | None = placement.round_robin_setter(num_ps, worker_device) if num_ps else None

    def __call__(self, op: tf.Operation) -> str:
        return self._fn(op) if self._fn is not None else op.device

    @contextlib.contextmanager
    def tower(self, device: str):
        del device
        yield


class TFDefault(Strategy):
    """Round-robin `replica_device_setter` placement, async updates, plain optimizer.

    Without PS tasks (one process alone) it places nothing.
    """

    uses_ps = True

    def plan_placement(self, build_fn: Callable[[], object]) -> None:
        del build_fn  # TF's default plans nothing
        return None

    def plan_from(self, specs) -> None:
        del specs  # nor from the loss function
        return None

    @contextlib.contextmanager
    def scope(self):
        worker_device = self.cluster.task_device or None
        self.setter = _RoundRobin(self.cluster.num_ps, worker_device)
        with v1.get_default_graph().device(self.setter):
            yield self

    def apply_gradients(self, optimizer, grads_and_vars, global_step):
        return optimizer.apply_gradients(grads_and_vars, global_step=global_step)
