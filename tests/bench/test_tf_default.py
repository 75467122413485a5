"""TF's default layout (strategies.tf_default) on built graphs, no servers: each variable's `.device`.

A TF user splits a big embedding table with `fixed_size_partitioner(num_ps)` and lets
`replica_device_setter` deal every variable, the table's parts included, round robin by count.
"""

import re

import pytest
import tensorflow as tf

from disttrain.base.cluster import Cluster
from disttrain.graph import placement
from disttrain.strategies import TFDefault

v1 = tf.compat.v1

ROWS, DIM = 1000, 8
IDS = [[1, 5, 5, 999], [3, 3, 3, 500]]
WORKER = "/job:worker/task:0"


def cluster(num_ps: int) -> Cluster:
    return Cluster.from_hosts("worker", 0, [f"p{i}:1" for i in range(num_ps)], ["w0:1", "w1:1"])


def model(with_table: bool):
    """A loss function: a table (if asked) looked up by `tf.nn.embedding_lookup`, two dense layers."""

    def loss_fn():
        if with_table:
            table = v1.get_variable("emb", [ROWS, DIM])
            x = tf.reduce_sum(tf.nn.embedding_lookup(table, tf.constant(IDS, tf.int64)), axis=1)
        else:
            x = tf.ones([2, DIM])
        h = tf.matmul(x, v1.get_variable("w1", [DIM, 16])) + v1.get_variable("b1", [16])
        return tf.reduce_mean(tf.square(tf.matmul(h, v1.get_variable("w2", [16, 1])) - 1.0))

    return loss_fn


def build(strategy, loss_fn) -> tf.Graph:
    """The training graph as the launcher builds it: plan from the shapes, then scope and minimize."""
    with tf.Graph().as_default() as graph:
        strategy.plan_placement(loss_fn)
        with strategy.scope():
            strategy.minimize(v1.train.AdagradOptimizer(0.1), loss_fn)
    return graph


def model_variables(graph: tf.Graph) -> list[tf.Operation]:
    """Variable ops in creation order, optimizer slots left out."""
    return [
        op
        for op in graph.get_operations()
        if op.type == "VarHandleOp"
        and not any(g != b"loc:@" + op.name.encode() for g in op.colocation_groups())
    ]


def task(op: tf.Operation) -> int:
    spec = tf.DeviceSpec.from_string(op.device)
    assert spec.job == "ps", (op.name, op.device)
    return spec.task


@pytest.mark.parametrize("num_ps", [2, 3])
def test_table_split_into_num_ps_parts_dealt_round_robin(num_ps):
    strategy = TFDefault(cluster(num_ps))
    graph = build(strategy, model(with_table=True))
    assert strategy.tables == {"emb"}
    ops = model_variables(graph)
    names = [op.name for op in ops]
    assert names == ["global_step", *(f"emb/part_{i}" for i in range(num_ps)), "w1", "b1", "w2"]
    # Round robin by count over every variable, the table's parts one by one.
    assert [task(op) for op in ops] == [i % num_ps for i in range(len(ops))]
    parts = [op for op in ops if op.name.startswith("emb/")]
    assert {task(op) for op in parts} == set(range(num_ps))  # one part on each PS
    rows = [tf.TensorShape(op.get_attr("shape")).as_list() for op in parts]
    assert sum(r[0] for r in rows) == ROWS and all(r[1] == DIM for r in rows)  # split by rows only
    # Dense variables stay whole.
    assert not any("/part_" in op.name for op in ops if not op.name.startswith("emb"))
    # Looked up by rows where each part is: gathers on the parts, never the whole table read.
    gathered = {op.inputs[0].op.name for op in graph.get_operations() if op.type == "ResourceGather"}
    assert {op.name for op in parts} <= gathered
    assert placement.mod_lookups(graph) == []  # "div", as the partitioner splits


def test_a_partitioner_the_model_gives_wins():
    def loss_fn():
        table = v1.get_variable("emb", [ROWS, DIM], partitioner=v1.fixed_size_partitioner(5))
        x = tf.reduce_sum(tf.nn.embedding_lookup(table, tf.constant(IDS, tf.int64)), axis=1)
        return tf.reduce_mean(tf.square(tf.matmul(x, v1.get_variable("w", [DIM, 1]))))

    graph = build(TFDefault(cluster(2)), loss_fn)
    assert sum(op.name.startswith("emb/part_") for op in model_variables(graph)) == 5


@pytest.mark.parametrize("num_ps", [2, 3])
def test_no_change_for_a_model_without_tables(num_ps):
    strategy = TFDefault(cluster(num_ps))
    graph = build(strategy, model(with_table=False))
    assert strategy.tables == frozenset()
    # Exactly replica_device_setter around the same model: the same variables on the same PS.
    with tf.Graph().as_default() as plain:
        with plain.device(placement.round_robin_setter(num_ps, WORKER)):
            v1.train.get_or_create_global_step()
            model(with_table=False)()
    devices = lambda g: [(op.name, op.device) for op in model_variables(g)]
    assert devices(graph) == devices(plain)
    assert not any(re.search(r"/part_\d+$", name) for name, _ in devices(graph))


def test_one_process_alone_splits_nothing():
    strategy = TFDefault(Cluster.local())
    graph = build(strategy, model(with_table=True))
    assert [op.name for op in model_variables(graph)] == ["global_step", "emb", "w1", "b1", "w2"]
