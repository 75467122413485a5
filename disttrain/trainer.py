"""The training loop: build the graph, run a monitored session, checkpoint, stop.

`build` makes the training graph for one replica under its strategy;
`train` runs it to `config.train_steps` and returns what the task measured.
Neither starts servers or reads flags (see `disttrain.launch`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable

import tensorflow as tf

from disttrain import metrics
from disttrain.cluster import Cluster
from disttrain.config import TrainConfig
from disttrain.errors import TransientError
from disttrain.strategies.base import Strategy

v1 = tf.compat.v1
log = logging.getLogger("disttrain")


@dataclasses.dataclass
class Built:
    """The training graph of one replica and the tensors the loop needs."""

    graph: tf.Graph
    train_op: tf.Operation
    loss: tf.Tensor
    global_step: tf.Tensor
    strategy: Strategy


def build(cluster: Cluster, config: TrainConfig, strategy: Strategy) -> Built:
    """Build this replica's training graph: input, towers, gradients, update."""
    model = config.model
    graph = tf.Graph()
    with graph.as_default():
        strategy.plan_placement(model.build_variables)
        with strategy.scope():
            global_step = v1.train.get_or_create_global_step()
            with tf.device(strategy.input_device):
                dataset = config.input_fn(
                    model, config.batch_size, max(cluster.replica_index, 0), cluster.num_replicas
                )
                iterator = v1.data.make_one_shot_iterator(dataset)

            def loss_fn():
                features, labels = iterator.get_next()
                return model.loss(model(features, training=True), labels)

            train_op = strategy.minimize(config.optimizer(), loss_fn, global_step)
    return Built(graph, train_op, strategy.loss, global_step, strategy)


class _WorkerSessionCreator(v1.train.SessionCreator):
    """Waits for the chief to initialise the variables, polling every half second.

    TF's WorkerSessionCreator polls every 30 s, so a worker that starts a
    moment before the chief sits idle for half a minute.
    """

    def __init__(self, scaffold, master, config, max_wait_secs):
        self._scaffold, self._master, self._config, self._max_wait = scaffold, master, config, max_wait_secs

    def create_session(self):
        self._scaffold.finalize()
        manager = v1.train.SessionManager(
            local_init_op=self._scaffold.local_init_op,
            local_init_feed_dict=self._scaffold.local_init_feed_dict,
            ready_op=self._scaffold.ready_op,
            ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
            graph=v1.get_default_graph(),
            recovery_wait_secs=0.5,
        )
        try:
            return manager.wait_for_session(self._master, config=self._config, max_wait_secs=self._max_wait)
        except tf.errors.DeadlineExceededError:
            raise TransientError(
                f"the chief did not initialise the variables within {self._max_wait:.0f} s "
                "(is the chief running? raise TrainConfig.peer_wait_secs if it is slow to start)"
            ) from None


def train(
    cluster: Cluster,
    config: TrainConfig,
    strategy: Strategy,
    logdir: str,
    target: str = "",
    session_config: tf.compat.v1.ConfigProto | None = None,
    on_built: Callable[[Built], None] | None = None,
    log_fn: Callable[[str], None] = log.info,
) -> metrics.TaskThroughput:
    """Train this replica until the global step reaches `config.train_steps`.

    The chief restores the latest checkpoint in `logdir` if there is one,
    saves periodically and at the end, and writes the cluster's scalars;
    every replica writes its own throughput. `on_built` runs once the graph
    is complete (the launcher writes the operative config there).
    """
    built = build(cluster, config, strategy)
    job, index = (cluster.task_type, cluster.task_index)
    with built.graph.as_default():
        hook = metrics.ThroughputHook(
            task=cluster.task_name,
            loss=built.loss,
            global_step=built.global_step,
            examples_per_local_step=config.batch_size * strategy.num_towers,
            examples_per_global_step=strategy.examples_per_step(config.batch_size),
            every_n=config.log_every_steps,
            task_logdir=metrics.task_logdir(logdir, job, index),
            cluster_logdir=logdir if cluster.is_chief else None,
            log=log_fn,
        )
        hooks = [v1.train.StopAtStepHook(last_step=config.train_steps), hook, *strategy.hooks()]
        saver = v1.train.Saver(max_to_keep=config.keep_checkpoints, sharded=True)
        scaffold = strategy.scaffold(saver)
        if on_built is not None:
            on_built(built)
        if cluster.is_chief:
            hooks.append(
                v1.train.CheckpointSaverHook(
                    logdir,
                    save_secs=None if config.save_checkpoint_steps else config.save_checkpoint_secs,
                    save_steps=config.save_checkpoint_steps,
                    scaffold=scaffold,
                )
            )
            creator = v1.train.ChiefSessionCreator(
                scaffold=scaffold, master=target, config=session_config, checkpoint_dir=logdir
            )
        else:
            creator = _WorkerSessionCreator(scaffold, target, session_config, config.peer_wait_secs)
        with v1.train.MonitoredSession(
            session_creator=creator, hooks=hooks, stop_grace_period_secs=5
        ) as session:
            while not session.should_stop():
                session.run(built.train_op)
    result = hook.result
    write_result(logdir, job, index, result)
    log_fn(
        f"{cluster.task_name} finished: {result.local_steps} local steps to global step {result.global_step}, "
        f"loss {result.final_loss:.4f}, {result.examples_per_sec:.1f} examples/sec (this task)"
    )
    return result


def write_result(logdir: str, job: str, index: int, result: metrics.TaskThroughput) -> str:
    """Write the task's measurements to <logdir>/tasks/<job>_<index>/result.json."""
    directory = metrics.task_logdir(logdir, job, index)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "result.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dataclasses.asdict(result), f, indent=1)
    os.replace(tmp, path)
    return path
