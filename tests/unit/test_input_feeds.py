"""NumPy arrays given to datasets are fed when the input starts, not written into the graph (input_feeds)."""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

import disttrain
from disttrain.base.cluster import EVALUATOR, Cluster
from disttrain.edges import zoo_run
from disttrain.strategies import TFDefault
from tests.unit.test_evaluator import tiny_config

v1 = tf.compat.v1
ROWS, COLUMNS, BATCH = 40_000, 25, 400
# 4 MB of float32. Column 0 is the row's index, so that what training read can be checked row by row.
ARRAY = np.random.RandomState(0).rand(ROWS, COLUMNS).astype(np.float32)
ARRAY[:, 0] = np.arange(ROWS)
ROW_IDS = np.arange(ROWS, dtype=np.int64)
SMALL = 1 << 20  # what graph, .meta and event files stay under once the 4 MB arrays are fed, not stored
FEW_STEPS = 5


def _files_over(directory, limit: int, graphs_only: bool = False) -> dict[str, int]:
    """The files under `directory` over `limit` bytes (only graph, .meta and event files: `graphs_only`)."""
    sizes = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            graph = name == "graph.pbtxt" or name.endswith(".meta") or name.startswith("events.out")
            if os.path.getsize(path) > limit and (graph or not graphs_only):
                sizes[os.path.relpath(path, directory)] = os.path.getsize(path)
    return sizes


def _model(batch):
    return tf.reduce_mean(tf.square(tf.matmul(batch / ROWS, v1.get_variable("w", [COLUMNS, 1]))))


def _own_one_shot(ctx):
    del ctx
    return v1.data.make_one_shot_iterator(tf.data.Dataset.from_tensor_slices(ARRAY).batch(BATCH)).get_next()


def _v1_method(ctx):
    del ctx
    return v1.data.Dataset.from_tensor_slices(ARRAY).batch(BATCH).make_one_shot_iterator().get_next()


def _own_initializable(ctx):  # disttrain runs its initializer, with the feed
    del ctx
    dataset = tf.data.Dataset.from_tensors(ARRAY).unbatch().batch(BATCH)
    return v1.data.make_initializable_iterator(dataset).get_next()


def _context(ctx):  # a dict element, through the context's share and its saved iterator
    data = ctx.shard(tf.data.Dataset.from_tensor_slices({"x": ARRAY, "row": ROW_IDS}))
    return ctx.get_next(data.batch(BATCH))["x"]


def _train(strategy, read_fn, logdir, steps=10**6, **settings):
    """Train on what `read_fn(ctx)` reads, to the end of its data or `steps`; the graph and the rows read.

    A tower whose data has ended computes on a stand-in batch (Join): only real batches count.
    """
    batches = []

    def loss_fn(ctx):
        batches.append((read_fn(ctx), ctx.data_present()))
        return _model(batches[-1][0])

    read = []
    with tf.Graph().as_default() as graph:
        with strategy.scope():
            train_op = strategy.minimize(v1.train.GradientDescentOptimizer(0.01), loss_fn, batch_size=BATCH)
        settings = {"save_checkpoint_steps": 20, "log_every_steps": 1000, **settings}
        towers = [b for b in batches if b[0].graph is graph]  # not the scratch build's, for placement
        with disttrain.session(strategy, steps=steps, logdir=str(logdir), batch_size=BATCH, **settings) as s:
            while not s.should_stop():
                fetched = s.run([train_op, towers])[1]
                read.extend(batch for batch, present in fetched if present)
    return graph, np.concatenate(read) if read else np.zeros((0, COLUMNS), np.float32)


@pytest.mark.parametrize("read_fn", [_own_one_shot, _v1_method, _own_initializable, _context])
@pytest.mark.parametrize("strategy", [disttrain.AsyncParameterServer, TFDefault], ids=["async", "tf_default"])
def test_an_array_in_a_loss_fn_is_fed_and_every_row_is_read_once(tmp_path, strategy, read_fn):
    graph, read = _train(strategy(Cluster.local()), read_fn, tmp_path)
    assert graph.as_graph_def().ByteSize() < SMALL
    assert v1.train.export_meta_graph(graph=graph).ByteSize() < SMALL  # what a Saver writes as .meta
    assert not _files_over(tmp_path, SMALL, graphs_only=True)  # input positions hold tf.data's buffers
    assert sorted(read[:, 0].astype(int)) == list(range(ROWS))
    np.testing.assert_array_equal(read[np.argsort(read[:, 0])], ARRAY)


def test_towers_share_an_array_through_ctx_shard_and_together_read_it_once(tmp_path):
    strategy = disttrain.AsyncParameterServer(Cluster.local(), num_towers=2)
    graph, read = _train(strategy, _context, tmp_path)
    assert graph.as_graph_def().ByteSize() < SMALL
    placeholders = [op for op in graph.get_operations() if op.type == "Placeholder"]
    assert len(placeholders) == 2  # one per array, fed once for both towers
    assert sorted(read[:, 0].astype(int)) == list(range(ROWS))


def test_a_restart_resumes_a_fed_input_from_its_saved_position(tmp_path):
    strategy = lambda: disttrain.AsyncParameterServer(Cluster.local())  # noqa: E731
    _, first = _train(strategy(), _context, tmp_path, steps=FEW_STEPS)
    graph, second = _train(strategy(), _context, tmp_path, steps=2 * FEW_STEPS)
    assert graph.as_graph_def().ByteSize() < SMALL  # fed, and still resumed
    assert list(first[:, 0].astype(int)) == list(range(FEW_STEPS * BATCH))
    assert list(second[:, 0].astype(int)) == list(range(FEW_STEPS * BATCH, 2 * FEW_STEPS * BATCH))


def _looked_up(ctx, one_shot_of_its_own=False):
    """Rows whose column 0 a vocabulary's lookup table maps from a string key: a dataset that captures
    a stateful op, which TF refuses to read through a one-shot iterator."""
    keys = tf.strings.as_string(tf.range(ROWS, dtype=tf.int64))
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, tf.range(ROWS)), -1)
    data = tf.data.Dataset.range(ROWS).map(lambda i: tf.strings.as_string(i))
    data = data.map(lambda key: tf.fill([COLUMNS], tf.cast(table.lookup(key), tf.float32))).batch(BATCH)
    if one_shot_of_its_own:
        return v1.data.make_one_shot_iterator(data).get_next()
    return ctx.get_next(ctx.shard(data.unbatch()).batch(BATCH))


@pytest.mark.parametrize("own", [False, True], ids=["get_next", "own_one_shot"])
def test_a_dataset_that_captures_a_lookup_table_is_read_once_and_resumed(tmp_path, own):
    """Its iterator is made initialisable and started after the tables, as TF advises."""
    read_fn = lambda ctx: _looked_up(ctx, one_shot_of_its_own=own)  # noqa: E731
    strategy = lambda: disttrain.AsyncParameterServer(Cluster.local())  # noqa: E731
    if own:  # an iterator of its own has no saved position: one run reads it all
        _, read = _train(strategy(), read_fn, tmp_path)
        assert sorted(read[:, 0].astype(int)) == list(range(ROWS))
        return
    _, first = _train(strategy(), read_fn, tmp_path, steps=FEW_STEPS)
    _, second = _train(strategy(), read_fn, tmp_path)
    assert list(first[:, 0].astype(int)) == list(range(FEW_STEPS * BATCH))
    assert list(second[:, 0].astype(int)) == list(range(FEW_STEPS * BATCH, ROWS))


def test_a_constant_left_in_the_graph_is_warned_about_once_by_name_and_size(tmp_path, capsys):
    def constant(ctx):
        del ctx
        dataset = tf.data.Dataset.from_tensor_slices(tf.constant(ARRAY, name="kept")).repeat().batch(BATCH)
        return v1.data.make_one_shot_iterator(dataset).get_next()

    _train(disttrain.AsyncParameterServer(Cluster.local()), constant, tmp_path / "kept", steps=FEW_STEPS)
    warned = [line for line in capsys.readouterr().out.splitlines() if "constant of" in line]
    assert len(warned) == 1, warned
    # The one-shot iterator's function holds its copy; the graph holds the original.
    assert "WARNING" in warned[0] and "3.8 MiB (kept)" in warned[0] and "from_tensor_slices" in warned[0]
    _train(disttrain.AsyncParameterServer(Cluster.local()), _context, tmp_path / "fed", steps=FEW_STEPS)
    assert "constant of" not in capsys.readouterr().out


def test_fit_in_one_process_on_six_megabytes_of_arrays_writes_no_file_over_5_mb(tmp_path):
    features = np.random.RandomState(1).rand(60_000, COLUMNS).astype(np.float32)
    labels = (features.sum(axis=1) > COLUMNS / 2).astype(np.int32)

    def loss_fn(ctx):
        x, y = ctx.get_next(ctx.shard(tf.data.Dataset.from_tensor_slices((features, labels))).batch(BATCH))
        logits = tf.matmul(x, v1.get_variable("w", [COLUMNS, 2]))
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))

    with tf.Graph().as_default():
        result = disttrain.fit(
            loss_fn,
            lambda: v1.train.GradientDescentOptimizer(0.1),
            steps=10**6,
            logdir=str(tmp_path),
            batch_size=BATCH,
            save_checkpoint_steps=50,
        )
    assert result.local_steps == len(labels) // BATCH  # the whole epoch
    assert not _files_over(tmp_path, 5 * 10**6)


def _numpy_input(model, batch_size, replica_index, num_replicas):
    """A zoo input function over NumPy arrays (4 MB of features)."""
    rng = np.random.RandomState(replica_index)
    features = rng.rand(32_000, *model.input_shape).astype(np.float32)
    labels = rng.randint(model.num_classes, size=len(features)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(batch_size)


def test_a_zoo_input_of_arrays_is_fed_in_training_and_in_the_evaluator(tmp_path):
    config = dataclasses.replace(tiny_config(20), input_fn=_numpy_input, eval_input_fn=_numpy_input)
    with tf.Graph().as_default():
        assert zoo_run.run(Cluster.local(), config, str(tmp_path)) == 0
    evaluator = Cluster(jobs={"worker": ["localhost:1"]}, task_type=EVALUATOR, task_index=0)
    assert zoo_run.run(evaluator, config, str(tmp_path)) == 0  # evaluates the last checkpoint, then stops
    assert not _files_over(tmp_path, SMALL, graphs_only=True)
    assert os.listdir(tmp_path / "eval")
