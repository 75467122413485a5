"""AlexNet as in tf_cnn_benchmarks (one tower, no LRN, no grouped convs), 227x227 by default.

tf_cnn_benchmarks' `alexnet_model.py`: conv 64 11x11/4 valid, pool, conv 192
5x5, pool, conv 384, 384, 256 3x3, pool, fc 4096, dropout, fc 4096, dropout,
classifier. With 1000 classes that is 61,838,248 parameters, of which fc6
(9216 x 4096 + bias) is 37,752,832 (61%): the variable that pins one PS
under TF's round-robin placement. Images are 227 (224 + 3, as the benchmark
pads them) so the valid 11x11/4 conv yields 55x55.
"""

from __future__ import annotations

import tensorflow as tf

from model_zoo import layers
from model_zoo.base import Model
from model_zoo.registry import register


@register("alexnet")
class AlexNet(Model):
    """Shrinking knobs (for tests; defaults are the reference): `image_size` (>= 67),
    `num_classes`, `conv_filters` (the five conv widths) and `fc_units`."""

    def __init__(
        self,
        image_size: int = 227,
        num_classes: int = 1000,
        conv_filters: tuple[int, ...] = (64, 192, 384, 384, 256),
        fc_units: int = 4096,
        dropout_rate: float = 0.5,
    ):
        if image_size < 67:
            raise ValueError(f"alexnet needs image_size >= 67 (three valid 3x3/2 pools), got {image_size}")
        if len(conv_filters) != 5:
            raise ValueError(f"alexnet conv_filters needs 5 widths, got {conv_filters}")
        self.input_shape = (image_size, image_size, 3)
        self.num_classes = num_classes
        self.conv_filters = tuple(conv_filters)
        self.fc_units = fc_units
        self.dropout_rate = dropout_rate

    def __call__(self, features, training):
        f = self.conv_filters
        relu = tf.nn.relu
        x = layers.conv2d(features, f[0], 11, "conv1", strides=4, padding="VALID", activation=relu)
        x = layers.max_pool(x, 3, 2, padding="VALID")
        x = layers.conv2d(x, f[1], 5, "conv2", activation=relu)
        x = layers.max_pool(x, 3, 2, padding="VALID")
        x = layers.conv2d(x, f[2], 3, "conv3", activation=relu)
        x = layers.conv2d(x, f[3], 3, "conv4", activation=relu)
        x = layers.conv2d(x, f[4], 3, "conv5", activation=relu)
        x = layers.max_pool(x, 3, 2, padding="VALID")
        x = layers.dense(x, self.fc_units, "fc6", activation=relu)
        x = layers.dropout(x, self.dropout_rate, training)
        x = layers.dense(x, self.fc_units, "fc7", activation=relu)
        x = layers.dropout(x, self.dropout_rate, training)
        return layers.dense(x, self.num_classes, "fc8")
