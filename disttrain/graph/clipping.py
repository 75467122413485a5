"""Gradient clipping by the global norm, and where each strategy takes that norm.

`clip_norm` (a `disttrain.fit` keyword, `TrainConfig.clip_norm` in gin, or
`Strategy.minimize(..., clip=Clip(...))`) scales a gradient g by
clip_norm / max(|g|, clip_norm), |g| the L2 norm over every variable's
gradient at once (`tf.clip_by_global_norm`; sparse gradients count their
rows once each, duplicates summed first, so the norm is the dense one).

Where the norm is taken (`clip_where`):
- 'replica' (default, every strategy): this replica's gradient, its towers
  already averaged, before anything leaves the replica. As TF1 optimizer
  wrappers and Horovod's TensorFlow path clip (there, one GPU per process).
  With N replicas the applied update is the mean of N clipped gradients.
- 'aggregate': the gradient the update applies, after the replicas'
  gradients are averaged, as TensorFlow's maintainers call "usually right"
  and PyTorch DDP users do after the all-reduce. SyncAllReduce clips the
  all-reduced mean on every replica (each computes the same norm).
  SyncParameterServer clips the mean taken from the PS accumulators, in the
  chief's update: each variable's sum of squares is computed on its PS and
  only those scalars cross to one place, the scaling runs on each PS.
  AsyncParameterServer has no aggregate (each replica's gradient is applied
  alone), so it refuses 'aggregate'.
With one replica the two are the same.
"""

from __future__ import annotations

import contextlib
import dataclasses

import tensorflow as tf

from disttrain.base.config import CLIP_WHERE as WHERE
from disttrain.base.errors import ConfigError


def _deduplicated(grad: tf.IndexedSlices) -> tf.IndexedSlices:
    """Rows named more than once summed into one (the norm is the dense gradient's)."""
    ids, positions = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, positions, tf.shape(ids)[0])
    return tf.IndexedSlices(values, ids, grad.dense_shape)


@dataclasses.dataclass(frozen=True)
class Clip:
    """Clip the gradient by its global norm `norm`, taken `where` ('replica' or 'aggregate')."""

    norm: float
    where: str = "replica"

    def __post_init__(self):
        if not self.norm > 0:
            raise ConfigError(f"clip_norm must be > 0 (or None: no clipping), got {self.norm}")
        if self.where not in WHERE:
            raise ConfigError(f"clip_where={self.where!r}: expected 'replica' or 'aggregate'")

    @classmethod
    def of(cls, settings) -> Clip | None:
        """From a RunSettings' clip_norm and clip_where (None: no clipping)."""
        if settings.clip_norm is None:
            return None
        return cls(settings.clip_norm, settings.clip_where)


def clip_by_global_norm(grads_and_vars, clip_norm: float, colocate: bool = False):
    """(grad, var) pairs scaled by clip_norm / max(global norm, clip_norm); sparse ones stay rows.

    colocate: compute each gradient's sum of squares and its scaling on its
    variable's device (a PS), so that only scalars travel to the sum.
    """

    def where(var):
        return tf.device(var.device) if colocate else contextlib.nullcontext()

    pairs, squares = [], []
    with tf.name_scope("clip_by_global_norm"):
        for grad, var in grads_and_vars:
            with where(var):
                is_rows = isinstance(grad, tf.IndexedSlices)
                grad = _deduplicated(grad) if is_rows else tf.convert_to_tensor(grad)
                values = grad.values if is_rows else grad
                squares.append(tf.reduce_sum(tf.square(tf.cast(values, tf.float32))))
            pairs.append((grad, var))
        norm = tf.sqrt(tf.add_n(squares), name="global_norm")
        scale = clip_norm / tf.maximum(norm, clip_norm)
        out = []
        for grad, var in pairs:
            with where(var):
                if isinstance(grad, tf.IndexedSlices):
                    values = grad.values * tf.cast(scale, grad.values.dtype)
                    out.append((tf.IndexedSlices(values, grad.indices, grad.dense_shape), var))
                else:
                    out.append((grad * tf.cast(scale, grad.dtype), var))
    return out
