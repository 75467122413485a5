"""16-bit transfer: float32 values cross the network in 16 bits, cast on the side that sends them.

A strategy with `transfer_dtype` ('float16' or 'bfloat16') keeps its
variables, optimizer state and updates in float32; only what crosses between
tasks is narrowed, each cast on the sending side so that the 16-bit tensor is
the one TF sends:

- a gradient leaves the worker in 16 bits (`leaving`, on the worker) and
  becomes float32 again on its variable's PS (`arriving`), before an
  optimizer or an accumulator sees it; a sparse gradient's values are cast,
  its indices stay integers;
- a read of a trainable variable on a PS that a step sends to another task
  (a whole read, a piece, a table's looked-up rows) is cast on the PS and
  back to float32 where it is received (`narrow_reads`, after the graph is
  built, by rewiring the receiving ops).

With no transfer dtype nothing here adds an op. The all-reduce narrows its
own buckets (`strategies.allreduce`): there is no PS on its path. Not
narrowed: non-trainable variables (a learning rate or batch-norm statistics
keep every bit), and a value computed on the PS from a read by anything but
an Identity.
"""

from __future__ import annotations

from collections.abc import Iterable

import tensorflow as tf

from disttrain.base import tf_internals
from disttrain.base.errors import ConfigError
from disttrain.graph import placement
from disttrain.strategies import sparse

DTYPES = {None: None, "float32": None, "float16": tf.float16, "bfloat16": tf.bfloat16}
_READ_OPS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd"})


def parse(transfer_dtype: str | None, owner: str) -> tf.DType | None:
    """The 16-bit dtype a `transfer_dtype` setting names (None: float32), or one line on what is wrong."""
    if transfer_dtype not in DTYPES:
        raise ConfigError(
            f"{owner}.transfer_dtype={transfer_dtype!r}: expected None, 'float32', 'float16' or 'bfloat16'"
        )
    return DTYPES[transfer_dtype]


def _values(grad) -> tf.Tensor:
    return grad.values if sparse.is_sparse(grad) else grad


def _cast(grad, dtype: tf.DType):
    """A dense gradient, or a sparse one's values (not its indices), cast to `dtype`."""
    values = tf.cast(_values(grad), dtype)
    return tf.IndexedSlices(values, grad.indices, grad.dense_shape) if sparse.is_sparse(grad) else values


def leaving(grads_and_vars, dtype: tf.DType | None) -> list:
    """The float32 gradients cast to `dtype` where they are built, to be sent (as given without one)."""
    if dtype is None:
        return list(grads_and_vars)
    with tf.name_scope("to_wire"):
        return [(_cast(g, dtype) if _values(g).dtype == tf.float32 else g, v) for g, v in grads_and_vars]


def arriving(grad, var):
    """A gradient as sent, back in its variable's dtype on the variable's device (if it was narrowed)."""
    if _values(grad).dtype.base_dtype == var.dtype.base_dtype:
        return grad
    with tf.device(var.device), tf.name_scope("from_wire"):
        return _cast(grad, var.dtype.base_dtype)


def arrived(grads_and_vars) -> list:
    """`arriving` for every pair."""
    return [(arriving(g, v), v) for g, v in grads_and_vars]


def narrow_reads(fetches: Iterable, dtype: tf.DType | None) -> int:
    """Send every read of a trainable PS variable that a run of `fetches` moves to another task in `dtype`.

    A read (a variable's value, a piece's, a table's gathered rows, or an
    Identity of one on the same task) whose consumers run on another task
    is cast to `dtype` on the PS, and each receiving device gets one cast
    back to float32 that its consumers take instead. Only ops that a run of
    `fetches` runs are rewired (never a checkpoint's or an initializer's
    read), and none in v1 control flow. Returns how many reads now cross
    in 16 bits; 0 without a dtype.
    """
    fetches = [f.op if isinstance(f, tf.Tensor) else f for f in fetches if f is not None]
    if dtype is None or not fetches:
        return 0
    graph = fetches[0].graph
    step = ancestors(fetches)
    variables = graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    trainable = {part.handle.op for v in variables for part in placement.variable_parts(v)}
    narrowed = 0
    for op in [op for op in graph.get_operations() if op in step and op.type in _READ_OPS]:
        variable = _variable_of(op)
        if variable not in trainable or op.outputs[0].dtype != tf.float32:
            continue
        device = variable.device
        task = placement.task_of(device)
        if task[0] != "ps":
            continue
        for tensor, edges in _crossing(op.outputs[0], task, step).items():
            _narrow(tensor, edges, device, dtype)
            narrowed += 1
    return narrowed


def _variable_of(read: tf.Operation) -> tf.Operation:
    """The variable op whose handle `read` takes (through Identities and a function graph's capture)."""
    handle = placement.captured(read.inputs[0])
    while handle.op.type == "Identity":
        handle = placement.captured(handle.op.inputs[0])
    return handle.op


def _crossing(tensor: tf.Tensor, task, step) -> dict[tf.Tensor, list[tuple[tf.Operation, int]]]:
    """The (consumer, input index) pairs on other tasks that take `tensor`, or an Identity of it on `task`."""
    found: dict[tf.Tensor, list] = {}
    for consumer in tensor.consumers():
        if consumer not in step or tf_internals.in_control_flow(consumer):
            continue
        where = placement.task_of(placement.placed_device(consumer))
        if where == task:
            if consumer.type == "Identity":
                for inner, edges in _crossing(consumer.outputs[0], task, step).items():
                    found.setdefault(inner, []).extend(edges)
            continue
        for index, given in enumerate(consumer.inputs):
            if given is tensor:
                found.setdefault(tensor, []).append((consumer, index))
    return found


def _narrow(tensor: tf.Tensor, edges, device: str, dtype: tf.DType) -> None:
    """Cast `tensor` to `dtype` on `device`, and back on each receiving device; rewire `edges` there."""
    graph = tensor.graph
    with (
        graph.control_dependencies(None),
        graph.colocate_with(None, ignore_existing=True),
        graph.name_scope(f"{tensor.op.name}/"),
    ):
        with graph.device(device):
            sent = tf.cast(tensor, dtype, name="to_wire")
        received: dict[str, tf.Tensor] = {}
        for consumer, index in edges:
            where = placement.placed_device(consumer)
            if where not in received:
                with graph.device(where):
                    received[where] = tf.cast(sent, tensor.dtype, name="from_wire")
            tf_internals.update_input(consumer, index, received[where])


def ancestors(ops) -> set[tf.Operation]:
    """Every op a run of `ops` runs: they and what they depend on, through data and control inputs."""
    seen, todo = set(ops), list(ops)
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen
