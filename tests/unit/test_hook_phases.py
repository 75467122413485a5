"""A replica session's hooks run in named phases, in the order trainer.HOOK_PHASES gives.

MonitoredSession calls its hooks in list order, so the order is behaviour: an
async drain (a strategy's hook) ends before the throughput hook reads the
final step, and the chief's saver writes the final checkpoint after every
phase that may still change a variable. The phases of a whole graph are read
here for a chief of a cluster with PS tasks (every phase that can have
hooks has some), without servers: the hooks are built, not run.
"""

import pytest
import tensorflow as tf

import disttrain
from disttrain.base import preemption
from disttrain.base.cluster import Cluster
from disttrain.base.config import RunSettings
from disttrain.runtime import recovery, trainer

v1 = tf.compat.v1


def _loss():
    w = v1.get_variable("w", [4], initializer=v1.zeros_initializer())
    return tf.reduce_sum(tf.square(w - 1.0))


def _phases(tmp_path, strategy_class, **settings):
    cluster = Cluster.from_hosts("worker", 0, ["p:1"], ["w0:1", "w1:1"])
    settings = RunSettings.of(**settings)
    with tf.Graph().as_default():
        strategy = strategy_class(cluster)
        built = trainer.build(strategy, _loss, lambda: v1.train.GradientDescentOptimizer(0.1), False).step
        watchdog = trainer.replica_watchdog(cluster, strategy, settings, str(tmp_path), 10)
        notice = preemption.Notice()
        logdir = str(tmp_path)
        return trainer._session_hooks(cluster, strategy, built, logdir, settings, 1, 10, [], watchdog, notice)


def test_the_phases_are_in_their_order_and_every_hook_is_in_one(tmp_path):
    hooked = _phases(tmp_path, disttrain.AsyncParameterServer, save_checkpoint_steps=5)
    assert tuple(hooked.phases) == trainer.HOOK_PHASES
    assert hooked.hooks == [h for phase in trainer.HOOK_PHASES for h in hooked.phases[phase]]
    kinds = {phase: [type(h).__name__ for h in hooks] for phase, hooks in hooked.phases.items()}
    assert kinds["stop"] == ["_StopAtStep"] and kinds["throughput"] == ["ThroughputHook"]
    assert kinds["finish_together"] == ["_AwaitReplicas"]  # the chief of async PS with 2 replicas
    assert kinds["preemption"] == [recovery.PreemptionHook.__name__]
    assert kinds["checkpoints"] == ["CheckpointSaverHook"]
    assert kinds["step_done"] == ["Done"] and hooked.hooks[-1] is hooked.phases["step_done"][0]


def test_a_phase_out_of_order_is_refused(tmp_path):
    hooked = _phases(tmp_path, disttrain.SyncParameterServer)
    assert hooked.phases["strategy"], "sync PS's aggregator and token hooks are the strategy's"
    shuffled = dict(reversed(list(hooked.phases.items())))
    with pytest.raises(RuntimeError, match="hook phases out of order"):
        trainer._Hooked(shuffled, hooked.scaffold, hooked.live).hooks  # noqa: B018
