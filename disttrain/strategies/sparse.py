"""Sparse gradients (`tf.IndexedSlices`): the rows of an embedding table a step touched, and their grads.

Every strategy keeps them sparse from the worker to the update: they are
deduplicated where they are computed (one row per distinct id, so a row is
sent once however often the batch looked it up), averaged over towers by
concatenation, and never converted to a dense tensor of the table's shape.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import tensorflow as tf

from disttrain.base import tf_internals


def is_sparse(grad) -> bool:
    return isinstance(grad, tf.IndexedSlices)


def deduplicated(grad: tf.IndexedSlices) -> tf.IndexedSlices:
    """The same gradient with one row per distinct index (duplicates summed), indices int64."""
    indices = tf.cast(grad.indices, tf.int64)
    unique, positions = tf.unique(indices)
    values = tf.math.unsorted_segment_sum(grad.values, positions, tf.shape(unique)[0])
    return tf.IndexedSlices(values, unique, grad.dense_shape)


def mean(grads: list[tf.IndexedSlices]) -> tf.IndexedSlices:
    """The mean of sparse gradients of one variable: their rows side by side, scaled by 1/len."""
    if len(grads) == 1:
        return grads[0]
    values = tf.concat([g.values for g in grads], axis=0) / tf.cast(len(grads), grads[0].values.dtype)
    indices = tf.concat([tf.cast(g.indices, tf.int64) for g in grads], axis=0)
    return tf.IndexedSlices(values, indices, grads[0].dense_shape)


def summed(grads: list[tf.IndexedSlices]) -> tf.IndexedSlices:
    """The sum of sparse gradients of one variable: their rows side by side."""
    values = tf.concat([g.values for g in grads], axis=0)
    indices = tf.concat([tf.cast(g.indices, tf.int64) for g in grads], axis=0)
    return tf.IndexedSlices(values, indices, grads[0].dense_shape)


def scaled(grad, weight: tf.Tensor):
    """`grad` (dense or rows) times a float32 scalar `weight`; rows with weight 0 are no rows at all.

    A row whose gradient is zero is not nothing: a sparse update (momentum,
    Adam) still moves that row's slots and value, so a gradient that weighs
    nothing (a batch whose data ended) must name no row.
    """
    if is_sparse(grad):
        kept = tf.shape(grad.indices)[0] * tf.cast(weight > 0, tf.int32)
        values = grad.values[:kept] * tf.cast(weight, grad.values.dtype)
        return tf.IndexedSlices(values, grad.indices[:kept], grad.dense_shape)
    return grad * tf.cast(weight, grad.dtype)


def shape_of(var) -> tf.Tensor:
    """A variable's full shape as a constant: the dense shape of its sparse gradients."""
    return tf.constant(var.shape.as_list(), tf.int64)


# A table this small is read whole: that costs a step about what a batch's rows would (1,024 ids
# of 64 floats are 256 KiB), and far less than rows for the few-row vocabularies of some features.
READ_WHOLE_MAX_BYTES = 2**18


def gather_on_tables(
    ops: Iterable[tf.Operation], keep: Collection[tf.Tensor] = (), min_bytes: int = READ_WHOLE_MAX_BYTES
) -> int:
    """Make gathers from a whole read of a variable gather on the variable instead; return how many.

    Keras 3's Embedding looks rows up in a read of its whole table
    (GatherV2(ReadVariableOp(handle), ids, axis=0)), and the gather runs on
    the worker: the whole table would cross the network every step. Each
    such gather among `ops` is replaced by a ResourceGather on the handle,
    colocated with the variable, as `tf.nn.embedding_lookup` does: only the
    rows travel, and the table's gradient stays IndexedSlices (as the
    gather's was) for the sparse paths of every strategy. The old read and
    gather stay in the graph unused; other reads of the variable are left as
    they are. Left alone: variables of at most `min_bytes`, gathers in v1
    control flow, gathers from anything but a plain read (a cast, a slice),
    and reads in `keep` (the tensors gradients are taken with respect to,
    such as worker-side copies). Call it after the forward graph is built
    and before gradients are taken.
    """
    keep = {t.ref() for t in keep}
    replaced = 0
    for gather in list(ops):
        if (
            gather.type != "GatherV2"
            or tf_internals.in_control_flow(gather)
            or not gather.outputs[0].consumers()  # nothing to reroute (one moved before, say)
        ):
            continue
        params, ids, axis = gather.inputs
        read = params.op
        if (
            read.type != "ReadVariableOp"
            or read.inputs[0].op.type != "VarHandleOp"
            or tf_internals.in_control_flow(read)
            or params.ref() in keep
            or gather.get_attr("batch_dims") != 0
            or tf.get_static_value(axis) != 0
        ):
            continue
        handle, graph = read.inputs[0], gather.graph
        elements = tf.TensorShape(handle.op.get_attr("shape")).num_elements()
        if elements is not None and elements * params.dtype.size <= min_bytes:
            continue
        with (
            graph.control_dependencies(None),
            graph.control_dependencies(list(read.control_inputs) + list(gather.control_inputs)),
            graph.colocate_with(handle.op),
            graph.name_scope(gather.name + "/"),
        ):
            rows = tf.raw_ops.ResourceGather(resource=handle, indices=ids, dtype=params.dtype, name="rows")
        rows.set_shape(gather.outputs[0].shape)
        for consumer in gather.outputs[0].consumers():
            for index, tensor in enumerate(consumer.inputs):
                if tensor is gather.outputs[0]:
                    tf_internals.update_input(consumer, index, rows)
        replaced += 1
    return replaced
