"""disttrain.fit's argument handling, without servers: settings, strategy choice, roles."""

import pytest
import tensorflow as tf

import disttrain
from disttrain.cluster import Cluster
from disttrain.config import RunSettings
from disttrain.errors import ConfigError
from disttrain.launch import make_strategy


def test_settings_are_checked_by_name_and_value():
    assert RunSettings.of(log_every_steps=5).log_every_steps == 5
    with pytest.raises(ConfigError, match=r"unknown setting 'log_every'.*log_every_steps"):
        RunSettings.of(log_every=5)
    with pytest.raises(ConfigError, match=r"RunSettings.log_every_steps must be >= 1, got 0"):
        RunSettings.of(log_every_steps=0)


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
    with tf.Graph().as_default(), pytest.raises(SystemExit) as exit_info:
        disttrain.fit(_loss, optimizer_fn, steps=3, logdir=str(tmp_path / "run"), cluster=Cluster.local())
    assert exit_info.value.code == ConfigError.exit_code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"disttrain: error: {said}"]
    assert not list((tmp_path / "run").glob("model.ckpt*"))


def test_minimize_takes_the_optimizer_not_its_function():
    strategy = disttrain.AsyncParameterServer(Cluster.local())
    with tf.Graph().as_default(), strategy.scope():
        with pytest.raises(ConfigError, match=r"^minimize\(\) takes the optimizer, not a function"):
            strategy.minimize(lambda: tf.compat.v1.train.AdamOptimizer(1e-3), _loss)
        assert strategy.minimize(tf.compat.v1.train.AdamOptimizer(1e-3), _loss) is not None
