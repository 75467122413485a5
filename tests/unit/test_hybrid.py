"""SyncHybrid on built graphs, no servers: where each half lives, what crosses the network, memory caps."""

import pytest
import tensorflow as tf

import disttrain  # noqa: F401  (graph mode)
from disttrain.base.cluster import Cluster
from disttrain.base.errors import ConfigError
from disttrain.runtime import trainer
from disttrain.strategies import SyncAllReduce, SyncHybrid
from model_zoo import inputs
from model_zoo.dlrm import DLRM

v1 = tf.compat.v1


def cluster(task=1, num_ps=2):
    return Cluster.from_hosts("worker", task, [f"p{i}:1" for i in range(num_ps)], ["w0:1", "w1:1"])


def model() -> DLRM:
    return DLRM(vocab_sizes=(1000, 50, 20), embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(16,))


def build(strategy, dlrm: DLRM):
    graph = tf.Graph()
    with graph.as_default():
        strategy.plan_placement(dlrm.build_variables)
        with strategy.scope():
            global_step = v1.train.get_or_create_global_step()

            def loss_fn():
                features, labels = v1.data.make_one_shot_iterator(inputs.criteo_synthetic(dlrm, 4)).get_next()
                return dlrm.training_loss(features, labels)

            strategy.minimize(v1.train.AdamOptimizer(0.01), loss_fn, global_step)
    return graph


def devices(graph) -> dict[str, str]:
    return {v.op.name: tf.DeviceSpec.from_string(v.device).job for v in graph.get_collection("variables")}


def test_tables_live_on_the_ps_and_everything_else_on_the_replica():
    graph = build(SyncHybrid(cluster(), densify_below_bytes=0), model())
    where = devices(graph)
    tables = {name for name in where if "embedding" in name}
    assert tables and all(where[name] == "ps" for name in tables), where
    assert where["hybrid_table_step"] == "ps"
    assert where["beta1_power_1"] == "ps"  # the tables' optimizer keeps its state beside them
    dense = {
        name
        for name in where
        if name not in tables and name not in ("hybrid_table_step", "beta1_power_1", "beta2_power_1")
    }
    assert dense and all(where[name] == "worker" for name in dense), where
    # The big table is cut by rows over both PS; the dense half is summed over the ring.
    assert "dlrm/embedding_0/table/part_1" in where
    types = {op.type for op in graph.get_operations()}
    assert {"CollectiveReduceV2", "SparseConditionalAccumulator"} <= types
    assert "ConditionalAccumulator" not in types  # no dense gradient goes through the PS


def test_a_table_of_at_most_densify_below_bytes_stays_with_the_dense_half():
    """1000 x 8 floats (32,000 bytes) go to the PS; 50 x 8 and 20 x 8 stay and are summed in the ring."""
    graph = build(SyncHybrid(cluster(), densify_below_bytes=2000), model())
    where = devices(graph)
    assert where["dlrm/embedding_0/table/part_0"] == where["dlrm/embedding_0/table/part_1"] == "ps"
    assert where["dlrm/embedding_1/table"] == where["dlrm/embedding_2/table"] == "worker", where
    accumulators = [op for op in graph.get_operations() if op.type == "SparseConditionalAccumulator"]
    assert len(accumulators) == 2, [op.name for op in accumulators]  # embedding_0's two parts alone
    # The small tables' gradients are dense in the ring's buckets: no row of theirs is all-gathered.
    assert not [op for op in graph.get_operations() if op.type == "CollectiveGatherV2"]
    # By default (256 KiB) every table of this model is that small: nothing of it lives on a PS.
    where = devices(build(SyncHybrid(cluster()), model()))
    assert {job for name, job in where.items() if "embedding" in name} == {"worker"}, where


def test_a_replica_memory_cap_refuses_all_reduce_naming_the_table_and_admits_the_hybrid():
    big = DLRM(vocab_sizes=(20000, 50, 20), embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(16,))
    cap = 200_000  # bytes: the dense half and its Adam slots fit, a 20,000 x 8 table does not
    ring = build(SyncAllReduce(cluster()), big)
    with pytest.raises(ConfigError) as refused:
        trainer.check_replica_memory(ring, "/job:worker/task:1", cap)
    message = str(refused.value)
    assert "over replica_memory_bytes=200000" in message and "dlrm/embedding_0/table" in message, message
    assert "SyncHybrid" in message
    trainer.check_replica_memory(build(SyncHybrid(cluster()), big), "/job:worker/task:1", cap)
