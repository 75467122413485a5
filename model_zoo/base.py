"""What a model is to the trainer: input spec, forward pass, loss."""

from __future__ import annotations

import tensorflow as tf


class Model:
    """A classifier built from model_zoo.layers.

    Subclasses set `input_shape` (per example, no batch axis) and
    `num_classes`, and implement `__call__(features, training) -> logits`.
    Variables must be created with `get_variable` (through the layers) so
    that placement, partitioning and tower reuse apply to them.
    """

    name = "model"
    input_shape: tuple[int, ...] = ()
    num_classes: int = 0

    def __call__(self, features: tf.Tensor, training: bool) -> tf.Tensor:
        raise NotImplementedError

    def loss(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Mean softmax cross-entropy over the batch."""
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))

    def build_variables(self) -> None:
        """Create this model's variables in the current graph (for placement planning)."""
        self(tf.zeros((1,) + tuple(self.input_shape)), training=True)
