"""disttrain.fit's argument handling, without servers: settings, strategy choice, roles."""

import functools
import re

import gin
import numpy as np
import pytest
import tensorflow as tf

import disttrain
from disttrain.base.cluster import EVALUATOR, Cluster
from disttrain.base.config import RunSettings
from disttrain.base.errors import ConfigError, NoFilesError
from disttrain.launch import errors_to_exit, make_strategy, refuse_what_replicas_refuse

v1 = tf.compat.v1


def test_settings_are_checked_by_name_and_value():
    assert RunSettings.of(log_every_steps=5).log_every_steps == 5
    with pytest.raises(ConfigError, match=r"unknown setting 'log_every'.*log_every_steps"):
        RunSettings.of(log_every=5)
    with pytest.raises(ConfigError, match=r"RunSettings.log_every_steps must be >= 1, got 0"):
        RunSettings.of(log_every_steps=0)
    # Counts computed with NumPy are numbers all the same, kept as Python's.
    numpy_made = RunSettings.of(
        save_checkpoint_steps=np.int64(100), peer_wait_secs=np.float32(30), check_numerics=np.True_
    )
    assert [(v, type(v)) for v in (numpy_made.save_checkpoint_steps, numpy_made.peer_wait_secs)] == [
        (100, int),
        (30.0, float),
    ]
    assert numpy_made.check_numerics is True
    with pytest.raises(ConfigError, match=r"save_checkpoint_steps must be an integer >= 1 .*, got 2.5"):
        RunSettings.of(save_checkpoint_steps=np.float64(2.5))


def test_default_strategy_follows_the_cluster():
    with_ps = Cluster.from_hosts("worker", 0, ["p:1"], ["w0:1", "w1:1"])
    without_ps = Cluster.from_hosts("worker", 0, [], ["w0:1", "w1:1"])
    assert type(make_strategy(None, with_ps)) is disttrain.AsyncParameterServer
    assert type(make_strategy(None, without_ps)) is disttrain.SyncAllReduce
    assert type(make_strategy(None, Cluster.local())) is disttrain.AsyncParameterServer


def test_strategy_given_as_class_callable_or_instance():
    cluster = Cluster.from_hosts("worker", 1, ["p:1"], ["w0:1", "w1:1"])
    assert type(make_strategy(disttrain.SyncParameterServer, cluster)) is disttrain.SyncParameterServer
    built = disttrain.AsyncParameterServer(cluster, overlap=True)
    assert make_strategy(lambda c: built, cluster) is built
    assert make_strategy(built, cluster) is built
    other = Cluster.from_hosts("worker", 0, ["p:1"], ["w0:1", "w1:1"])
    with pytest.raises(ConfigError, match="built for /job:worker/task:1, not /job:worker/task:0"):
        make_strategy(built, other)
    with pytest.raises(ConfigError, match="strategy='async'"):
        make_strategy("async", cluster)
    misspelt = functools.partial(disttrain.AsyncParameterServer, overlapp=True)
    with pytest.raises(ConfigError) as raised:  # on a PS too (refuse_what_replicas_refuse), so all exit 2
        make_strategy(misspelt, cluster)
    assert str(raised.value) == (
        "strategy=functools.partial(AsyncParameterServer, overlapp=True) cannot be called with the "
        "cluster: got an unexpected keyword argument 'overlapp'"
    )
    ps = Cluster.from_hosts("ps", 0, ["p:1"], ["w0:1", "w1:1"])
    with pytest.raises(ConfigError, match="unexpected keyword argument 'overlapp'"):
        refuse_what_replicas_refuse(misspelt, ps, RunSettings())
    with pytest.raises(ConfigError, match=r"^strategy=<lambda> cannot be called with the cluster: too many"):
        make_strategy(lambda: None, cluster)


def test_fit_ends_the_process_with_one_line_and_the_config_exit_code(capsys):
    with pytest.raises(SystemExit) as exit_info:
        disttrain.fit(
            lambda: None, lambda: None, steps=1, logdir="/tmp/unused", cluster=Cluster.local(), bogus=1
        )
    assert exit_info.value.code == ConfigError.exit_code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("disttrain: error: unknown setting 'bogus'")


def _loss():
    w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.ones_initializer())
    return tf.reduce_sum(tf.square(w))


def _sgd():
    return v1.train.GradientDescentOptimizer(0.1)


def fit_refused(capsys, loss_fn=_loss, optimizer_fn=_sgd, **arguments) -> list[str]:
    """What `fit` wrote to stderr, once it has ended the process with the configuration's exit code."""
    arguments = {"steps": 3, "cluster": Cluster.local(), **arguments}
    with tf.Graph().as_default(), pytest.raises(SystemExit) as exit_info:
        disttrain.fit(loss_fn, optimizer_fn, **arguments)
    assert exit_info.value.code == ConfigError.exit_code == 2
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "optimizer_fn, said",
    [
        (
            lambda: tf.keras.optimizers.Adam(1e-3),
            "the optimizer is of type Adam (keras), not a tf.compat.v1.train.Optimizer, which disttrain's "
            "strategies need in their TF1 graphs; use tf.compat.v1.train.AdamOptimizer",
        ),
        (
            lambda: tf.keras.optimizers.Lion(1e-3),
            "the optimizer is of type Lion (keras), not a tf.compat.v1.train.Optimizer, which disttrain's "
            "strategies need in their TF1 graphs; use a tf.compat.v1.train optimizer",
        ),
        (
            tf.compat.v1.train.AdamOptimizer(1e-3),
            "optimizer_fn must be a function that builds the optimizer, such as lambda: "
            "tf.compat.v1.train.AdamOptimizer(1e-3); got an object of type AdamOptimizer",
        ),
    ],
    ids=["keras_adam", "keras_lion", "an_optimizer_not_a_function"],
)
def test_an_optimizer_disttrain_cannot_use_is_one_line_before_any_step(tmp_path, capsys, optimizer_fn, said):
    """Users reach for tf.keras.optimizers, or hand fit the optimizer itself: one line, exit 2, no logdir."""
    err = fit_refused(capsys, optimizer_fn=optimizer_fn, logdir=str(tmp_path / "run"))
    assert err == [f"disttrain: error: {said}"]
    assert not list((tmp_path / "run").glob("model.ckpt*"))


def test_minimize_takes_the_optimizer_not_its_function():
    strategy = disttrain.AsyncParameterServer(Cluster.local())
    with tf.Graph().as_default(), strategy.scope():
        with pytest.raises(ConfigError, match=r"^minimize\(\) takes the optimizer, not a function"):
            strategy.minimize(lambda: tf.compat.v1.train.AdamOptimizer(1e-3), _loss)
        assert strategy.minimize(tf.compat.v1.train.AdamOptimizer(1e-3), _loss) is not None


def _per_example():
    w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.ones_initializer())
    return tf.square(w - tf.random.normal([8, 2]))[:, 0]


def _needs_two(ctx, vocabulary):
    return _loss()


BAD_LOSSES = {
    "per_example": (
        _per_example,
        "the loss has shape [8]: return a scalar, such as tf.reduce_mean of the per-example losses "
        "(Keras losses such as tf.keras.losses.mean_squared_error return one per example)",
    ),
    "with_metrics": (
        lambda: (_loss(), {"mae": tf.constant(0.0)}),
        "the loss function returned a tuple: return the loss alone, a scalar tensor "
        "(held-out metrics go in eval_fn)",
    ),
    "a_float": (
        lambda: [_loss()][0].name and 0.5,
        "the loss function returned float, not a tensor: return the loss, a scalar tensor built in the "
        "graph the function is called in",
    ),
    "int32": (lambda: tf.cast(_loss(), tf.int32), "the loss is int32: return a floating-point scalar"),
    "two_arguments": (
        _needs_two,
        "_needs_two(ctx, vocabulary) needs 2 arguments: disttrain calls it with none, or with one, the "
        "InputContext (bind the others with functools.partial)",
    ),
}


@pytest.mark.parametrize("case", BAD_LOSSES)
@pytest.mark.parametrize("check_numerics", [True, False])
def test_a_loss_function_that_does_not_return_a_scalar_loss_is_one_line(
    tmp_path, capsys, case, check_numerics
):
    """The shapes a Keras user brings: per-example losses, (loss, metrics), an int; fit or minimize."""
    loss_fn, said = BAD_LOSSES[case]
    err = fit_refused(capsys, loss_fn, logdir=str(tmp_path), check_numerics=check_numerics)
    assert err == [f"disttrain: error: {said}"]
    strategy = disttrain.SyncAllReduce(Cluster.local())
    with tf.Graph().as_default(), strategy.scope(), pytest.raises(ConfigError) as raised:
        strategy.minimize(_sgd(), loss_fn)
    assert str(raised.value) == said


@pytest.mark.parametrize(
    "given, said",
    [
        (dict(steps=None), "steps must be an integer >= 1, got None"),
        (dict(steps=0), "steps must be >= 1, got 0"),
        (dict(steps=2.5), "steps must be an integer >= 1, got 2.5"),
        (dict(batch_size=None), "batch_size must be an integer >= 1, got None"),
        (dict(eval_steps=0), "eval_steps must be >= 1, got 0"),
        (
            dict(logdir=None),
            "logdir must be a directory path (checkpoints, events and results go there), got None",
        ),
        (
            dict(logdir=""),
            "logdir must be a directory path (checkpoints, events and results go there), got ''",
        ),
        (dict(hooks=v1.train.StepCounterHook()), "hooks is one StepCounterHook: give a list, hooks=[hook]"),
        (
            dict(hooks=[v1.train.StepCounterHook(), tf.keras.callbacks.TensorBoard()]),
            "hooks holds a TensorBoard, not a tf.compat.v1.train.SessionRunHook: the training loop runs "
            "session hooks only (Keras callbacks do not run in it)",
        ),
        (
            dict(cluster={"cluster": {"worker": ["localhost:2222"]}, "task": {"type": "worker", "index": 0}}),
            "cluster is a dict: give a disttrain.Cluster (Cluster.from_tf_config(...), "
            "Cluster.from_hosts(...)), or None to read TF_CONFIG",
        ),
    ],
    ids=lambda v: "-".join(f"{k}={type(v).__name__}" for k, v in v.items()) if isinstance(v, dict) else "",
)
def test_fits_own_arguments_out_of_range_are_one_line(tmp_path, capsys, given, said):
    assert fit_refused(capsys, **{"logdir": str(tmp_path), **given}) == [f"disttrain: error: {said}"]


@pytest.mark.parametrize(
    "steps", [np.int64(3), 3.0, np.float32(3)], ids=["numpy_int", "float", "numpy_float"]
)
def test_steps_counted_in_numpy_or_as_a_whole_float_train_that_many(tmp_path, steps):
    with tf.Graph().as_default():
        result = disttrain.fit(
            _loss,
            _sgd,
            steps=steps,
            logdir=tmp_path,  # a pathlib.Path
            cluster=Cluster.local(),
            batch_size=np.int64(4),
        )
    assert (result.local_steps, result.global_step) == (3, 3)
    assert list(tmp_path.glob("model.ckpt-3.index"))


@pytest.mark.parametrize(
    "eval_fn, said",
    [
        (
            lambda: {"mse": _per_example()},
            "eval_fn's 'mse' is a float32 tensor of shape [8]: each metric is a numeric scalar, averaged "
            "over eval_steps batches (tf.reduce_mean a per-example one)",
        ),
        (
            lambda: (lambda loss: (loss, loss))(_loss()),
            "eval_fn returned tuple: return a scalar tensor, or a dict of name -> scalar tensor",
        ),
        (
            lambda: {"loss": _loss(), "rate": 0.1},
            "eval_fn returned float for 'rate': return a scalar tensor, or a dict of name -> scalar tensor",
        ),
    ],
    ids=["per_example_metric", "tuple", "a_float"],
)
def test_an_eval_fn_without_scalar_metrics_ends_the_evaluator_in_one_line(tmp_path, capsys, eval_fn, said):
    """Refused as the metrics are built, before the evaluator waits for a checkpoint."""
    evaluator = Cluster(jobs={"worker": ["localhost:1"]}, task_type=EVALUATOR, task_index=0)
    err = fit_refused(capsys, logdir=str(tmp_path), cluster=evaluator, eval_fn=eval_fn)
    assert err == [f"disttrain: error: {said}"]


def test_sessions_own_arguments_are_checked_as_fits_are(tmp_path, capsys):
    strategy = disttrain.AsyncParameterServer(Cluster.local())
    with tf.Graph().as_default(), strategy.scope():
        strategy.minimize(_sgd(), _loss)
        with (
            pytest.raises(SystemExit) as exit_info,
            disttrain.session(strategy, steps=0, logdir=str(tmp_path)),
        ):
            pass
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == ["disttrain: error: steps must be >= 1, got 0"]


def test_a_pattern_matching_no_file_is_one_line(tmp_path, capsys):
    def reading(ctx):
        records = ctx.shard(str(tmp_path / "train-*.tfrecord"), reader=tf.data.TFRecordDataset)
        ctx.get_next(records.batch(2))
        return _loss()

    err = fit_refused(capsys, reading, logdir=str(tmp_path / "run"))
    assert err == [
        f"disttrain: error: no files match '{tmp_path}/train-*.tfrecord': check the pattern, and that this "
        "task can read them"
    ]


def test_an_error_raised_in_a_gin_configurable_stays_one_line_naming_it(capsys):
    """gin adds "In call to configurable ..." on a line of its own: folded into the one line."""

    @gin.configurable("dt_test_input")
    def reader(file_pattern):
        raise NoFilesError(f"no files match {file_pattern!r}")

    with pytest.raises(SystemExit) as exit_info, errors_to_exit():
        reader("/data/none-*")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["disttrain: error: no files match '/data/none-*' (in gin's dt_test_input)"]


def test_a_fit_that_traced_a_step_ends_with_its_verdict_and_where_to_read_more(tmp_path, capsys):
    with tf.Graph().as_default():
        result = disttrain.fit(_loss, _sgd, steps=60, logdir=str(tmp_path), cluster=Cluster.local())
    assert result.breakdown, "no step traced: the verdict has nothing to read"
    (line,) = [
        x.split(" INFO ", 1)[1] for x in capsys.readouterr().out.splitlines() if " INFO verdict: " in x
    ]
    said = re.fullmatch(
        r"verdict: (.*) \((the changes that would remove it, ranked|more): disttrain-diagnose (.*)\)", line
    )
    assert said and said.group(3) == str(tmp_path), line
    # A step of two numbers is all framework (Python, hooks, session.run) or all compute, never the
    # network; on a machine whose cores other work keeps busy, that comes first.
    named = ("the framework's own time", "no bottleneck: compute is", "this machine's")
    assert said.group(1).startswith(named), line
    assert (said.group(2) == "more") == said.group(1).startswith("no bottleneck"), line


def test_an_op_built_in_the_training_loop_is_one_line_naming_the_fix(tmp_path, capsys):
    # Seed 003: a TF 1 loop that builds an op at every step grows its graph and slows each step.
    with tf.Graph().as_default():
        strategy = disttrain.AsyncParameterServer(Cluster.local())
        with strategy.scope():
            train_op = strategy.minimize(_sgd(), _loss)
        with pytest.raises(SystemExit) as exit_info:
            with disttrain.session(strategy, steps=5, logdir=str(tmp_path)) as session:
                while not session.should_stop():
                    session.run(train_op)
                    session.run(tf.constant(1.0) + 1)
    assert exit_info.value.code == ConfigError.exit_code
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert (
        line.startswith("disttrain: error: an op was built after training started") and "outside the" in line
    )
