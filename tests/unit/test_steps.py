"""Gradient accumulation and several steps per run, in one process with no servers.

A small model with a dense layer and an embedding table (so both dense and
sparse gradients) trains from seeded weights on fixed data read through
`InputContext.get_next`, and the weights are compared:
- `accumulate_steps=k` at batch B with one at k x B (towers too, uneven
  data too: a micro-batch whose data ended weighs nothing);
- `steps_per_run=k` with k runs of one step (uneven data too: the steps of a
  run after the data ended change nothing; a fed last step stops a run).
Every strategy applies its update directly in one process; the cluster
paths (queues, collectives, the aggregator) are tests/cluster/test_steps.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disttrain
from disttrain import (
    AsyncParameterServer,
    Cluster,
    RunSettings,
    SyncAllReduce,
    SyncHybrid,
    SyncParameterServer,
)
from disttrain.base.errors import ConfigError
from disttrain.graph import input_feeds
from disttrain.strategies import TFDefault, transfer

v1 = tf.compat.v1

ROWS, DIM, VOCAB, WIDTH, CLASSES = 96, 6, 40, 4, 3
STRATEGIES = [AsyncParameterServer, SyncParameterServer, SyncAllReduce, SyncHybrid, TFDefault]


def data(rows=ROWS):
    rng = np.random.RandomState(0)
    x = rng.randn(rows, DIM).astype(np.float32)
    ids = rng.randint(0, VOCAB, (rows, 3)).astype(np.int64)
    y = (np.abs(x[:, 0] * 3 + ids[:, 0] % 3)).astype(np.int32) % CLASSES
    return x, ids, y


def initial():
    rng = np.random.RandomState(1)
    return {
        "emb": rng.randn(VOCAB, WIDTH).astype(np.float32) * 0.3,
        "w": rng.randn(DIM + WIDTH, CLASSES).astype(np.float32) * 0.3,
        "b": np.zeros(CLASSES, np.float32),
    }


def make_loss_fn(batch: int, rows=ROWS, repeat=True):
    """Pipeline p of n reads rows [p*batch, (p+1)*batch) of each window of n*batch rows."""
    x, ids, y = data(rows)

    def loss_fn(ctx):
        begin, window = ctx.input_pipeline_id * batch, ctx.num_input_pipelines * batch
        dataset = tf.data.Dataset.from_tensor_slices((x, ids, y))
        dataset = (dataset.repeat() if repeat else dataset).batch(window)
        features, rows_ids, labels = ctx.get_next(
            dataset.map(
                lambda a, b, c: (a[begin : begin + batch], b[begin : begin + batch], c[begin : begin + batch])
            )
        )
        w = {n: v1.get_variable(n, initializer=tf.constant(v)) for n, v in initial().items()}
        looked_up = tf.reduce_sum(tf.nn.embedding_lookup(w["emb"], rows_ids), axis=1)
        logits = tf.matmul(tf.concat([features, looked_up], axis=1), w["w"]) + w["b"]
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))

    return loss_fn


class Trained:
    """A strategy's graph built in one process and run: weights, global step, the last run's no_data."""

    def __init__(self, strategy_cls, batch, runs, accumulate=1, steps_per_run=1, towers=1, **data_kwargs):
        self.strategy = strategy_cls(Cluster.local(), num_towers=towers)
        graph = tf.Graph()
        with graph.as_default():
            with self.strategy.scope():
                global_step = v1.train.get_or_create_global_step()
                self.train_op = self.strategy.minimize(
                    v1.train.MomentumOptimizer(0.1, 0.9),
                    make_loss_fn(batch, **data_kwargs),
                    global_step,
                    batch_size=batch,
                    accumulate_steps=accumulate,
                    steps_per_run=steps_per_run,
                )
            init = [v1.global_variables_initializer(), v1.local_variables_initializer()]
            self._variables = {v.op.name: v for v in v1.global_variables() if v.op.name in initial()}
            self._global_step = global_step
        self.graph = graph
        self.session = v1.Session(graph=graph, config=self.strategy.session_config())
        self.session.run(init)
        input_feeds.start_inputs(self.session)  # the NumPy arrays are fed when the input starts
        self.no_data: list[bool] = []
        self.steps_trained: list[int] = []
        for _ in range(runs):
            self.run()

    def run(self, feed=None):
        """One run of the train op; notes whether its (last) step had no data, and its steps that trained."""
        fetches = {
            "train": self.train_op,
            "no_data": self.strategy.no_data,
            "trained": self.strategy.steps_trained,
        }
        out = self.session.run({k: v for k, v in fetches.items() if v is not None}, feed)
        self.no_data.append(bool(out.get("no_data", False)))
        self.steps_trained.append(int(out.get("trained", self.strategy.steps_per_run)))

    @property
    def weights(self) -> dict[str, np.ndarray]:
        return self.session.run(self._variables)

    @property
    def global_step(self) -> int:
        return int(self.session.run(self._global_step))


def assert_same(got: Trained, want: Trained, rtol=1e-5, atol=1e-6):
    for name, value in want.weights.items():
        np.testing.assert_allclose(got.weights[name], value, rtol=rtol, atol=atol, err_msg=name)
    moved = max(np.max(np.abs(want.weights[n] - v)) for n, v in initial().items())
    assert moved > 0.05  # training moved the weights: the comparison means something


# ---- accumulation ------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda c: c.__name__)
def test_accumulating_k_micro_batches_equals_one_update_at_k_times_the_batch(strategy):
    got = Trained(strategy, batch=8, runs=4, accumulate=3)
    assert got.global_step == 4
    assert_same(got, Trained(strategy, batch=24, runs=4))


def test_accumulation_with_towers_equals_one_tower_at_the_whole_batch():
    got = Trained(SyncAllReduce, batch=4, runs=3, accumulate=2, towers=2)
    assert_same(got, Trained(SyncAllReduce, batch=16, runs=3))


def test_a_micro_batch_whose_data_ended_weighs_nothing():
    # 5 batches of 8 rows, 2 micro-batches per update: 8+8, 8+8, 8 and one with no data, then none.
    got = Trained(AsyncParameterServer, batch=8, runs=4, accumulate=2, rows=40, repeat=False)
    assert got.no_data == [False, False, False, True]
    assert got.global_step == 3
    # The same rows in batches of 16, the last one short: its mean over the 8 rows there are.
    want = Trained(AsyncParameterServer, batch=16, runs=3, rows=40, repeat=False)
    assert_same(got, want)


def test_micro_batches_run_one_after_the_other():
    graph = Trained(SyncParameterServer, batch=8, runs=0, accumulate=2).graph
    ops = graph.get_operations()
    (second_read,) = [o for o in ops if o.name.startswith("tower_0_micro_1/") and o.type == "IteratorGetNext"]
    first_backprop = {o for o in ops if o.name.startswith("tower_0/gradients/") and o.type == "MatMul"}
    # The second micro-batch reads its input only once the first one's backprop has run.
    assert first_backprop and first_backprop <= transfer.ancestors([second_read])


def test_global_batch_counts_the_micro_batches():
    strategy = SyncAllReduce(Cluster.local())
    with tf.Graph().as_default(), strategy.scope():
        contexts = []

        def loss_fn(ctx):
            contexts.append(ctx)
            return make_loss_fn(4)(ctx)

        strategy.minimize(v1.train.GradientDescentOptimizer(0.1), loss_fn, batch_size=4, accumulate_steps=3)
    assert strategy.examples_per_step(4) == 12
    assert [c.global_batch_size for c in contexts][-1] == 12
    assert [c.reads_again for c in contexts][-3:] == [False, True, True]


# ---- several steps per run ----------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda c: c.__name__)
def test_k_steps_per_run_equal_k_runs_of_one_step(strategy):
    got = Trained(strategy, batch=8, runs=2, steps_per_run=3)
    assert got.global_step == 6
    assert_same(got, Trained(strategy, batch=8, runs=6))


def test_steps_per_run_with_accumulation():
    got = Trained(SyncParameterServer, batch=8, runs=2, steps_per_run=2, accumulate=2)
    assert_same(got, Trained(SyncParameterServer, batch=16, runs=4))


def test_steps_of_a_run_after_the_data_ended_change_nothing_and_the_run_says_so():
    # 7 batches, 3 steps per run: the third run's last two steps have no data.
    got = Trained(SyncAllReduce, batch=8, runs=3, steps_per_run=3, rows=56, repeat=False)
    assert got.no_data == [False, False, True] and got.global_step == 7
    assert got.steps_trained == [3, 3, 1]  # what the loop counts as this replica's local steps
    assert_same(got, Trained(SyncAllReduce, batch=8, runs=7, rows=56, repeat=False))


def test_a_run_makes_no_step_past_the_last_one():
    got = Trained(AsyncParameterServer, batch=8, runs=0, steps_per_run=4)
    for _ in range(3):
        got.run({got.strategy.stop_at: 6})
    assert got.global_step == 6 and got.steps_trained == [4, 2, 0]
    assert_same(got, Trained(AsyncParameterServer, batch=8, runs=6))


@pytest.mark.parametrize("steps,rows,trained", [(100, 56, 7), (10, ROWS, 10)])
def test_fit_counts_the_local_steps_that_trained_not_the_steps_each_run_could_make(
    tmp_path, capfd, steps, rows, trained
):
    # 7 batches at 3 per run end in a run with 1 step of data (6 were counted); 10 steps end in a run
    # that stops after 1 (12 were counted).
    with tf.Graph().as_default():
        result = disttrain.fit(
            make_loss_fn(8, rows=rows, repeat=rows == ROWS),
            lambda: v1.train.GradientDescentOptimizer(0.1),
            steps=steps,
            logdir=str(tmp_path),
            batch_size=8,
            steps_per_run=3,
            strategy=AsyncParameterServer,
            cluster=Cluster.local(),
        )
    assert (result.local_steps, result.global_step) == (trained, trained)
    ended = [line for line in "".join(capfd.readouterr()).splitlines() if "input pipelines has ended" in line]
    assert len(ended) == (rows != ROWS) and all(f"(at global step {trained})" in m for m in ended), ended


# ---- what is refused ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "2"])
def test_bad_counts_are_one_clear_error(value):
    for name in ("accumulate_steps", "steps_per_run"):
        with pytest.raises(ConfigError, match=rf"RunSettings.{name} must be (an integer )?>= 1 \(None: 1, "):
            RunSettings.of(**{name: value})


def test_none_means_off():
    settings = RunSettings.of(accumulate_steps=None, steps_per_run=None)
    got = Trained(
        SyncAllReduce,
        batch=8,
        runs=2,
        accumulate=settings.accumulate_steps,
        steps_per_run=settings.steps_per_run,
    )
    assert got.strategy.accumulate_steps == 1 and got.strategy.steps_per_run == 1 and got.global_step == 2


def build_with(loss_fn, **kwargs):
    strategy = AsyncParameterServer(Cluster.local())
    with tf.Graph().as_default(), strategy.scope():
        strategy.minimize(v1.train.GradientDescentOptimizer(0.1), loss_fn, **kwargs)


def test_a_loss_tensor_cannot_be_built_again():
    strategy = AsyncParameterServer(Cluster.local())
    with tf.Graph().as_default(), strategy.scope():
        loss = tf.reduce_sum(v1.get_variable("w", [2]))
        with pytest.raises(ConfigError, match="give minimize\\(\\) a loss function, not a loss tensor"):
            strategy.minimize(v1.train.GradientDescentOptimizer(0.1), loss, steps_per_run=2)


def test_a_loss_function_that_makes_a_new_iterator_each_call_is_refused():
    def loss_fn():
        x = v1.data.make_one_shot_iterator(
            tf.data.Dataset.range(10).map(lambda i: tf.cast(i, tf.float32))
        ).get_next()
        return x * v1.get_variable("w", [], initializer=tf.zeros_initializer())

    with pytest.raises(
        ConfigError, match="made a new input iterator .* when called again for the same tower"
    ):
        build_with(loss_fn, accumulate_steps=2)


def test_a_loss_function_that_makes_new_variables_each_call_is_refused():
    def loss_fn():
        return tf.reduce_sum(tf.Variable(tf.ones([2])))

    with pytest.raises(ConfigError, match="made a new variable .* when called again for the same tower"):
        build_with(loss_fn, steps_per_run=2)


def test_a_loss_function_that_reads_another_dataset_the_second_time_is_refused():
    calls = {}

    def loss_fn(ctx):
        graph = v1.get_default_graph()
        calls[graph] = calls.get(graph, 0) + 1
        dataset = tf.data.Dataset.range(10)
        value = ctx.get_next(dataset if calls[graph] == 1 else dataset.map(lambda i: (i, i)))
        value = value[0] if isinstance(value, tuple) else value
        return tf.cast(value, tf.float32) * v1.get_variable("w", [], initializer=tf.zeros_initializer())

    with pytest.raises(ConfigError, match="get_next call 1 reads another dataset than its first build did"):
        build_with(loss_fn, steps_per_run=2)


def test_gin_sets_both_for_a_zoo_run(capsys):
    import gin

    from disttrain.edges import cli, zoo_run

    files = ["gin/mlp_sync.gin", "gin/testing/tiny.gin"]
    gin.clear_config()  # cli.train_config locks the config it parsed; clearing unlocks it
    config = cli.train_config(files, ["TrainConfig.accumulate_steps=2", "TrainConfig.steps_per_run=3"])
    strategy = config.strategy(Cluster.local())
    with tf.Graph().as_default():
        zoo_run.build_zoo(Cluster.local(), config, strategy)
    assert (strategy.accumulate_steps, strategy.steps_per_run) == (2, 3)
    assert strategy.examples_per_step(config.batch_size) == 2 * config.batch_size
    gin.clear_config()
    with pytest.raises(SystemExit):
        cli.train_config(files, ["TrainConfig.steps_per_run=0"])
    gin.clear_config()
    assert (
        "TrainConfig.steps_per_run must be >= 1 (None: 1, one step per run), got 0" in capsys.readouterr().err
    )
