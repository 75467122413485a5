"""ResNet-50/101/152 v1.5 (He et al. 2015, bottleneck blocks), ImageNet size by default.

v1.5 is the variant of tf_cnn_benchmarks, TF's official models and
torchvision: in a downsampling block the stride sits on the 3x3 conv, not on
the first 1x1 conv as in the paper's v1. The parameter count is the same as
v1; the accuracy is slightly higher and the compute slightly larger.

Convolutions have no bias and are followed by batch norm with scale (gamma)
and moving statistics, so the trainable count equals torchvision's
(ResNet-50 25,557,032; ResNet-101 44,549,160; ResNet-152 60,192,808). Keras
applications' ResNet50 (25,636,712) also counts conv biases and moving
statistics.
"""

from __future__ import annotations

import tensorflow as tf

from model_zoo import layers
from model_zoo.base import Model
from model_zoo.registry import register

# Bottleneck blocks per stage, by depth.
BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def _conv_bn(x, filters, kernel, strides, training, name, relu=True):
    with tf.compat.v1.variable_scope(name):
        x = layers.conv2d(x, filters, kernel, name="conv", strides=strides, use_bias=False)
        x = layers.batch_norm(x, training, name="bn", momentum=0.9, epsilon=1e-5)
        return tf.nn.relu(x) if relu else x


def _bottleneck(x, filters, strides, training, name):
    """1x1 (filters) - 3x3 (filters, stride) - 1x1 (4 x filters), plus the shortcut."""
    with tf.compat.v1.variable_scope(name):
        out = 4 * filters
        if strides != 1 or int(x.shape[-1]) != out:
            shortcut = _conv_bn(x, out, 1, strides, training, "shortcut", relu=False)
        else:
            shortcut = x
        y = _conv_bn(x, filters, 1, 1, training, "conv1")
        y = _conv_bn(y, filters, 3, strides, training, "conv2")
        y = _conv_bn(y, out, 1, 1, training, "conv3", relu=False)
        return tf.nn.relu(y + shortcut)


@register("resnet")
class ResNet(Model):
    """ResNet v1.5 with bottleneck blocks; `depth` is 50, 101 or 152.

    Shrinking knobs (for tests; defaults are the reference): `image_size`,
    `num_classes`, `width` (filters of the first stage, 64 in the reference;
    stages use width x 1, 2, 4, 8 and blocks expand them 4x) and
    `stage_blocks` (blocks per stage, overriding the ones `depth` implies).
    """

    def __init__(
        self,
        depth: int = 50,
        image_size: int = 224,
        num_classes: int = 1000,
        width: int = 64,
        stage_blocks: tuple[int, ...] | None = None,
    ):
        if stage_blocks is None:
            if depth not in BLOCKS:
                raise ValueError(f"resnet depth must be one of {sorted(BLOCKS)}, got {depth}")
            stage_blocks = BLOCKS[depth]
        if not stage_blocks or min(stage_blocks) < 1:
            raise ValueError(f"resnet stage_blocks must be positive block counts, got {stage_blocks}")
        self.depth = depth
        self.stage_blocks = tuple(stage_blocks)
        self.width = width
        self.input_shape = (image_size, image_size, 3)
        self.num_classes = num_classes

    def __call__(self, features, training):
        x = _conv_bn(features, self.width, 7, 2, training, "conv1")
        x = layers.max_pool(x, 3, 2)
        for stage, blocks in enumerate(self.stage_blocks):
            filters = self.width * 2**stage
            for block in range(blocks):
                strides = 2 if block == 0 and stage > 0 else 1
                x = _bottleneck(x, filters, strides, training, f"stage{stage + 1}/block{block + 1}")
        x = layers.global_avg_pool(x)
        return layers.dense(x, self.num_classes, name="fc")
