"""The classic CIFAR-10 CNN of TensorFlow's tutorial (1.07M parameters, 24x24 crops)."""

from __future__ import annotations

import tensorflow as tf

from model_zoo import layers
from model_zoo.base import Model
from model_zoo.registry import register


def _lrn(x):
    return tf.nn.local_response_normalization(x, depth_radius=4, bias=1.0, alpha=0.001 / 9.0, beta=0.75)


@register("cifar10")
class Cifar10(Model):
    """conv5x5/64 - pool - lrn - conv5x5/64 - lrn - pool - fc384 - fc192 - 10."""

    def __init__(self, image_size: int = 24, num_classes: int = 10, width: int = 64):
        self.input_shape = (image_size, image_size, 3)
        self.num_classes = num_classes
        self.width = width

    def __call__(self, features, training):
        x = layers.conv2d(features, self.width, 5, name="conv1", activation=tf.nn.relu)
        x = _lrn(layers.max_pool(x, 3, 2))
        x = layers.conv2d(x, self.width, 5, name="conv2", activation=tf.nn.relu)
        x = layers.max_pool(_lrn(x), 3, 2)
        x = layers.dense(x, 6 * self.width, name="local3", activation=tf.nn.relu)
        x = layers.dense(x, 3 * self.width, name="local4", activation=tf.nn.relu)
        return layers.dense(x, self.num_classes, name="softmax_linear")
