"""Asynchronous parameter servers: each worker applies its own gradients."""

from __future__ import annotations

import tensorflow as tf

from disttrain.errors import ConfigError
from disttrain.strategies.base import Strategy

v1 = tf.compat.v1

_TRANSFER_DTYPES = {None: None, "float16": tf.float16, "bfloat16": tf.bfloat16}


class AsyncParameterServer(Strategy):
    """Variables on PS tasks, balanced by bytes; every replica updates them on its own.

    No replica waits for another, so a slow or lost worker never stalls the
    rest; the price is that gradients may be computed from slightly stale
    variables. One increment of the global step is one replica's batch.

    overlap: keep the network off the step's critical path. The model reads
      worker-side copies of the variables; a step's gradients are parked on
      the worker and pushed to the PS during the *next* step's compute, and
      fresh values are pulled into the copies right after that push, also
      while the worker computes. Each step then costs about max(compute,
      transfer) instead of their sum; gradients are computed from values two
      updates of this worker old (plus whatever other workers pushed).
    transfer_dtype: 'bfloat16' or 'float16' halves the bytes (and the CPU that
      gRPC spends on them) of both the push and the pull; variables, optimizer
      state and the update stay float32 on the PS. Needs overlap.
    """

    uses_ps = True

    def __init__(
        self,
        cluster,
        num_towers: int | None = None,
        max_imbalance: float = 0.05,
        overlap: bool = False,
        transfer_dtype: str | None = None,
    ):
        super().__init__(cluster, num_towers, max_imbalance)
        if transfer_dtype not in _TRANSFER_DTYPES:
            raise ConfigError(f"transfer_dtype={transfer_dtype!r}: expected None, 'float16' or 'bfloat16'")
        if transfer_dtype and not overlap:
            raise ConfigError("AsyncParameterServer.transfer_dtype needs overlap=True")
        self.overlap = overlap
        self.transfer_dtype = _TRANSFER_DTYPES[transfer_dtype]
        self._copies: dict[
            str, tuple[tf.Variable, tf.Variable]
        ] = {}  # PS variable name -> (copy, PS variable)
        self._flush = None

    def _on_ps(self, var, value):
        """`value` converted for the wire on `var`'s PS (a no-op without a transfer dtype)."""
        if self.transfer_dtype is None:
            return value
        with tf.device(var.device):
            return tf.cast(value, self.transfer_dtype)

    def _local_copy(self, var) -> tf.Tensor:
        """The worker-side copy the model reads instead of `var` (created on first use)."""
        with tf.device(self.compute_devices[0]), tf.name_scope("local_copy"):
            copy = v1.Variable(
                initial_value=lambda: tf.cast(self._on_ps(var, var.read_value()), var.dtype.base_dtype),
                trainable=False,
                collections=[v1.GraphKeys.LOCAL_VARIABLES],
                name=var.op.name.replace("/", "_"),
            )
            self._copies[var.op.name] = (copy, var)
            return copy.read_value()

    def compute_gradients(self, optimizer, loss, read=None):
        return super().compute_gradients(optimizer, loss, read=self._local_copy if self.overlap else read)

    def apply_gradients(self, optimizer, grads_and_vars, global_step):
        if not self.overlap:
            return optimizer.apply_gradients(grads_and_vars, global_step=global_step)
        worker = self.compute_devices[0]
        wire = self.transfer_dtype
        parked, stores, to_push = [], [], []
        with tf.device(worker), tf.name_scope("parked_gradients"):
            for grad, var in grads_and_vars:
                grad = tf.convert_to_tensor(grad)  # sparse gradients are sent dense
                buffer = v1.Variable(
                    tf.zeros(grad.shape, wire or grad.dtype),
                    trainable=False,
                    collections=[v1.GraphKeys.LOCAL_VARIABLES],
                    name=var.op.name.replace("/", "_"),
                )
                previous = buffer.read_value()  # last step's gradient: pushed now
                parked.append(previous)
                with tf.control_dependencies([previous]):
                    stores.append(buffer.assign(tf.cast(grad, buffer.dtype), read_value=False))
                with tf.device(var.device):
                    to_push.append((tf.cast(previous, var.dtype.base_dtype), var))
        push = optimizer.apply_gradients(to_push, global_step=global_step)
        self._flush = push
        pulls = []
        with tf.device(worker), tf.name_scope("pull"), tf.control_dependencies([push]):
            for copy, var in self._copies.values():
                fresh = self._on_ps(var, var.read_value())
                pulls.append(copy.assign(tf.cast(fresh, copy.dtype), read_value=False))
        return tf.group(push, *pulls, *stores)

    def hooks(self) -> list:
        return [_FlushHook(self._flush)] if self._flush is not None else []


class _FlushHook(v1.train.SessionRunHook):
    """At the end of training, push the gradients still parked on the worker."""

    def __init__(self, push):
        self._push = push

    def end(self, session):
        session.run(self._push)
