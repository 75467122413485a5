"""16-bit transfer on built graphs, no servers: the bytes of every tensor a step sends between tasks.

Each strategy and mode builds the same model (two dense layers cut into
pieces by the plan, and an embedding table spread by rows over 2 PS) on
worker 1 of 2, with transfer_dtype None and 'bfloat16'. A tensor crosses
when its producer and a consumer that a step runs are on different tasks,
placed as TF's placer places them (`placement.placed_device`: a read goes
where its variable is, whatever device was requested; tests/cluster/
test_transfer_wire.py checks the same against the partition graphs TF
really runs). Its bytes are its dtype's size times its static shape (an
unknown dimension, a step's rows, counts 1). The all-reduce sends what its
collectives take.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf

from disttrain.base.cluster import Cluster
from disttrain.base.errors import ConfigError
from disttrain.graph import placement
from disttrain.strategies import (
    AsyncParameterServer,
    SyncAllReduce,
    SyncHybrid,
    SyncParameterServer,
    transfer,
)

v1 = tf.compat.v1

_COLLECTIVES = ("CollectiveReduceV2", "CollectiveGather")


def ps_cluster() -> Cluster:
    return Cluster.from_hosts("worker", 1, ["p0:1", "p1:1"], ["w0:1", "w1:1"])


def ring_cluster() -> Cluster:
    return Cluster.from_hosts("worker", 1, (), ["w0:1", "w1:1"], chief_host="c:1")


def loss_fn():
    """Two dense layers (256 KiB and 10 KiB) over 64 looked-up rows of a 1000 x 64 table."""
    ids = tf.constant(np.arange(64) * 7 % 1000, tf.int64)
    rows = tf.nn.embedding_lookup(v1.get_variable("table", [1000, 64]), ids)
    hidden = tf.nn.relu(tf.matmul(tf.reshape(rows, [16, 256]), v1.get_variable("w1", [256, 256])))
    return tf.reduce_sum(tf.matmul(hidden, v1.get_variable("w2", [256, 10])))


def keras_loss_fn():
    """The same with Keras 3 layers (placed whole after the build; the embedding gathers on its PS)."""
    import keras

    ids = tf.constant(np.arange(64) * 7 % 2000, tf.int64)
    rows = keras.layers.Embedding(2000, 64)(ids)
    hidden = keras.layers.Dense(256, activation="relu")(tf.reshape(rows, [16, 256]))
    return tf.reduce_sum(keras.layers.Dense(10)(hidden))


MODES = {
    "async": (AsyncParameterServer, ps_cluster, {}),
    "async_pieces": (AsyncParameterServer, ps_cluster, {"piece_bytes": 65536}),
    "async_overlap": (AsyncParameterServer, ps_cluster, {"overlap": True}),
    "async_overlap_pieces": (AsyncParameterServer, ps_cluster, {"overlap": True, "piece_bytes": 65536}),
    "async_towers": (AsyncParameterServer, ps_cluster, {"num_towers": 2}),
    "sync_ps": (SyncParameterServer, ps_cluster, {}),
    "sync_ps_pieces": (SyncParameterServer, ps_cluster, {"piece_bytes": 65536}),
    "sync_ps_towers": (SyncParameterServer, ps_cluster, {"num_towers": 2}),
    "allreduce": (SyncAllReduce, ring_cluster, {"densify_below_bytes": 0}),
    # The table's rows from its PS (which it is with densify_below_bytes=0), the dense layers over the ring.
    "hybrid": (SyncHybrid, ps_cluster, {"densify_below_bytes": 0}),
    "async_keras": (AsyncParameterServer, ps_cluster, {}),
    "async_overlap_keras": (AsyncParameterServer, ps_cluster, {"overlap": True}),
    "sync_ps_keras": (SyncParameterServer, ps_cluster, {}),
}


def built(mode: str, transfer_dtype: str | None) -> tuple[tf.Graph, list[tf.Operation]]:
    """The model's training graph under `mode`; and what a step runs (with overlap, its transfer too)."""
    cls, cluster, knobs = MODES[mode]
    strategy = cls(cluster(), transfer_dtype=transfer_dtype, **knobs)
    with tf.Graph().as_default() as graph, strategy.scope():
        model = keras_loss_fn if mode.endswith("keras") else loss_fn
        train_op = strategy.minimize(v1.train.AdamOptimizer(0.1), model)
    return graph, [train_op, *([strategy.transfer_op] if getattr(strategy, "transfer_op", None) else [])]


def nbytes(tensor: tf.Tensor) -> int:
    dims = tensor.shape.as_list() if tensor.shape.rank is not None else []
    return int(np.prod([d or 1 for d in dims])) * tensor.dtype.size


def crossing(fetches) -> list[tf.Tensor]:
    """The tensors a step sends from one task to another: once per (tensor, receiving device)."""
    ops = transfer.ancestors(fetches)
    sent = {}
    for op in ops:
        to = placement.placed_device(op)
        for tensor in op.inputs:
            source = placement.placed_device(tensor.op)
            if tensor.op in ops and placement.task_of(source) != placement.task_of(to):
                sent[(tensor.ref(), to)] = tensor
    return list(sent.values())


def wire_bytes(fetches) -> int:
    """Bytes a step sends between tasks: crossing tensors, and what the all-reduce's collectives take."""
    collectives = [op for op in transfer.ancestors(fetches) if op.type in _COLLECTIVES]
    return sum(nbytes(t) for t in crossing(fetches)) + sum(nbytes(op.inputs[0]) for op in collectives)


@functools.cache
def measured(mode: str, transfer_dtype: str | None) -> tuple[int, list[str]]:
    """(wire bytes, the crossing float32 tensors of more than one element) of a step of `mode`."""
    graph, fetches = built(mode, transfer_dtype)
    with graph.as_default():
        wide = [
            t.name for t in crossing(fetches) if t.dtype == tf.float32 and (t.shape.num_elements() or 2) > 1
        ]
        return wire_bytes(fetches), wide


@pytest.mark.parametrize("mode", list(MODES))
def test_16_bit_transfer_sends_at_most_0_55_of_float32s_bytes(mode):
    full, _ = measured(mode, None)
    half, wide = measured(mode, "bfloat16")
    assert full > 256 * 256 * 4  # the model's dense bytes at least cross (or reach a collective)
    assert half <= 0.55 * full, (mode, half, full, wide)
    assert wide == [], f"{mode}: float32 tensors still cross: {wide}"


@pytest.mark.parametrize("mode", ["async", "async_overlap", "sync_ps", "hybrid"])
def test_table_rows_cross_in_16_bits_and_their_indices_as_integers(mode):
    graph, fetches = built(mode, "bfloat16")
    with graph.as_default():
        rows = [t for t in crossing(fetches) if "embedding_lookup" in t.name or "table" in t.name]
        rows = [t for t in rows if t.shape.rank]  # not Adam's scalars (beta powers) beside the update
    dtypes = {t.dtype for t in rows}
    assert tf.bfloat16 in dtypes and tf.float32 not in dtypes, [(t.name, t.dtype.name) for t in rows]
    assert dtypes & {tf.int64, tf.int32}, [(t.name, t.dtype.name) for t in rows]


@pytest.mark.parametrize("mode", list(MODES))
def test_no_transfer_dtype_adds_no_op(mode):
    graph, _ = built(mode, None)
    names = [op.name for op in graph.get_operations()]
    assert not [n for n in names if "to_wire" in n or "from_wire" in n]
    assert not [op for op in graph.get_operations() if op.type == "Cast" and tf.bfloat16 in _cast_types(op)]


def _cast_types(op) -> set:
    return {op.get_attr("SrcT"), op.get_attr("DstT")}


@pytest.mark.parametrize("mode", ["async", "async_overlap", "sync_ps"])
def test_master_weights_optimizer_state_and_updates_stay_float32_on_the_ps(mode):
    graph, _ = built(mode, "bfloat16")
    updates = ("ResourceApply", "ResourceSparseApply")
    applies = [op for op in graph.get_operations() if op.type.startswith(updates)]
    assert applies
    for op in applies:
        assert placement.task_of(placement.placed_device(op))[0] == "ps", op.name
        floats = [t for t in op.inputs if t.dtype.is_floating]
        assert all(t.dtype == tf.float32 for t in floats), (op.name, [t.dtype.name for t in floats])
    variables = [op for op in graph.get_operations() if op.type == "VarHandleOp" and "/job:ps" in op.device]
    assert {tf.as_dtype(op.get_attr("dtype")) for op in variables} <= {tf.float32, tf.int64}


@pytest.mark.parametrize("cls", [AsyncParameterServer, SyncParameterServer, SyncAllReduce])
def test_a_transfer_dtype_that_is_not_16_bits_is_refused_in_one_line(cls):
    with pytest.raises(ConfigError, match=rf"{cls.__name__}\.transfer_dtype='int8': expected None"):
        cls(ps_cluster(), transfer_dtype="int8")


def test_every_strategy_declares_transfer_dtype_a_knob():
    for cls in (AsyncParameterServer, SyncParameterServer, SyncAllReduce, SyncHybrid):
        assert "transfer_dtype" in cls.knobs
