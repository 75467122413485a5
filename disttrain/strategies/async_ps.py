"""Asynchronous parameter servers: each worker applies its own gradients."""

from __future__ import annotations

from disttrain.strategies.base import Strategy


class AsyncParameterServer(Strategy):
    """Variables on PS tasks, balanced by bytes; every replica updates them on its own.

    No replica waits for another, so a slow or lost worker never stalls the
    rest; the price is that gradients may be computed from slightly stale
    variables. One increment of the global step is one replica's batch.
    """

    uses_ps = True

    def apply_gradients(self, optimizer, grads_and_vars, global_step):
        return optimizer.apply_gradients(grads_and_vars, global_step=global_step)
