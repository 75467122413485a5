"""Servers, peers and the end of training: what every task does around its own work.

Starting this task's gRPC server (port checked first), waiting for peers with
a bound and naming the unreachable ones, naming the peers a task lost (a
probe decides, TF's error text adds detail), checking that every task was
started with the same cluster, and the done queue through which replicas
tell each PS that training is over (TF's `server.join()` never returns).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import queue
import re
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

import tensorflow as tf

from disttrain import preemption, quiet
from disttrain.cluster import PS, Cluster
from disttrain.deadlines import Deadlines
from disttrain.errors import ConfigError, TransientError

v1 = tf.compat.v1
log = logging.getLogger("disttrain")

_DONE_QUEUE = "disttrain_done"
_PREEMPT_QUEUE = "disttrain_preempt"
_FINISHED_QUEUE = "disttrain_finished"


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


# ---- who was lost ------------------------------------------------------------

# TF's gRPC errors name the task each failed call went to: "Additional GRPC error information from
# remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RecvTensor:", then
# that task's answer on the next line (after an escaped "\n" when nested in another task's answer).
# A task whose answer names another remote target only passed that task's failure on.
_REMOTE_TARGET = re.compile(
    r"remote target (/job:\w+/replica:\d+/task:\d+) while calling [\w./]*:(?:\n|\\n)(.*)"
)
_FROM_LINE = re.compile(r"^(?:([A-Z_]+): )?From /job:\S+:$")
_STATUS_LINE = re.compile(r"^([A-Z_]+): (.+)$")
_FRAMING = ("Graph execution error:", "Detected at node ", "File ", "Node: ")


def _short(task: str) -> str:
    return re.sub(r"/replica:\d+", "", task)


def _task_order(task: str) -> tuple[str, int]:
    job, _, index = task.rpartition("/task:")
    return (job, int(index)) if index.isdigit() else (task, -1)


def _error_part(text: str) -> str:
    """The error in a MonitoredSession log record ("... may be due to a preemption ... Error: <error>")."""
    return text.split("Error:", 1)[1] if "may be due to a preemption" in text else text


def failed_in_tf_text(texts: Iterable[str]) -> list[str]:
    """Tasks TF's error texts show failing to answer, not those that only passed a failure on.

    If every named task only relayed (TF's format changed?), every named task.
    """
    direct, named = set(), set()
    for text in texts:
        for m in _REMOTE_TARGET.finditer(_error_part(text)):
            task, answer = _short(m.group(1)), m.group(2)
            named.add(task)
            if "remote target" not in answer:
                direct.add(task)
    return sorted(direct or named, key=_task_order)


_PEER_FAILED = re.compile(r"^(ABORTED|UNAVAILABLE): From /job:", re.M)


def failed_with_a_peer(text: str) -> bool:
    """Whether the text of a TF InternalError, CancelledError or FailedPreconditionError is a lost peer.

    TF raises a step whose parts failed together as one of their errors. A
    peer that tore down its side of a collective (aborted itself, or
    restarted) answers with InternalError ("Collective ops is aborted by:
    Delete called on non-empty BufRendezvous ... from remote target ...");
    a part of this task cancelled beside a peer's ABORTED or UNAVAILABLE
    comes up as CancelledError. A replica restarted while the group's leader
    still holds the group of its previous life is refused with
    FailedPreconditionError ("Collective ops is aborted by: Device ...
    current incarnation doesn't match ... from remote target ..."). All are a
    lost or restarted peer, transient like the Unavailable and Aborted errors
    themselves. A mismatch between the members of a collective (shapes,
    group sizes) is the run's own fault and stays an error.
    """
    if "mismatch" in text:
        return False
    collective = "Collective ops is aborted by" in text and "from remote target" in text
    return collective or bool(_PEER_FAILED.search(text))


def first_error_line(texts: Iterable[str]) -> str:
    """TF's first error line, e.g. "UNAVAILABLE: recvmsg:Connection reset by peer".

    Skips TF's framing ("Graph execution error:", "=====", where the failed op was built)
    and its "From <task>:" lines, which name the task that reported the error (often this
    task), not the one that failed.
    """
    for text in texts:
        status = ""
        for line in _error_part(text).splitlines():
            line = line.strip()
            if not line or set(line) == {"="} or line.startswith(_FRAMING):
                continue
            framing = _FROM_LINE.match(line)
            if framing:
                status = framing.group(1) or status
                continue
            if status and not _STATUS_LINE.match(line):
                line = f"{status}: {line}"
            return line[:200]
    return ""


@dataclasses.dataclass(frozen=True)
class LostPeers:
    """Who this task lost, as far as a probe and TF's error texts tell."""

    gone: tuple[str, ...] = ()  # unreachable when probed
    restarted: tuple[str, ...] = ()  # TF's errors name them, but they answer again
    unprobed: tuple[str, ...] = ()  # TF's errors name them; not probed
    error: str = ""  # TF's first error line

    def __str__(self) -> str:
        def tasks(names, one, many):
            return f"{', '.join(names)} {one if len(names) == 1 else many}"

        parts = []
        if self.gone:
            parts.append(tasks(self.gone, "is gone", "are gone"))
        if self.restarted:
            parts.append(tasks(self.restarted, "restarted", "restarted"))
        if self.unprobed:
            parts.append(tasks(self.unprobed, "is gone or restarted", "are gone or restarted"))
        if not parts:
            return f"a peer is gone or restarted (TF: {self.error or 'no error text'})"
        return " and ".join(parts)


def lost_peers(me: str | None, tf_texts: Iterable[str], reachable: Mapping[str, bool]) -> LostPeers:
    """Name the peers this task lost: never itself; the probe decides, TF's texts add detail.

    `tf_texts`: what TF raised or logged about the failure; `reachable`: a probe
    of peers (task name -> accepts connections now). Probed peers that do not
    answer are gone, whatever TF said. Tasks TF's texts show failing that answer
    again were restarted (a restarted task keeps its address). TF's text often
    names this task too (it relayed a peer's failure): it is never reported.
    """
    tf_texts = list(tf_texts)
    me = _short(me) if me else None
    reachable = {_short(task): up for task, up in reachable.items()}
    gone = [task for task, up in reachable.items() if not up and task != me]
    named = [task for task in failed_in_tf_text(tf_texts) if task != me and task not in gone]
    return LostPeers(
        gone=tuple(sorted(gone, key=_task_order)),
        restarted=tuple(task for task in named if task in reachable),
        unprobed=tuple(task for task in named if task not in reachable),
        error=first_error_line(tf_texts),
    )


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


def signal_done(
    cluster: Cluster, target: str, timeout_secs: float = Deadlines.TELL_PS_SECS, only: str | None = None
) -> None:
    """Tell every PS (`only`: that one) this replica has finished; return within about `timeout_secs`.

    A PS that has already exited is not an error (it ends `ps_linger_secs`
    after the chief, whoever has reported), but it must not be contacted:
    creating a session waits for ever for any task its device filters name
    (TF's device lookup has no timeout, and RunOptions do not reach it). So
    the PS tasks are probed first and the session names only those that
    answer. One that exits between the probe and the session is given up
    after `timeout_secs`; the thread left waiting for it is a daemon and does
    not hold up the exit.
    """
    if not cluster.num_ps:
        return
    targets = [(f"/job:ps/task:{i}", address) for i, address in enumerate(cluster.jobs[PS])]
    up = probe([(name, address) for name, address in targets if only in (None, name)])
    gone = [name for name, _ in targets if name in up and not up[name]]
    if gone:
        them = "it" if len(gone) == 1 else "them"
        log.info(
            f"{cluster.task_name}: {', '.join(gone)} already gone; not telling {them} this replica is done"
        )
    live = {i: name for i, (name, _) in enumerate(targets) if up.get(name)}
    if not live:
        return
    told: list[str] = []

    def tell():
        options = v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
        with tf.Graph().as_default() as graph:
            ops = {i: _done_queue(i, cluster.num_replicas).enqueue(cluster.replica_index) for i in live}
            config = v1.ConfigProto(device_filters=[*live.values(), cluster.task_name])
            try:
                with v1.Session(target, graph=graph, config=config) as session:
                    for i, op in ops.items():
                        try:
                            session.run(op, options=options)
                            told.append(live[i])
                        except tf.errors.OpError:
                            pass  # named below with the others not told
            except tf.errors.OpError:
                pass

    thread = threading.Thread(target=tell, name="disttrain-signal-done", daemon=True)
    thread.start()
    thread.join(timeout_secs)
    missed = [name for name in live.values() if name not in told]
    if missed:
        log.warning(
            f"{cluster.task_name}: could not tell {', '.join(missed)} that this replica is done "
            f"within {timeout_secs:.0f} s (gone meanwhile?); exiting anyway"
        )


def finished_queue(num_replicas: int):
    """PS 0's queue of the replicas that have finished training (their index each): the chief reads its size.

    A replica posts once its own training has ended and its updates are
    applied; an asynchronous chief waits for the others' posts before its
    final checkpoint. Shared by name, so it outlives a restarted chief.
    """
    with tf.device("/job:ps/task:0"):
        return v1.FIFOQueue(
            capacity=max(num_replicas, 1) * 4,
            dtypes=[tf.int32],
            shapes=[[]],
            shared_name=_FINISHED_QUEUE,
            name=_FINISHED_QUEUE,
        )


def preempt_notice(ps_index: int):
    """A PS's preemption queue: the PS posts to it on SIGTERM, the replicas read its size."""
    with tf.device(f"/job:ps/task:{ps_index}"):
        return v1.FIFOQueue(
            capacity=16,
            dtypes=[tf.int32],
            shapes=[[]],
            shared_name=f"{_PREEMPT_QUEUE}_{ps_index}",
            name=f"{_PREEMPT_QUEUE}_{ps_index}",
        )


def serve_until_done(cluster: Cluster, target: str, linger_secs: float, preempted_secs: float) -> set:
    """Run a PS until every replica is done, or `linger_secs` after the chief is; or a preemption.

    Returns the replica indices that reported. The chief (replica 0) always
    reports last in its own life (after the final checkpoint), so a replica
    that died and never came back cannot keep the PS alive forever. Once
    `preemption.requested()` (SIGTERM), the PS posts to its preemption queue
    so that the replicas stop and the chief checkpoints, and returns as soon as
    the chief has reported, or after `preempted_secs` (`Deadlines.ps_preempted_secs`).
    """
    with tf.Graph().as_default() as graph:
        done = _done_queue(cluster.task_index, cluster.num_replicas)
        dequeue, close = done.dequeue(), done.close(cancel_pending_enqueues=True)
        notice = preempt_notice(cluster.task_index).enqueue(1)
        config = v1.ConfigProto(device_filters=[cluster.task_name])
        with v1.Session(target, graph=graph, config=config) as session:
            arrivals: queue.Queue[int | None] = queue.Queue()

            def take():
                # Blocks without a timeout: one that timed out every second would make TF log
                # its cancellation lines every second. Closing the queue ends it.
                try:
                    while True:
                        arrivals.put(int(session.run(dequeue)))
                except tf.errors.OpError:
                    arrivals.put(None)

            taker = threading.Thread(target=take, name="disttrain-done-queue", daemon=True)
            taker.start()
            try:
                return _count_reports(cluster, session, notice, arrivals, linger_secs, preempted_secs)
            finally:
                with contextlib.suppress(tf.errors.OpError):
                    session.run(close)
                taker.join(Deadlines.DONE_QUEUE_CLOSE_SECS)


def _count_reports(cluster, session, notice, arrivals, linger_secs, preempted_secs) -> set[int]:
    reported: set[int] = set()
    deadline = None
    noticed = False
    while len(reported) < cluster.num_replicas:
        now = time.monotonic()
        if preemption.requested() and not noticed:
            noticed = True
            session.run(notice)
            log.info(f"{cluster.task_name}: told the replicas; waiting for the chief's checkpoint")
            if 0 in reported:
                break
            bound = now + preempted_secs
            deadline = bound if deadline is None else min(deadline, bound)
        if deadline is not None and now >= deadline:
            missing = sorted(set(range(cluster.num_replicas)) - reported)
            log.warning("replicas %s never reported done; ending the PS anyway", missing)
            break
        try:  # a short wait, so that the signal handler runs and the flag is read
            index = arrivals.get(timeout=0.5)
        except queue.Empty:
            continue
        if index is None:
            break
        reported.add(index)
        if index == 0 and noticed:
            # The chief has checkpointed. Leave now: a replica restarted meanwhile would take
            # this PS's notice for a new preemption, and the others have been told.
            break
        if index == 0 and deadline is None:
            deadline = time.monotonic() + linger_secs
    return reported
