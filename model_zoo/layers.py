"""A small layer library on `tf.nn` and `get_variable`, for TF 2 graph mode.

Keras 3 layers do not work in v1 graphs (BatchNormalization's moving
statistics silently never update), so models are built from these. Every
layer creates its variables with `tf.compat.v1.get_variable` inside a
variable scope named after the layer, so device setters, partitioners and
tower reuse all apply. Images are NHWC.
"""

from __future__ import annotations

import tensorflow as tf

v1 = tf.compat.v1


def _he_init():
    return v1.variance_scaling_initializer(scale=2.0, mode="fan_in", distribution="truncated_normal")


def dense(x, units: int, name: str, activation=None, use_bias: bool = True, initializer=None):
    """x @ W + b; x is flattened to 2-D first."""
    with v1.variable_scope(name):
        x = flatten(x)
        w = v1.get_variable("weights", [int(x.shape[-1]), units], initializer=initializer or _he_init())
        y = tf.matmul(x, w)
        if use_bias:
            y = tf.nn.bias_add(y, v1.get_variable("biases", [units], initializer=v1.zeros_initializer()))
        return activation(y) if activation else y


def conv2d(
    x,
    filters: int,
    kernel_size: int | tuple[int, int],
    name: str,
    strides: int = 1,
    padding: str = "SAME",
    activation=None,
    use_bias: bool = True,
    initializer=None,
):
    """2-D convolution, NHWC."""
    kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
    with v1.variable_scope(name):
        w = v1.get_variable(
            "weights", [kh, kw, int(x.shape[-1]), filters], initializer=initializer or _he_init()
        )
        y = tf.nn.conv2d(x, w, strides=[1, strides, strides, 1], padding=padding)
        if use_bias:
            y = tf.nn.bias_add(y, v1.get_variable("biases", [filters], initializer=v1.zeros_initializer()))
        return activation(y) if activation else y


def batch_norm(
    x, training: bool, name: str, momentum: float = 0.9, epsilon: float = 1e-5, scale: bool = True
):
    """Batch normalisation over all axes but the last.

    In training it normalises with the batch's statistics and adds the
    moving-average updates to UPDATE_OPS (strategies run them with the train
    op); in inference it uses the moving statistics. The moving statistics
    are non-trainable variables, so they are placed like any variable but
    never receive gradients.
    """
    channels = int(x.shape[-1])
    axes = list(range(len(x.shape) - 1))
    with v1.variable_scope(name):
        beta = v1.get_variable("beta", [channels], initializer=v1.zeros_initializer())
        gamma = v1.get_variable("gamma", [channels], initializer=v1.ones_initializer()) if scale else None
        stats = dict(
            trainable=False,
            collections=[v1.GraphKeys.GLOBAL_VARIABLES, v1.GraphKeys.MOVING_AVERAGE_VARIABLES],
        )
        moving_mean = v1.get_variable("moving_mean", [channels], initializer=v1.zeros_initializer(), **stats)
        moving_var = v1.get_variable(
            "moving_variance", [channels], initializer=v1.ones_initializer(), **stats
        )
        if training:
            mean, variance = tf.nn.moments(x, axes)
            decay = 1.0 - momentum
            v1.add_to_collection(
                v1.GraphKeys.UPDATE_OPS, moving_mean.assign_sub((moving_mean - mean) * decay)
            )
            v1.add_to_collection(
                v1.GraphKeys.UPDATE_OPS, moving_var.assign_sub((moving_var - variance) * decay)
            )
        else:
            mean, variance = moving_mean, moving_var
        return tf.nn.batch_normalization(x, mean, variance, beta, gamma, epsilon)


def max_pool(x, size: int, strides: int, padding: str = "SAME"):
    return tf.nn.max_pool2d(x, size, strides, padding)


def avg_pool(x, size: int, strides: int, padding: str = "SAME"):
    return tf.nn.avg_pool2d(x, size, strides, padding)


def global_avg_pool(x):
    return tf.reduce_mean(x, axis=[1, 2])


def flatten(x):
    if len(x.shape) == 2:
        return x
    return tf.reshape(x, [-1, int(tf.TensorShape(x.shape[1:]).num_elements())])


def dropout(x, rate: float, training: bool):
    return tf.nn.dropout(x, rate=rate) if training and rate > 0 else x
