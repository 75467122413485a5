"""disttrain.fit's argument handling, without servers: settings, strategy choice, roles."""

import pytest

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
