"""VGG-16 (Simonyan and Zisserman 2014, configuration D), 224x224 by default.

Thirteen 3x3 convs with biases in five stages of 64, 128, 256, 512, 512
filters, each stage ending in a 2x2/2 max pool, then fc 4096, dropout, fc
4096, dropout, classifier; no batch norm. 138,357,544 parameters (Keras
applications' VGG16, tf_cnn_benchmarks' vgg16), of which fc6 (25088 x 4096 +
bias) is 102,764,544 (74%).
"""

from __future__ import annotations

import tensorflow as tf

from model_zoo import layers
from model_zoo.base import Model
from model_zoo.registry import register

CONVS_PER_STAGE = (2, 2, 3, 3, 3)


@register("vgg16")
class VGG16(Model):
    """Shrinking knobs (for tests; defaults are the reference): `image_size` (>= 32),
    `num_classes`, `stage_filters` (the five stage widths) and `fc_units`."""

    def __init__(
        self,
        image_size: int = 224,
        num_classes: int = 1000,
        stage_filters: tuple[int, ...] = (64, 128, 256, 512, 512),
        fc_units: int = 4096,
        dropout_rate: float = 0.5,
    ):
        if image_size < 32:
            raise ValueError(f"vgg16 needs image_size >= 32 (five 2x2/2 pools), got {image_size}")
        if len(stage_filters) != len(CONVS_PER_STAGE):
            raise ValueError(f"vgg16 stage_filters needs {len(CONVS_PER_STAGE)} widths, got {stage_filters}")
        self.input_shape = (image_size, image_size, 3)
        self.num_classes = num_classes
        self.stage_filters = tuple(stage_filters)
        self.fc_units = fc_units
        self.dropout_rate = dropout_rate

    def __call__(self, features, training):
        x = features
        for stage, (convs, filters) in enumerate(zip(CONVS_PER_STAGE, self.stage_filters, strict=True)):
            for i in range(convs):
                x = layers.conv2d(x, filters, 3, f"conv{stage + 1}_{i + 1}", activation=tf.nn.relu)
            x = layers.max_pool(x, 2, 2)
        x = layers.dense(x, self.fc_units, "fc6", activation=tf.nn.relu)
        x = layers.dropout(x, self.dropout_rate, training)
        x = layers.dense(x, self.fc_units, "fc7", activation=tf.nn.relu)
        x = layers.dropout(x, self.dropout_rate, training)
        return layers.dense(x, self.num_classes, "fc8")
