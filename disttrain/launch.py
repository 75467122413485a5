"""Role dispatch: what a ps, worker, chief or evaluator task does, from start to exit.

`run(cluster, config, logdir)` is the whole life of one task. Roles are a
table, not an if-chain. A PS only serves: it starts its server, waits until
every replica has said it is done (through a queue on the PS), and returns
so that the process exits 0 (TF's `server.join()` never returns).
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Callable

import tensorflow as tf

from disttrain import metrics, placement, servers, trainer
from disttrain.cluster import CHIEF, EVALUATOR, LOCAL, PS, WORKER, Cluster
from disttrain.config import TrainConfig
from disttrain.errors import TransientError

v1 = tf.compat.v1
log = logging.getLogger("disttrain")


# ---- roles -------------------------------------------------------------------


def _run_ps(cluster: Cluster, config: TrainConfig, logdir: str, on_built) -> int:
    server = servers.start_server(
        cluster, v1.ConfigProto(intra_op_parallelism_threads=config.intra_op_threads)
    )
    log.info(f"{cluster.task_name} serving at {cluster.address}")
    reported = servers.serve_until_done(cluster, server.target, config.ps_linger_secs)
    log.info(f"{cluster.task_name} done: {len(reported)}/{cluster.num_replicas} replicas reported; exiting")
    return 0


def _run_replica(cluster: Cluster, config: TrainConfig, logdir: str, on_built) -> int:
    strategy = config.strategy(cluster)
    session_config = strategy.config(config.intra_op_threads, config.inter_op_threads)
    trainer.check_writable(logdir)
    on_reconnect = None
    if cluster.is_local:
        target = ""
    else:
        server = servers.start_server(cluster, session_config)
        target = server.target
        others = servers.peers(cluster, strategy.device_filters())
        servers.wait_for_peers(others, config.peer_wait_secs)
        servers.check_cluster_agrees(cluster, target, servers.spec_anchor(cluster), config.peer_wait_secs)

        def on_reconnect(tf_texts: list[str]):
            lost = servers.probe_lost(cluster, others, tf_texts)
            if not strategy.recovers_in_process:
                raise TransientError(
                    f"{cluster.task_name} lost its session: {lost}; {type(strategy).__name__} "
                    "cannot recover in-process: exiting to restart from the last checkpoint"
                )
            log.info(f"{cluster.task_name} lost its session: {lost}; checking peers")
            servers.wait_for_peers(others, config.peer_wait_secs)
            latest = v1.train.latest_checkpoint(logdir) if cluster.is_chief else None
            log.info(
                f"{cluster.task_name} every peer is reachable again; resuming from {latest or 'the chief'}"
            )

    def built(b: trainer.Built) -> None:
        if cluster.is_chief and strategy.plan is not None:
            log.info(placement.report(b.graph, cluster.num_ps, "placement (variables per PS)"))
        if on_built is not None and cluster.is_chief:
            on_built()

    trainer.train(cluster, config, strategy, logdir, target, session_config, built, on_reconnect=on_reconnect)
    if not cluster.is_local:
        servers.signal_done(cluster, target)
    return 0


def _run_evaluator(cluster: Cluster, config: TrainConfig, logdir: str, on_built) -> int:
    """Evaluate each new checkpoint on the input pipeline's data; stop after the last one."""
    model = config.model
    eval_dir = os.path.join(logdir, "eval")
    with tf.Graph().as_default():
        dataset = config.input_fn(model, config.batch_size, 0, 1)
        features, labels = v1.data.make_one_shot_iterator(dataset).get_next()
        logits = model(features, training=False)
        loss = model.loss(logits, labels)
        accuracy = tf.reduce_mean(
            tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
        )
        global_step = v1.train.get_or_create_global_step()
        saver = v1.train.Saver()
        writer = v1.summary.FileWriter(eval_dir)
        for path in v1.train.checkpoints_iterator(logdir, min_interval_secs=1, timeout=config.peer_wait_secs):
            with v1.Session() as session:
                saver.restore(session, path)
                values = [session.run([loss, accuracy]) for _ in range(config.eval_steps)]
                step = int(session.run(global_step))
            mean_loss = sum(v[0] for v in values) / len(values)
            mean_acc = sum(v[1] for v in values) / len(values)
            writer.add_summary(
                metrics.scalar_summary({"eval/loss": mean_loss, "eval/accuracy": mean_acc}), step
            )
            writer.flush()
            log.info(f"evaluator: step {step}  eval loss {mean_loss:.4f}  accuracy {mean_acc:.3f}")
            if step >= config.train_steps:
                break
        writer.close()
    return 0


ROLES: dict[str, Callable[..., int]] = {
    PS: _run_ps,
    WORKER: _run_replica,
    CHIEF: _run_replica,
    LOCAL: _run_replica,
    EVALUATOR: _run_evaluator,
}


def run(
    cluster: Cluster,
    config: TrainConfig,
    logdir: str,
    on_built: Callable[[], None] | None = None,
) -> int:
    """The whole life of one task; returns its exit code (errors raise DisttrainError)."""
    config.validate()
    set_process_threads(config.intra_op_threads, config.inter_op_threads)
    return ROLES[cluster.task_type](cluster, config, logdir, on_built)


def set_process_threads(intra: int, inter: int) -> None:
    """Size TF's process-wide thread pools, which a session's ConfigProto does not reach.

    Creating a Saver builds the process-wide pool at its default size (every
    core), and kernels then run there whatever `intra_op_parallelism_threads`
    says, so a session limited to one thread still computes on every core.
    Must run before TF's runtime starts; 0 keeps TF's default.
    """
    try:
        if intra:
            tf.config.threading.set_intra_op_parallelism_threads(intra)
        if inter:
            tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError as e:  # the runtime already started in this process (user code, tests)
        log.warning("thread pools already created, TrainConfig thread counts apply per session only: %s", e)


def dry_run(cluster: Cluster, config: TrainConfig) -> str:
    """What this task would do, without starting a server: role, cluster, placement."""
    config.validate()
    lines = [f"role: {cluster.task_type}", cluster.describe()]
    view = cluster
    if cluster.task_type in (PS, EVALUATOR):
        # Plan as the first replica would: a PS holds what the replicas place on it.
        job, index = cluster.replica_jobs[0]
        view = Cluster(jobs=cluster.jobs, task_type=job, task_index=index)
    strategy = config.strategy(view)
    lines.append(f"strategy: {type(strategy).__name__}, {strategy.num_towers} tower(s) per replica")
    built = trainer.build(view, config, strategy)
    if strategy.plan is not None:
        lines.append(placement.report(built.graph, view.num_ps, "placement plan (variables per PS)"))
        for name, (axis, parts) in sorted(strategy.plan.parts.items()):
            lines.append(f"  split {name} into {parts} parts along axis {axis}")
        for task in range(view.num_ps):
            names = sorted(n for n, t in strategy.plan.devices.items() if t == task)
            more = f" (+{len(names) - 6} more)" if len(names) > 6 else ""
            lines.append(f"  /job:ps/task:{task}: {', '.join(names[:6])}{more}")
    return "\n".join(lines)


def read_results(logdir: str) -> dict[str, dict]:
    """The result.json of every replica that finished, by task directory name."""
    out = {}
    for path in sorted(glob.glob(os.path.join(logdir, "tasks", "*", "result.json"))):
        with open(path) as f:
            out[os.path.basename(os.path.dirname(path))] = json.load(f)
    return out
