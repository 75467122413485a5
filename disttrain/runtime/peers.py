"""Servers and peers: what every task does around its own work, before and after it.

Starting this task's gRPC server (port checked first), waiting for peers with
a bound and naming the unreachable ones, naming the peers a task lost (a
probe decides, TF's error text adds detail: `disttrain.base.tf_errors`), and
checking that every task was started with the same cluster. What a PS does
once its server runs is `disttrain.runtime.ps_serving`.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import tensorflow as tf

from disttrain.base import quiet
from disttrain.base.cluster import Cluster
from disttrain.base.deadlines import Deadlines
from disttrain.base.errors import ConfigError, TransientError
from disttrain.base.tf_errors import LostPeers, failed_in_tf_text, lost_peers

v1 = tf.compat.v1
log = logging.getLogger("disttrain")


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
    with quiet.tf_start_up():  # "Started server with target: grpc://..."
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
    say_every_secs: float = 10.0,
) -> None:
    """Block until every peer accepts TCP connections; name the first that never did.

    Says whom it waits for, since when and how long before it gives up: on
    the first miss, then every `say_every_secs`.
    """
    start = time.monotonic()
    since = time.strftime("%H:%M:%S")
    deadline = start + timeout_secs
    pending = list(targets)
    said = None
    while pending:
        name, address = pending[0]
        if _accepts(address):
            pending.pop(0)
            continue
        now = time.monotonic()
        if said is None or now - said >= say_every_secs:
            said = now
            log.info(
                f"waiting for {name} at {address}: not reachable, waiting since {since} "
                f"({now - start:.0f} s), giving up in {max(0.0, deadline - now):.0f} s "
                f"(peer_wait_secs={timeout_secs:.0f})"
            )
        if now > deadline:
            raise TransientError(
                f"{name} at {address} is unreachable after {timeout_secs:.0f} s: is it running, "
                "and is the address right? (TrainConfig.peer_wait_secs sets the wait)"
            )
        time.sleep(poll_secs)


def _accepts(address: str, timeout_secs: float = Deadlines.PROBE_SECS) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_secs):
            return True
    except OSError:
        return False


def probe(targets: list[tuple[str, str]], timeout_secs: float = Deadlines.PROBE_SECS) -> dict[str, bool]:
    """Whether each peer accepts a TCP connection now: one try each, all at once."""
    if not targets:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(targets))) as pool:
        up = pool.map(lambda t: _accepts(t[1], timeout_secs), targets)
        return {name: ok for (name, _), ok in zip(targets, up, strict=True)}


def probe_lost(cluster: Cluster, talks_to: list[tuple[str, str]], tf_texts: list[str]) -> LostPeers:
    """Probe the peers this task talks to and the tasks TF's texts show failing; name the lost ones."""
    everyone = dict(peers(cluster, []))
    named = {task: everyone[task] for task in failed_in_tf_text(tf_texts) if task in everyone}
    targets = list({**dict(talks_to), **named}.items())
    return lost_peers(cluster.task_name, tf_texts, probe(targets))


# ---- every task must see the same cluster ----------------------------------

_SPEC_TABLE = "disttrain_cluster_spec"


def check_cluster_agrees(cluster: Cluster, target: str, anchor: str, timeout_secs: float) -> None:
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
