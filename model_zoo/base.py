"""What a model is to the trainer: features in, logits out, loss, accuracy, the tables a batch reads."""

from __future__ import annotations

import dataclasses
import re

import tensorflow as tf

from model_zoo import layers

# What an input pipeline yields as one batch's features: one tensor (the classifiers)
# or a tuple of tensors (DLRM's dense features and categorical ids).
Features = tf.Tensor | tuple[tf.Tensor, ...]


@dataclasses.dataclass(frozen=True)
class Regularization:
    """What a recipe adds to a classifier's training loss (not to its evaluation).

    weight_decay: rate x sum of squares / 2 (`tf.nn.l2_loss`) of the dense and
      conv kernels; never biases, batch-norm parameters or embedding tables.
    decay_layers: regular expressions over kernel names (e.g. 'local3/weights');
      only kernels that match one decay; empty: every kernel.
    label_smoothing: cross-entropy against (1 - e) x one-hot + e / classes
      (Szegedy et al. 2016).
    """

    weight_decay: float = 0.0
    decay_layers: tuple[str, ...] = ()
    label_smoothing: float = 0.0

    def __post_init__(self):
        if self.weight_decay < 0 or not 0 <= self.label_smoothing < 1:
            raise ValueError(
                f"weight_decay must be >= 0 and label_smoothing in [0, 1), got {self.weight_decay}, "
                f"{self.label_smoothing}"
            )

    def decayed(self, kernels: list[tuple[str, tf.Tensor]]) -> list[tuple[str, tf.Tensor]]:
        """The kernels this recipe decays."""
        if not self.decay_layers:
            return list(kernels)
        return [(n, k) for n, k in kernels if any(re.search(p, n) for p in self.decay_layers)]

    def decay(self, kernels: list[tuple[str, tf.Tensor]]) -> tf.Tensor | float:
        chosen = self.decayed(kernels) if self.weight_decay else []
        if not chosen:
            return 0.0
        return self.weight_decay * tf.add_n([tf.nn.l2_loss(tf.cast(k, tf.float32)) for _, k in chosen])


class Model:
    """A model built from model_zoo.layers.

    Subclasses implement `__call__(features, training) -> logits`. Variables
    must be created with `get_variable` (through the layers) so that
    placement, partitioning and tower reuse apply to them.

    Classifiers set `input_shape` (per example, no batch axis) and
    `num_classes`, which the generic inputs (model_zoo.inputs.synthetic, ...)
    read. A model whose features are not one tensor of `input_shape`
    overrides `build_variables` and comes with inputs of its own.
    """

    name = "model"
    input_shape: tuple[int, ...] = ()
    num_classes: int = 0

    def __call__(self, features: Features, training: bool) -> tf.Tensor:
        raise NotImplementedError

    def loss(self, logits: tf.Tensor, labels: tf.Tensor, label_smoothing: float = 0.0) -> tf.Tensor:
        """Mean softmax cross-entropy over the batch (against smoothed labels when asked)."""
        if label_smoothing:
            targets = tf.one_hot(labels, tf.shape(logits)[-1], dtype=logits.dtype)
            classes = tf.cast(tf.shape(logits)[-1], logits.dtype)
            targets = targets * (1.0 - label_smoothing) + label_smoothing / classes
            return tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits))
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))

    def training_loss(self, features: Features, labels: tf.Tensor, recipe: Regularization | None = None):
        """The loss training minimises: `loss` on the model's training logits, with the recipe's terms."""
        recipe = recipe or Regularization()
        with layers.kernels() as kernels:
            logits = self(features, training=True)
        smoothing = {"label_smoothing": recipe.label_smoothing} if recipe.label_smoothing else {}
        return self.loss(logits, labels, **smoothing) + recipe.decay(kernels)

    def accuracy(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Fraction of the batch whose largest logit is at its (int32) label."""
        predictions = tf.argmax(logits, -1, output_type=tf.int32)
        return tf.reduce_mean(tf.cast(tf.equal(predictions, labels), tf.float32))

    def lookups(self, features: Features) -> dict[str, tf.Tensor]:
        """Embedding tables a batch reads by rows: variable op name -> the int64 ids looked up in it.

        Names are those of the variables `build_variables()` creates in a
        fresh graph (e.g. `dlrm/embedding_3/table`). The benchmark counts the
        bytes a step reads from a table as its distinct ids times the row
        size; a variable not named here counts whole. Empty: no tables.
        """
        del features
        return {}

    def build_variables(self) -> None:
        """Create this model's variables in the current graph (for placement planning)."""
        self(tf.zeros((1,) + tuple(self.input_shape)), training=True)

    def serving_inputs(self) -> dict[str, tf.TensorSpec]:
        """What `serve` takes, for `disttrain.export`: a batch of any size of `input_shape` features."""
        return {"features": tf.TensorSpec((None, *self.input_shape), tf.float32)}

    def serve(self, inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """The model for serving (inference mode): logits, class probabilities and the predicted class."""
        logits = self(inputs["features"], training=False)
        classes = tf.argmax(logits, -1, output_type=tf.int32)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits), "classes": classes}
