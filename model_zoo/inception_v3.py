"""Inception-v3 (Szegedy et al. 2015) without the auxiliary head, 299x299 by default.

Layer for layer the network of Keras applications' InceptionV3 (and of
tf_cnn_benchmarks): every convolution has no bias and is followed by batch
norm without scale (beta only, epsilon 1e-3, decay 0.9997), so the trainable
count is 23,817,352 and with the moving statistics 23,851,784, the count
Keras publishes. The largest variable is the 2048 x 1000 classifier (8.6%).
"""

from __future__ import annotations

import functools

import tensorflow as tf

from model_zoo import layers
from model_zoo.base import Model
from model_zoo.registry import register

v1 = tf.compat.v1


def _block_35(c, x, pool_filters, name):
    """mixed0-2: 35x35, 1x1 / 5x5 / double 3x3 / pool branches."""
    with v1.variable_scope(name):
        b1 = c(x, 64, 1, "branch1x1")
        b5 = c(c(x, 48, 1, "branch5x5_1"), 64, 5, "branch5x5_2")
        b3 = c(c(c(x, 64, 1, "branch3x3dbl_1"), 96, 3, "branch3x3dbl_2"), 96, 3, "branch3x3dbl_3")
        bp = c(layers.avg_pool(x, 3, 1), pool_filters, 1, "branch_pool")
        return tf.concat([b1, b5, b3, bp], axis=3)


def _reduce_35_to_17(c, x, name):
    """mixed3: grid reduction 35 -> 17."""
    with v1.variable_scope(name):
        b3 = c(x, 384, 3, "branch3x3", strides=2, padding="VALID")
        bd = c(c(x, 64, 1, "branch3x3dbl_1"), 96, 3, "branch3x3dbl_2")
        bd = c(bd, 96, 3, "branch3x3dbl_3", strides=2, padding="VALID")
        bp = layers.max_pool(x, 3, 2, padding="VALID")
        return tf.concat([b3, bd, bp], axis=3)


def _block_17(c, x, mid, name):
    """mixed4-7: 17x17 with factorised 7x7 convolutions (1x7 and 7x1)."""
    with v1.variable_scope(name):
        b1 = c(x, 192, 1, "branch1x1")
        b7 = c(x, mid, 1, "branch7x7_1")
        b7 = c(b7, mid, (1, 7), "branch7x7_2")
        b7 = c(b7, 192, (7, 1), "branch7x7_3")
        bd = c(x, mid, 1, "branch7x7dbl_1")
        bd = c(bd, mid, (7, 1), "branch7x7dbl_2")
        bd = c(bd, mid, (1, 7), "branch7x7dbl_3")
        bd = c(bd, mid, (7, 1), "branch7x7dbl_4")
        bd = c(bd, 192, (1, 7), "branch7x7dbl_5")
        bp = c(layers.avg_pool(x, 3, 1), 192, 1, "branch_pool")
        return tf.concat([b1, b7, bd, bp], axis=3)


def _reduce_17_to_8(c, x, name):
    """mixed8: grid reduction 17 -> 8."""
    with v1.variable_scope(name):
        b3 = c(c(x, 192, 1, "branch3x3_1"), 320, 3, "branch3x3_2", strides=2, padding="VALID")
        b7 = c(x, 192, 1, "branch7x7x3_1")
        b7 = c(b7, 192, (1, 7), "branch7x7x3_2")
        b7 = c(b7, 192, (7, 1), "branch7x7x3_3")
        b7 = c(b7, 192, 3, "branch7x7x3_4", strides=2, padding="VALID")
        bp = layers.max_pool(x, 3, 2, padding="VALID")
        return tf.concat([b3, b7, bp], axis=3)


def _block_8(c, x, name):
    """mixed9-10: 8x8 with expanded filter banks (1x3 and 3x1 side by side)."""
    with v1.variable_scope(name):
        b1 = c(x, 320, 1, "branch1x1")
        b3 = c(x, 384, 1, "branch3x3_1")
        b3 = tf.concat([c(b3, 384, (1, 3), "branch3x3_2a"), c(b3, 384, (3, 1), "branch3x3_2b")], axis=3)
        bd = c(c(x, 448, 1, "branch3x3dbl_1"), 384, 3, "branch3x3dbl_2")
        bd = tf.concat([c(bd, 384, (1, 3), "branch3x3dbl_3a"), c(bd, 384, (3, 1), "branch3x3dbl_3b")], axis=3)
        bp = c(layers.avg_pool(x, 3, 1), 192, 1, "branch_pool")
        return tf.concat([b1, b3, bd, bp], axis=3)


@register("inception_v3")
class InceptionV3(Model):
    """Inception-v3 for `image_size` >= 75 (the smallest the valid-padded stem allows).

    Shrinking knobs (for tests; defaults are the reference): `image_size`,
    `num_classes` and `width_multiplier` (scales every conv's filters, never
    below `min_depth`).
    """

    def __init__(
        self,
        image_size: int = 299,
        num_classes: int = 1000,
        width_multiplier: float = 1.0,
        min_depth: int = 8,
    ):
        if image_size < 75:
            raise ValueError(f"inception_v3 needs image_size >= 75, got {image_size}")
        if width_multiplier <= 0:
            raise ValueError(f"inception_v3 width_multiplier must be > 0, got {width_multiplier}")
        self.input_shape = (image_size, image_size, 3)
        self.num_classes = num_classes
        self.width_multiplier = width_multiplier
        self.min_depth = min_depth

    def _conv(self, x, filters, kernel, name, training, strides=1, padding="SAME"):
        """conv (no bias) - batch norm (no scale) - relu, as Keras' conv2d_bn."""
        filters = max(int(filters * self.width_multiplier), self.min_depth)
        with v1.variable_scope(name):
            x = layers.conv2d(
                x,
                filters,
                kernel,
                "conv",
                strides=strides,
                padding=padding,
                use_bias=False,
            )
            x = layers.batch_norm(x, training, "bn", momentum=0.9997, epsilon=1e-3, scale=False)
            return tf.nn.relu(x)

    def __call__(self, features, training):
        c = functools.partial(self._conv, training=training)
        x = c(features, 32, 3, "conv1", strides=2, padding="VALID")
        x = c(x, 32, 3, "conv2", padding="VALID")
        x = c(x, 64, 3, "conv3")
        x = layers.max_pool(x, 3, 2, padding="VALID")
        x = c(x, 80, 1, "conv4", padding="VALID")
        x = c(x, 192, 3, "conv5", padding="VALID")
        x = layers.max_pool(x, 3, 2, padding="VALID")
        x = _block_35(c, x, 32, "mixed0")
        x = _block_35(c, x, 64, "mixed1")
        x = _block_35(c, x, 64, "mixed2")
        x = _reduce_35_to_17(c, x, "mixed3")
        for i, mid in enumerate((128, 160, 160, 192)):
            x = _block_17(c, x, mid, f"mixed{4 + i}")
        x = _reduce_17_to_8(c, x, "mixed8")
        x = _block_8(c, x, "mixed9")
        x = _block_8(c, x, "mixed10")
        x = layers.global_avg_pool(x)
        return layers.dense(x, self.num_classes, name="logits")
