"""D and R of a config (traffic.model_bytes): dense bytes whole, table rows as a step looks them up."""

import pytest
import tensorflow as tf

from disttrain.base.config import TrainConfig
from disttrain.base.errors import ConfigError
from disttrain.bench import report
from disttrain.plan.traffic import Table, model_bytes
from model_zoo import inputs
from model_zoo.base import Model
from model_zoo.mlp import MLP

v1 = tf.compat.v1

ROWS, DIM = 1000, 8
# Batches alternate: ids 1, 5, 5, 999, 3, 3, 3, 500 (5 distinct rows), then id 7 eight times (1).
IDS = [[1, 5, 5, 999], [3, 3, 3, 500]]
ALSO = [[7, 7, 7, 7], [7, 7, 7, 7]]


class TableModel(Model):
    """A table looked up by the batch's ids, and one dense layer."""

    num_classes = 2

    def __init__(self, lookup_name: str = "emb"):
        self.lookup_name = lookup_name

    def __call__(self, features, training):
        del training
        table = v1.get_variable("emb", [ROWS, DIM])
        rows = tf.nn.embedding_lookup(table, tf.unique(tf.reshape(features, [-1])).y)
        return tf.matmul(tf.reduce_sum(rows, axis=0, keepdims=True), v1.get_variable("w", [DIM, 2]))

    def build_variables(self):
        self(tf.constant(IDS, tf.int64), training=True)

    def lookups(self, features):
        return {self.lookup_name: features}


def table_input(model, batch_size, replica_index=0, num_replicas=1):
    del model, batch_size, replica_index, num_replicas
    ids = tf.constant([IDS, ALSO], tf.int64)
    return tf.data.Dataset.from_tensor_slices((ids, tf.zeros([2, 2], tf.int32))).repeat()


def test_rows_a_step_looks_up():
    sizes = model_bytes(TrainConfig(model=TableModel(), input_fn=table_input, batch_size=2), batches=4)
    # D: w alone, 8 x 2 float32 = 64 bytes. The table, 1000 x 8 float32 = 32,000 bytes, 32 a row.
    # Over 4 batches (5, 1, 5, 1 distinct ids) a step looks up 3 rows on average, each with its
    # 8-byte index: R = 3 x (32 + 8) = 120 bytes; 3 x 32 / 32,000 = 0.3% of the table.
    assert sizes.dense == 64
    assert sizes.tables == (Table("emb", nbytes=32_000, row_bytes=32, rows_per_step=3.0),)
    assert sizes.sparse == 120
    assert sizes.total == 32_064
    assert sizes.table_fraction_per_step == pytest.approx(0.003)


def test_a_lookup_of_no_variable_is_an_error():
    config = TrainConfig(model=TableModel("embedding"), input_fn=table_input, batch_size=2)
    with pytest.raises(ConfigError, match="'embedding'.*one of emb$"):
        model_bytes(config, batches=1)


def test_a_model_without_tables_is_all_dense():
    config = TrainConfig(model=MLP(32, (64, 64), 10), input_fn=inputs.synthetic, batch_size=8)
    sizes = model_bytes(config)
    # The tiny MLP: 32*64+64 + 64*64+64 + 64*10+10 = 6,922 params = 27,688 bytes, all of them D.
    assert (sizes.dense, sizes.tables, sizes.sparse, sizes.total) == (27_688, (), 0, 27_688)


def test_report_shows_d_and_r_only_for_tables():
    config = {
        "model": "TableModel",
        "model_bytes": 32_064,
        "batch_size": 2,
        "network": "localhost",
        "intra_op_threads": 1,
        "inter_op_threads": 1,
        "cpus": 4,
    }
    plain = report.table({"config": config, "reference": None, "runs": []})
    assert "per replica step" not in plain
    config.update(
        dense_bytes=64, sparse_bytes_per_step=240e3, table_bytes=32e6, table_fraction_per_step=0.006
    )
    line = report.table({"config": config, "reference": None, "runs": []}).splitlines()[1]
    assert line.startswith("per replica step: D 0.0 MB dense (whole), R 0.24 MB of table rows")
    assert "0.60% of 32.0 MB of tables" in line


def test_the_bound_counts_the_bytes_each_system_sends():
    """A 16-bit ring's bound and expected bytes count half of D; TF 2's MWMS beside it sends float32."""
    import gin

    from disttrain.bench import runner
    from disttrain.edges import cli
    from disttrain.plan import traffic

    def load(bindings):
        gin.clear_config()
        return cli.train_config(["gin/mlp_allreduce.gin", "gin/testing/tiny.gin"], list(bindings))

    bench = runner.Benchmark(
        runner.BenchConfig(
            gin_files=("gin/mlp_allreduce.gin",),
            load_config=load,
            gin_params=("SyncAllReduce.transfer_dtype='bfloat16'",),
            workers=(2,),
            systems=("disttrain", "tf2_mwms"),
            strategy="allreduce",
        ),
        log=lambda line: None,
    )
    bench._model = {"every_n": 10, "batch": 8, "bytes": traffic.ModelBytes(dense=27_688)}
    rows = {}
    for system in ("disttrain", "tf2_mwms"):
        spec = runner.RunSpec(system, bench._kind(system), 2, 0, traffic.RING)
        # A run that failed still gets its layout's bound; the reference took 0.1 s a step.
        rows[system] = bench._row(spec, None, 10.0, [{"error": "not run"}])
    # A ring of 2 carries 2D(N-1)/N = D each way per round: 27,688 bytes in float32, 13,844 in 16 bits.
    assert rows["tf2_mwms"]["expected_busiest_link_bytes_per_step"] == 27_688
    assert rows["disttrain"]["expected_busiest_link_bytes_per_step"] == 13_844
    assert rows["disttrain"]["transfer_bytes_per_value"] == 2
    assert rows["tf2_mwms"]["transfer_bytes_per_value"] == 4
