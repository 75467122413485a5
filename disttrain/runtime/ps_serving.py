"""PS serving: a PS task's life after its server starts, and the queues on the PS tasks.

TF's `server.join()` never returns, so a PS serves until every replica has
told it training is over (the done queue on each PS), or `ps_linger_secs`
after the chief has, or until a preemption notice (its preemption queue)
has been read. PS 0 also holds the queue of replicas that have finished
(the chief reads its size before its last checkpoint).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time

import tensorflow as tf

from disttrain.base import preemption
from disttrain.base.cluster import PS, Cluster
from disttrain.base.deadlines import Deadlines
from disttrain.runtime.peers import probe

v1 = tf.compat.v1
log = logging.getLogger("disttrain")


class PsQueues:
    """The queues on the PS tasks through which tasks tell each other that training ends.

    Shared by name (`shared_name`), so they outlive a task that restarts:
    every task makes the same ops in its own graph and they meet on the PS.
    Three messages, each one int32:

    - DONE, on every PS i (`done(i)`): a replica's index, once its training
      has ended (also from a replica started after the end, and, when PS i
      is preempted, to that PS only: `signal_done`). PS i leaves once every
      replica has posted, or `ps_linger_secs` after replica 0 (`serve_until_done`).
    - FINISHED, on ps0 (`finished()`): an asynchronous PS strategy's worker's
      index, once its training has ended and was not a preemption's; the
      chief reads the queue's size before its final checkpoint.
    - PREEMPTED, on every PS i (`preempted(i)`): one element, posted by PS i
      when it gets SIGTERM; every replica reads the size (`PreemptionHook`).
    """

    DONE = "disttrain_done"
    FINISHED = "disttrain_finished"
    PREEMPTED = "disttrain_preempt"
    PREEMPTED_CAPACITY = 16

    def __init__(self, num_replicas: int):
        self.capacity = max(num_replicas, 1) * 4  # every replica's post, restarts included

    def done(self, ps_index: int):
        """PS `ps_index`'s queue of the replicas that are done (their index each)."""
        return self._queue(ps_index, f"{self.DONE}_{ps_index}", self.capacity)

    def finished(self):
        """PS 0's queue of the replicas that have finished training (their index each)."""
        return self._queue(0, self.FINISHED, self.capacity)

    def preempted(self, ps_index: int):
        """PS `ps_index`'s preemption queue: the PS posts to it on SIGTERM, the replicas read its size."""
        return self._queue(ps_index, f"{self.PREEMPTED}_{ps_index}", self.PREEMPTED_CAPACITY)

    @staticmethod
    def _queue(ps_index: int, name: str, capacity: int):
        with tf.device(f"/job:ps/task:{ps_index}"):
            return v1.FIFOQueue(
                capacity=capacity, dtypes=[tf.int32], shapes=[[]], shared_name=name, name=name
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
            queues = PsQueues(cluster.num_replicas)
            ops = {i: queues.done(i).enqueue(cluster.replica_index) for i in live}
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


def serve_until_done(
    cluster: Cluster, target: str, linger_secs: float, preempted_secs: float, notice: preemption.Notice
) -> set:
    """Run a PS until every replica is done, or `linger_secs` after the chief is; or a preemption.

    Returns the replica indices that reported. The chief (replica 0) always
    reports last in its own life (after the final checkpoint), so a replica
    that died and never came back cannot keep the PS alive forever. Once
    `notice` is requested (SIGTERM), the PS posts to its preemption queue
    so that the replicas stop and the chief checkpoints, and returns as soon as
    the chief has reported, or after `preempted_secs` (`Deadlines.ps_preempted_secs`).
    """
    with tf.Graph().as_default() as graph:
        queues = PsQueues(cluster.num_replicas)
        done = queues.done(cluster.task_index)
        dequeue, close = done.dequeue(), done.close(cancel_pending_enqueues=True)
        post_preempted = queues.preempted(cluster.task_index).enqueue(1)
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
                return _count_reports(
                    cluster, session, notice, post_preempted, arrivals, linger_secs, preempted_secs
                )
            finally:
                with contextlib.suppress(tf.errors.OpError):
                    session.run(close)
                taker.join(Deadlines.DONE_QUEUE_CLOSE_SECS)


def _count_reports(
    cluster, session, notice, post_preempted, arrivals, linger_secs, preempted_secs
) -> set[int]:
    """The replicas that reported done, counted until all have, the linger ends, or a preemption's bound."""
    reported: set[int] = set()
    deadline = None
    noticed = False
    while len(reported) < cluster.num_replicas:
        now = time.monotonic()
        if notice.requested() and not noticed:
            noticed = True
            session.run(post_preempted)
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
