"""Role dispatch: what a ps, worker, chief or evaluator task does, from start to exit.

`run(cluster, config, logdir)` is the whole life of one task. Roles are a
table, not an if-chain. A PS only serves: it starts its server, waits until
every replica has said it is done (through a queue on the PS), and returns
so that the process exits 0 (TF's `server.join()` never returns).
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import socket
import time
from collections.abc import Callable

import tensorflow as tf

from disttrain import metrics, placement, trainer
from disttrain.cluster import CHIEF, EVALUATOR, LOCAL, PS, WORKER, Cluster
from disttrain.config import TrainConfig
from disttrain.errors import ConfigError, TransientError

v1 = tf.compat.v1
log = logging.getLogger("disttrain")

_DONE_QUEUE = "disttrain_done"


# ---- servers and peers ------------------------------------------------------


def check_port_free(cluster: Cluster) -> None:
    """Fail with one clear line if this task's port is taken (before TF's server says less)."""
    port = int(cluster.address.rpartition(":")[2])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine, a listener is not
        try:
            s.bind(("", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"port {port} of {cluster.task_name} ({cluster.address}) is already in use: "
                    "stop what holds it or give this task another port"
                ) from None
            raise


def start_server(cluster: Cluster, config: v1.ConfigProto) -> tf.distribute.Server:
    check_port_free(cluster)
    spec = tf.train.ClusterSpec(cluster.as_dict())
    return tf.distribute.Server(
        spec,
        job_name=cluster.task_type,
        task_index=cluster.task_index,
        config=config,
        protocol="grpc",
        start=True,
    )


def _matches(filters: list[str], job: str, index: int) -> bool:
    name = f"/job:{job}/task:{index}"
    return not filters or any(name == f or name.startswith(f + "/") or f == f"/job:{job}" for f in filters)


def peers(cluster: Cluster, filters: list[str]) -> list[tuple[str, str]]:
    """(task name, address) of every other task this task will talk to."""
    out = []
    for job, addresses in cluster.jobs.items():
        for i, address in enumerate(addresses):
            if (job, i) != (cluster.task_type, cluster.task_index) and _matches(filters, job, i):
                out.append((f"/job:{job}/task:{i}", address))
    return out


def wait_for_peers(
    targets: list[tuple[str, str]],
    timeout_secs: float,
    poll_secs: float = 0.25,
    report: Callable[[str], None] | None = None,
) -> None:
    """Block until every peer accepts TCP connections; name the first that never did.

    `report` is told once about each peer that is not up on first try.
    """
    deadline = time.monotonic() + timeout_secs
    pending = list(targets)
    reported = set()
    while pending:
        name, address = pending[0]
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                pending.pop(0)
                continue
        except OSError:
            if report is not None and name not in reported:
                reported.add(name)
                report(f"waiting for {name} at {address}: not reachable")
        if time.monotonic() > deadline:
            raise TransientError(
                f"{name} at {address} is unreachable after {timeout_secs:.0f} s: is it running, "
                "and is the address right? (TrainConfig.peer_wait_secs sets the wait)"
            )
        time.sleep(poll_secs)


# ---- every task must see the same cluster ----------------------------------

_SPEC_TABLE = "disttrain_cluster_spec"


def check_cluster_agrees(cluster: Cluster, target: str, anchor: str, timeout_secs: float = 30.0) -> None:
    """Fail fast if this task was started with another cluster spec than its peers.

    The first task to arrive registers its spec in a small table on `anchor`
    (ps0, or the first replica when there is no PS); every task compares its
    own with it. A worker started with another worker list would otherwise
    hang or silently train a different cluster.
    """
    mine = json.dumps(cluster.as_dict(), sort_keys=True)
    entry = json.dumps({"task": cluster.task_name, "cluster": mine})
    with tf.Graph().as_default() as graph:
        with tf.device(anchor):
            # int64 -> string: TF registers no string -> string kernel for mutable tables.
            table = tf.raw_ops.MutableHashTableV2(
                key_dtype=tf.int64,
                value_dtype=tf.string,
                shared_name=_SPEC_TABLE,
                use_node_name_sharing=False,
            )
            key = tf.constant(0, tf.int64)
            found = tf.raw_ops.LookupTableFindV2(table_handle=table, keys=key, default_value=tf.constant(""))
            insert = tf.raw_ops.LookupTableInsertV2(table_handle=table, keys=key, values=tf.constant(entry))
        config = v1.ConfigProto(device_filters=[anchor, cluster.task_name])
        with v1.Session(target, graph=graph, config=config) as session:
            options = v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
            registered = session.run(found, options=options).decode()
            if not registered:
                session.run(insert, options=options)
                registered = session.run(found, options=options).decode()
    theirs = json.loads(registered)
    if theirs["cluster"] != mine:
        raise ConfigError(
            f"{cluster.task_name} was started with another cluster than {theirs['task']}: "
            f"this task has {mine}, {theirs['task']} has {theirs['cluster']}; "
            "start every task with the same spec"
        )


def spec_anchor(cluster: Cluster) -> str:
    if cluster.num_ps:
        return "/job:ps/task:0"
    job, index = cluster.replica_jobs[0]
    return f"/job:{job}/task:{index}"


# ---- the end of training: replicas tell each PS ----------------------------


def _done_queue(ps_index: int, num_replicas: int):
    with tf.device(f"/job:ps/task:{ps_index}"):
        return v1.FIFOQueue(
            capacity=max(num_replicas, 1) * 4,
            dtypes=[tf.int32],
            shapes=[[]],
            shared_name=f"{_DONE_QUEUE}_{ps_index}",
            name=f"{_DONE_QUEUE}_{ps_index}",
        )


def signal_done(cluster: Cluster, target: str, timeout_secs: float = 10.0) -> None:
    """Tell every PS this replica has finished. A PS already gone is not an error."""
    if not cluster.num_ps:
        return
    with tf.Graph().as_default() as graph:
        ops = [
            _done_queue(i, cluster.num_replicas).enqueue(cluster.replica_index) for i in range(cluster.num_ps)
        ]
        config = v1.ConfigProto(device_filters=["/job:ps", cluster.task_name])
        with v1.Session(target, graph=graph, config=config) as session:
            for i, op in enumerate(ops):
                try:
                    session.run(op, options=v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000)))
                except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError):
                    log.warning("could not tell /job:ps/task:%d that %s is done", i, cluster.task_name)


def serve_until_done(cluster: Cluster, target: str, linger_secs: float) -> set[int]:
    """Run a PS until every replica is done, or `linger_secs` after the chief is.

    Returns the replica indices that reported. The chief (replica 0) always
    reports last in its own life (after the final checkpoint), so a replica
    that died and never came back cannot keep the PS alive forever.
    """
    with tf.Graph().as_default() as graph:
        dequeue = _done_queue(cluster.task_index, cluster.num_replicas).dequeue()
        config = v1.ConfigProto(device_filters=[cluster.task_name])
        with v1.Session(target, graph=graph, config=config) as session:
            reported: set[int] = set()
            deadline = None
            while len(reported) < cluster.num_replicas:
                if deadline is not None and time.monotonic() > deadline:
                    missing = sorted(set(range(cluster.num_replicas)) - reported)
                    log.warning("replicas %s never reported done; ending the PS anyway", missing)
                    break
                try:
                    index = session.run(dequeue, options=v1.RunOptions(timeout_in_ms=1000))
                except tf.errors.DeadlineExceededError:
                    continue
                reported.add(int(index))
                if index == 0 and deadline is None:
                    deadline = time.monotonic() + linger_secs
    return reported


# ---- roles -------------------------------------------------------------------


def _run_ps(cluster: Cluster, config: TrainConfig, logdir: str, on_built, log_fn) -> int:
    server = start_server(cluster, v1.ConfigProto(intra_op_parallelism_threads=config.intra_op_threads))
    log_fn(f"{cluster.task_name} serving at {cluster.address}")
    reported = serve_until_done(cluster, server.target, config.ps_linger_secs)
    log_fn(f"{cluster.task_name} done: {len(reported)}/{cluster.num_replicas} replicas reported; exiting")
    return 0


def _run_replica(cluster: Cluster, config: TrainConfig, logdir: str, on_built, log_fn) -> int:
    strategy = config.strategy(cluster)
    session_config = strategy.config(config.intra_op_threads, config.inter_op_threads)
    trainer.check_writable(logdir)
    on_reconnect = None
    if cluster.is_local:
        target = ""
    else:
        server = start_server(cluster, session_config)
        target = server.target
        others = peers(cluster, strategy.device_filters())
        wait_for_peers(others, config.peer_wait_secs, report=log_fn)
        check_cluster_agrees(cluster, target, spec_anchor(cluster), config.peer_wait_secs)

        def on_reconnect(lost: str):
            if not strategy.recovers_in_process:
                raise TransientError(
                    f"{cluster.task_name} lost {lost}; {type(strategy).__name__} cannot recover in-process: "
                    "exiting to restart from the last checkpoint"
                )
            log_fn(f"{cluster.task_name} lost its session: {lost} is gone or restarted; checking peers")
            wait_for_peers(others, config.peer_wait_secs, report=log_fn)
            latest = v1.train.latest_checkpoint(logdir) if cluster.is_chief else None
            log_fn(
                f"{cluster.task_name} every peer is reachable again; resuming from {latest or 'the chief'}"
            )

    def built(b: trainer.Built) -> None:
        if cluster.is_chief and strategy.plan is not None:
            log_fn(placement.report(b.graph, cluster.num_ps, "placement (variables per PS)"))
        if on_built is not None and cluster.is_chief:
            on_built()

    trainer.train(
        cluster, config, strategy, logdir, target, session_config, built, log_fn, on_reconnect=on_reconnect
    )
    if not cluster.is_local:
        signal_done(cluster, target)
    return 0


def _run_evaluator(cluster: Cluster, config: TrainConfig, logdir: str, on_built, log_fn) -> int:
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
            log_fn(f"evaluator: step {step}  eval loss {mean_loss:.4f}  accuracy {mean_acc:.3f}")
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
    log_fn: Callable[[str], None] = log.info,
) -> int:
    """The whole life of one task; returns its exit code (errors raise DisttrainError)."""
    config.validate()
    set_process_threads(config.intra_op_threads, config.inter_op_threads, log_fn)
    return ROLES[cluster.task_type](cluster, config, logdir, on_built, log_fn)


def set_process_threads(intra: int, inter: int, log_fn: Callable[[str], None] = log.info) -> None:
    """Size TF's process-wide thread pools, which a session's ConfigProto does not reach.

    Creating a Saver builds the process-wide pool at its default size (every
    core), and kernels then run there whatever `intra_op_parallelism_threads`
    says (measured: the MLP alone at 8.7 steps/s on 2 cores with
    intra_op_threads=1, 5.7 when really on one). Must run before TF's runtime
    starts; 0 keeps TF's default.
    """
    try:
        if intra:
            tf.config.threading.set_intra_op_parallelism_threads(intra)
        if inter:
            tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError as e:  # the runtime already started in this process (user code, tests)
        log_fn(f"WARNING thread pools already created, TrainConfig thread counts apply per session only: {e}")


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
