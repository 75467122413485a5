"""A small layer library on `tf.nn` and `get_variable`, for TF 2 graph mode.

Keras 3 layers do not work in v1 graphs (BatchNormalization's moving
statistics silently never update), so models are built from these. Every
layer creates its variables with `tf.compat.v1.get_variable` inside a
variable scope named after the layer, so device setters, partitioners and
tower reuse all apply. Images are NHWC.
"""

from __future__ import annotations

import contextlib
import math

import tensorflow as tf

v1 = tf.compat.v1
_KERNELS: list[list[tuple[str, tf.Tensor]]] = []  # open `kernels()` blocks, innermost last


@contextlib.contextmanager
def kernels():
    """Within: a list of (variable name, tensor) of every dense and conv kernel the layers use.

    The tensors are what `get_variable` returned to the layer (with towers,
    the host's copy), so a loss term on them has gradients where the model's
    do. Biases, batch-norm parameters and embedding tables are not kernels.
    """
    found: list[tuple[str, tf.Tensor]] = []
    _KERNELS.append(found)
    try:
        yield found
    finally:
        _KERNELS.pop()


def _kernel(w):
    if _KERNELS:
        _KERNELS[-1].append((f"{v1.get_variable_scope().name}/weights", w))
    return w


def _he_init():
    return v1.variance_scaling_initializer(scale=2.0, mode="fan_in", distribution="truncated_normal")


def dense(x, units: int, name: str, activation=None, use_bias: bool = True, initializer=None):
    """x @ W + b; x is flattened to 2-D first."""
    with v1.variable_scope(name):
        x = flatten(x)
        w = _kernel(
            v1.get_variable("weights", [int(x.shape[-1]), units], initializer=initializer or _he_init())
        )
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
        w = _kernel(
            v1.get_variable(
                "weights", [kh, kw, int(x.shape[-1]), filters], initializer=initializer or _he_init()
            )
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


def embedding(ids, vocab_size: int, dim: int, name: str, initializer=None):
    """The rows of a [vocab_size, dim] table at `ids` (int64, any shape): shape ids.shape + [dim].

    The table is `get_variable("table")` under `variable_scope(name)`, so a
    custom getter may partition it (a PartitionedVariable works here). Each
    distinct id is read once: the batch's ids are made unique, their rows
    gathered from the table, then spread back to the batch's positions. A
    step therefore moves each distinct row once, and the table's gradient is
    an IndexedSlices over distinct ids (duplicates summed on the worker).

    The lookup is TF 2's `tf.nn.embedding_lookup`, which assigns ids to the
    parts of a partitioned table by contiguous ranges ("div"), as the
    partitioners split it; `tf.compat.v1.nn.embedding_lookup`'s default
    ("mod") would not find id i in row i. Ids are not checked against
    `vocab_size` (an id out of range is an error on CPU, zeros on GPU).

    The default initializer is DLRM's: uniform in +-1/sqrt(vocab_size). A
    large vocabulary starts near zero, so the pairwise dot products of a
    fresh DLRM are near zero and the first steps stay stable; Adagrad, whose
    first updates are about the learning rate whatever a row's scale, moves
    rows off zero as they are looked up.
    """
    if initializer is None:
        limit = 1.0 / math.sqrt(vocab_size)
        initializer = v1.random_uniform_initializer(-limit, limit)
    with v1.variable_scope(name):
        table = v1.get_variable("table", [vocab_size, dim], initializer=initializer)
    unique, positions = tf.unique(tf.reshape(ids, [-1]))
    rows = tf.gather(tf.nn.embedding_lookup(table, unique), positions)
    out = tf.reshape(rows, tf.concat([tf.shape(ids), [dim]], 0))
    out.set_shape(ids.shape.concatenate([dim]))
    return out


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
