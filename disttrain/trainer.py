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
import warnings
from collections.abc import Callable

import tensorflow as tf

from disttrain import metrics
from disttrain.cluster import Cluster
from disttrain.config import TrainConfig
from disttrain.errors import ConfigError, DivergedError, TransientError
from disttrain.strategies.base import NON_FINITE, Strategy

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
                iterator = v1.data.make_one_shot_iterator(_without_autotune_thread(dataset))

            def loss_fn():
                features, labels = iterator.get_next()
                loss = model.loss(model(features, training=True), labels)
                if config.check_numerics:
                    loss = tf.debugging.check_numerics(loss, f"{NON_FINITE} loss")
                return loss

            train_op = strategy.minimize(config.optimizer(), loss_fn, global_step, config.check_numerics)
        if strategy.global_step_read is not None:
            global_step = strategy.global_step_read
    return Built(graph, train_op, strategy.loss, global_step, strategy)


def _without_autotune_thread(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` without tf.data's autotuning thread, unless its options turn autotuning on.

    Closing a session destroys the input iterator, which waits for the
    autotuning thread's current sleep to end (its period doubles up to 60 s
    in TF 2.21), so a replica could tell its PS it is done after the PS has
    left. AUTOTUNE values still work: parallel calls default to the cores,
    prefetch buffers tune themselves.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # graph mode: "options ... no longer known at construction"
        chosen = dataset.options().autotune.enabled
    if chosen is not None:
        return dataset
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


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


class _LostPeerLog(logging.Filter):
    """Keeps the errors behind MonitoredSession's silent session re-creation.

    TF logs them ("This may be due to a preemption ... Error: ...") and starts
    a new session; this filter on TF's logger keeps their text for the next
    reconnection and lets through only what the logger would have shown anyway.
    """

    def __init__(self, shown_level: int):
        super().__init__()
        self.shown_level, self.texts = shown_level, []

    def filter(self, record):
        message = record.getMessage()
        if "may be due to a preemption" in message:
            self.texts.append(message)
        return record.levelno >= self.shown_level

    def take(self) -> list[str]:
        """The texts kept since the last call."""
        texts, self.texts = self.texts, []
        return texts


class _Reconnecting(v1.train.SessionCreator):
    """Calls `on_reconnect(tf_texts)` before every session after the first.

    MonitoredSession re-creates its session when a peer is lost (TF's
    Unavailable/Aborted errors) and would otherwise wait silently and for
    ever; the launcher's callback names the lost peer (from a probe of the
    peers and TF's error texts) and gives up after a bounded wait for it.
    """

    def __init__(self, inner, on_reconnect, lost_peer_log: _LostPeerLog):
        self._inner, self._on_reconnect, self._created = inner, on_reconnect, 0
        self._log = lost_peer_log

    def create_session(self):
        texts = self._log.take()
        if self._created and self._on_reconnect is not None:
            self._on_reconnect(texts)
        self._created += 1
        return self._inner.create_session()


def usable_checkpoint(logdir: str) -> str | None:
    """The newest checkpoint in `logdir` that reads back whole, quarantining unreadable newer ones.

    Every tensor is read (the reader checks each one's CRC), so a truncated or
    corrupt checkpoint is found before a restore half-succeeds. Unreadable
    files are renamed `*.corrupt` and the checkpoint state is pointed at the
    newest good one, so every later restore (including TF's own recovery)
    uses it.
    """
    state = v1.train.get_checkpoint_state(logdir)
    if state is None:
        return None
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    good = list(paths)
    for path in reversed(paths):
        try:
            reader = tf.train.load_checkpoint(path)
            for name in reader.get_variable_to_shape_map():
                reader.get_tensor(name)
            break
        except (tf.errors.OpError, ValueError) as e:
            first = str(getattr(e, "message", e)).strip().splitlines()[0]
            log.warning("checkpoint %s is unreadable (%s); falling back to the one before", path, first)
            for f in tf.io.gfile.glob(path + ".*"):
                tf.io.gfile.rename(f, f + ".corrupt", overwrite=True)
            good.remove(path)
    if good == paths:
        return good[-1]
    if good:
        v1.train.update_checkpoint_state(logdir, good[-1], all_model_checkpoint_paths=good)
        return good[-1]
    log.warning("no readable checkpoint left: starting from scratch")
    tf.io.gfile.remove(os.path.join(logdir, "checkpoint"))
    return None


def check_writable(logdir: str) -> None:
    """Fail with one clear line if checkpoints and events cannot be written to `logdir`."""
    probe = os.path.join(logdir, f".write_probe_{os.getpid()}")
    try:
        os.makedirs(logdir, exist_ok=True)
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ConfigError(
            f"cannot write to the log directory {logdir!r} ({e.strerror}): give a writable --logdir"
        ) from None


def train(
    cluster: Cluster,
    config: TrainConfig,
    strategy: Strategy,
    logdir: str,
    target: str = "",
    session_config: tf.compat.v1.ConfigProto | None = None,
    on_built: Callable[[Built], None] | None = None,
    on_reconnect: Callable[[list[str]], None] | None = None,
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
            decay_threshold=config.decay_threshold,
            decay_window=config.decay_window,
        )
        # The strategy's hooks first: their end() (an async drain of queued gradients) runs
        # before the throughput hook reads the final global step.
        hooks = [*strategy.hooks(), v1.train.StopAtStepHook(last_step=config.train_steps), hook]
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
            usable_checkpoint(logdir)
            creator = v1.train.ChiefSessionCreator(
                scaffold=scaffold, master=target, config=session_config, checkpoint_dir=logdir
            )
        else:
            creator = _WorkerSessionCreator(scaffold, target, session_config, config.peer_wait_secs)
        tf_logger = tf.get_logger()
        lost_peer_log = _LostPeerLog(tf_logger.getEffectiveLevel())
        creator = _Reconnecting(creator, on_reconnect, lost_peer_log)
        level = tf_logger.level
        tf_logger.addFilter(lost_peer_log)
        tf_logger.setLevel(min(tf_logger.getEffectiveLevel(), logging.INFO))
        try:
            with v1.train.MonitoredSession(
                session_creator=creator, hooks=hooks, stop_grace_period_secs=5
            ) as session:
                while not session.should_stop():
                    session.run(built.train_op)
        except tf.errors.InvalidArgumentError as e:
            if NON_FINITE not in str(e.message):
                raise
            what = str(e.message).split(NON_FINITE, 1)[1].split(":")[0].strip()
            raise DivergedError(
                f"{what} became NaN or Inf after global step {hook.result.global_step}: stopping; "
                "the last checkpoint holds no diverged value (lower the learning rate?)"
            ) from None
        finally:
            tf_logger.removeFilter(lost_peer_log)
            tf_logger.setLevel(level)
    result = hook.result
    write_result(logdir, job, index, result)
    log.info(
        f"{cluster.task_name} finished: {result.local_steps} local steps "
        f"to global step {result.global_step}, "
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
