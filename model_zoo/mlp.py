"""A multi-layer perceptron, 256-4096-4096-256 by default (18.9M parameters, 75.5 MB).

Most of its bytes are one variable, fc2 (4096 x 4096, 64 MiB): little compute
per byte moved, and a variable that only splitting balances over PS tasks.
"""

from __future__ import annotations

import tensorflow as tf

from model_zoo import layers
from model_zoo.base import Model
from model_zoo.registry import register


@register("mlp")
class MLP(Model):
    def __init__(
        self, input_dim: int = 256, hidden_sizes: tuple[int, ...] = (4096, 4096), num_classes: int = 256
    ):
        self.input_shape = (input_dim,)
        self.hidden_sizes = tuple(hidden_sizes)
        self.num_classes = num_classes

    def __call__(self, features, training):
        x = features
        for i, units in enumerate(self.hidden_sizes):
            x = layers.dense(x, units, name=f"fc{i + 1}", activation=tf.nn.relu)
        return layers.dense(x, self.num_classes, name="logits")
