"""Synchronous parameter servers: one update per step from N-b distinct replicas.

Each step, every replica

1. reads the global step `t` (before it reads any variable, so `t` is never
   newer than the parameters its gradients come from),
2. computes its gradients and adds them, tagged `t`, to one accumulator per
   variable that sits on the variable's PS; an accumulator whose step has
   moved past `t` drops them (stale),
3. reports `(replica, t)` on a queue on the PS, and
4. waits for its own release token.

An aggregator thread on the chief reads the reports. When N-b distinct
replicas have reported for the current step it takes the mean gradient of
each accumulator, applies one update, increments the global step and
releases those replicas. A report for an older step is a straggler whose
gradients were dropped: it is released at once and starts again from the
current parameters, so it never stalls the others.

What this fixes in TF's SyncReplicasOptimizer: a replica cannot count twice
in one step (it is blocked until the step closes, and the aggregator counts
replica ids, not gradients); tokens are handed out only to replicas that are
waiting, so a straggler does not pile up tokens; and at the end the chief
closes every token queue, so a replica still waiting stops at once instead
of hanging (no 120 s shutdown).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from typing import NamedTuple

import tensorflow as tf

from disttrain.base import preemption, tf_errors, tf_internals
from disttrain.base.deadlines import Deadlines
from disttrain.base.errors import ConfigError
from disttrain.strategies import sparse, transfer
from disttrain.strategies.ps import PsStrategy

v1 = tf.compat.v1
log = logging.getLogger("disttrain")

_DONE_QUEUE = "disttrain_sync_done"
_TOKEN_QUEUE = "disttrain_sync_token"
# The aggregator's own calls to the queues (Deadlines.AGGREGATOR_CALL_SECS).
_CALL_MS = int(Deadlines.AGGREGATOR_CALL_SECS * 1000)


class SyncParameterServer(PsStrategy):
    """Variables on PS tasks (balanced by bytes); one synchronous update per step.

    backup_workers: b. A step closes when the first N-b of the N replicas
      have reported; it applies the mean of the fresh gradients in the
      accumulators (those N-b, plus any other replica's that landed before
      the step closed; never a stale one, never two of one replica). Later
      gradients for that step are dropped, so up to b stragglers never slow
      the step. With b=0 a step is exactly the mean gradient of all N
      replicas: the same update as one process with N times the batch.
    piece_bytes: cut every variable larger than this into pieces, each
      accumulated and updated on its own, and read them in waves in the order
      the model asks for them, as AsyncParameterServer does.
    transfer_dtype: 'bfloat16' or 'float16' sends gradients, variable reads
      and a table's rows in 16 bits, cast on the side that sends them
      (`disttrain.strategies.transfer`); accumulators, variables, optimizer
      state and the update stay float32 on the PS.

    One increment of the global step consumes (N-b) x batch x towers x accumulate_steps examples.
    With a single replica (or no cluster) gradients are applied directly.
    """

    kind = "sync_ps"
    synchronous = True
    knobs = ("backup_workers", "piece_bytes", "transfer_dtype")
    aggregate_clipped_at = "the accumulators' mean, each variable's part on its PS"

    @dataclasses.dataclass
    class Made(PsStrategy.Made):
        """The sync PS's pieces of a build."""

        step: tf.Tensor | None = None  # the global step as read at the start of the step being built
        sync: _SyncOps | None = None  # the aggregation graph, built by the run's first step

    def __init__(
        self,
        cluster,
        backup_workers: int = 0,
        num_towers: int | None = None,
        max_imbalance: float = 0.05,
        piece_bytes: int | None = None,
        transfer_dtype: str | None = None,
    ):
        super().__init__(cluster, num_towers, max_imbalance, piece_bytes)
        self.transfer_dtype = transfer.parse(transfer_dtype, type(self).__name__)
        n = cluster.num_replicas
        if not 0 <= backup_workers < n:
            raise ConfigError(
                f"backup_workers={backup_workers} out of range: the cluster has {n} replica(s), "
                f"so it must be between 0 and {n - 1}"
            )
        self.backup_workers = backup_workers
        self.replicas_to_aggregate = n - backup_workers

    @property
    def aggregates(self) -> bool:
        """False with one replica: there is nothing to wait for."""
        return self.cluster.num_replicas > 1

    @property
    def _me(self) -> int:
        return max(self.cluster.replica_index, 0) if self.cluster.is_replica else 0

    # Whether a step closes only once every replica has reported (SyncHybrid: see _Aggregator).
    closes_with_every_replica = False

    def examples_per_step(self, batch_size: int) -> int:
        return self.replicas_to_aggregate * super().examples_per_step(batch_size)

    def compute_gradients(self, optimizer, loss, read=None):
        """As the base, but every variable read of this step comes after reading the global step.

        A gradient tagged with step t then never comes from parameters older
        than t. Only the reads wait: the initial values built in a loss
        function do not (the chief initialises them before any step). (With a
        loss tensor built before minimize() the order cannot be imposed; a
        replica reading during an update may then be tagged one step early,
        which only matters with backup workers.)
        """
        if not self.aggregates:
            return super().compute_gradients(optimizer, loss, read)
        global_step = v1.train.get_or_create_global_step()
        with tf.name_scope("sync_step"):
            step = self.made.step = tf.identity(global_step.read_value(), name="local_step")
        graph = v1.get_default_graph()
        before = len(graph.get_operations())
        grads_and_vars = super().compute_gradients(optimizer, loss, read)
        new = graph.get_operations()[before:]
        initializers = [v.initializer for v in v1.global_variables() + v1.local_variables()]
        for op in _step_reads(new, {op for op in initializers if op in set(new)}):
            tf_internals.add_control_input(op, step.op)
        return grads_and_vars

    def apply_gradients(self, optimizer, grads_and_vars, global_step):
        if not self.aggregates:
            sent = transfer.leaving(grads_and_vars, self.transfer_dtype)
            update = self.when_data(
                lambda: optimizer.apply_gradients(
                    self.clip_aggregate(transfer.arrived(sent)), global_step=global_step
                )
            )
            transfer.narrow_reads([update], self.transfer_dtype)
            return update
        if self.made.step is None:
            raise RuntimeError(
                "SyncParameterServer.apply_gradients needs compute_gradients first (use minimize)"
            )
        grads_and_vars = [
            (g if sparse.is_sparse(g) else tf.convert_to_tensor(g), v) for g, v in grads_and_vars
        ]
        sent = transfer.leaving(self._before_sending(grads_and_vars), self.transfer_dtype)
        accumulators, applies = self._accumulate(sent)
        done, tokens, release, drain = self._report_and_wait(global_step, applies)
        if self.step_in_run == 0:  # later steps of a run report to the same queues (shared names)
            self.made.sync = self._closing_ops(optimizer, global_step, accumulators, done, tokens, drain)
        train_op = tf.group(release, name="sync_train_op")
        transfer.narrow_reads([train_op], self.transfer_dtype)
        return train_op

    def _before_sending(self, grads_and_vars):
        """This replica's gradients as they leave for the accumulators (here: at once).

        Tests override it to make a straggler (tests/cluster/straggler.py).
        """
        return grads_and_vars

    def _accumulate(self, grads_and_vars) -> tuple[list, list]:
        """One accumulator per variable, on the variable's PS: (accumulator, var) pairs, and the adds.

        A gradient sent in 16 bits is cast back to the variable's dtype on the
        PS before it is added: accumulators hold float32.
        """
        accumulators, applies = [], []
        with tf.name_scope("sync_accumulate"):
            # A replica whose data has ended (Join) sends nothing: its gradients are tagged with a
            # step older than any, which every accumulator drops.
            step = self.made.step
            tag = step if self.data_weight is None else tf.where(self.data_weight > 0, step, -1)
            for grad, var in grads_and_vars:
                with tf.device(var.device):
                    grad = transfer.arriving(grad, var)
                    acc = _SparseMean(var) if sparse.is_sparse(grad) else _DenseMean(var, grad.dtype)
                    applies.append(acc.apply(grad, tag))
                accumulators.append((acc, var))
        return accumulators, applies

    def _report_and_wait(self, global_step, applies):
        """After the adds, report (replica, step), then wait for a release token.

        Reports and tokens live with the global step. Returns the report queue,
        the token queues, the wait, and the op that drains this replica's
        leftover tokens.
        """
        n = self.cluster.num_replicas
        with tf.device(global_step.device), tf.name_scope("sync_queues"):
            done = v1.FIFOQueue(
                4 * n, [tf.int32, tf.int64, tf.int32], shapes=[[], [], []], shared_name=_DONE_QUEUE
            )
            tokens = [
                v1.FIFOQueue(4, [tf.int64], shapes=[[]], shared_name=f"{_TOKEN_QUEUE}_{r}", name=f"token_{r}")
                for r in range(n)
            ]
            # How many of its towers read real data: 0 once its data has ended (it then waits for
            # each step without counting, until every replica's data has ended).
            weight = tf.constant(1) if self.data_weight is None else tf.cast(self.data_weight, tf.int32)
            with tf.control_dependencies(applies):
                report = done.enqueue((tf.constant(self._me, tf.int32), self.made.step, weight))
            with tf.control_dependencies([report]):
                release = tokens[self._me].dequeue()
            own = tokens[self._me]
            drain = own.dequeue_many(own.size())
        return done, tokens, release, drain

    def _closing_ops(self, optimizer, global_step, accumulators, done, tokens, drain) -> _SyncOps:
        """The chief's side: take the mean gradients, apply one update, release.

        Built on every task, so that all graphs hold the same variables (optimizer slots).
        """
        with tf.name_scope("sync_update"):
            # Fed by the aggregator: the fresh reports it counted for this step (fewer than
            # replicas_to_aggregate once some replicas' data has ended).
            with tf.device(global_step.device):
                needed = v1.placeholder_with_default(
                    tf.constant(self.replicas_to_aggregate), [], name="replicas_counted"
                )
            aggregated = []
            for acc, var in accumulators:
                with tf.device(var.device):
                    aggregated.append((acc.take(needed), var))
            aggregated = self.clip_aggregate(aggregated, colocate=True)
            # At the root name scope, as every other strategy applies them: the optimizer's own
            # variables (Adam's beta1_power) are then named alike in every strategy's checkpoint,
            # which therefore restores under any other strategy and in one process.
            with v1.name_scope(None):
                update = optimizer.apply_gradients(aggregated, global_step=global_step)
            with tf.device(global_step.device):
                current = global_step.read_value()
                reset = tf.group(*[acc.accumulator.set_global_step(current) for acc, _ in accumulators])
                release_ops = [q.enqueue(current) for q in tokens]
                waiting_tokens = [q.size() for q in tokens]
                with tf.control_dependencies([update]):
                    # Fetched together, these run the update once and then release.
                    update_and_release = [q.enqueue(global_step.read_value()) for q in tokens]
                close_ops = [q.close(cancel_pending_enqueues=True) for q in tokens]
                report = done.dequeue()
                # A report from replica -1 wakes the aggregator to stop; its tag says which one.
                nonce = v1.placeholder(tf.int64, [], name="aggregator_nonce")
                wake = done.enqueue((tf.constant(-1, tf.int32), nonce, tf.constant(0)))
        return _SyncOps(
            reset=reset,
            step=current,
            report=report,
            needed=needed,
            nonce=nonce,
            wake=wake,
            release=release_ops,
            tokens=waiting_tokens,
            update_and_release=update_and_release,
            close=close_ops,
            drain=drain,
        )

    def hooks(self, last_step: int | None = None, notice: preemption.Notice | None = None) -> list:
        sync = self.made.sync
        if not sync:
            return []
        hooks = [_DrainOwnTokens(sync.drain)]
        if self.cluster.is_chief:
            n, needed = self.cluster.num_replicas, self.replicas_to_aggregate
            every = self.closes_with_every_replica
            notice = preemption.given(notice)
            hooks.append(_Aggregator(sync, n, needed, last_step, every, self.steps_per_run, notice=notice))
        return hooks


def _what_failed(error: Exception) -> str:
    """TF's own status line of `error` and the op it failed at: its first line is only TF's framing."""
    line = tf_errors.first_error_line([str(error)]) or str(error).splitlines()[0]
    op = getattr(error, "op", None)
    return f"{line} (at {op.name})" if op is not None else line


_READS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd"})


def _step_reads(ops: list[tf.Operation], initializers: set) -> list[tf.Operation]:
    """The variable reads among `ops` a step makes: not those of initial values, nor in control flow."""
    initializing, stack = set(), list(initializers)
    while stack:
        op = stack.pop()
        if op not in initializing:
            initializing.add(op)
            stack += [t.op for t in op.inputs] + list(op.control_inputs)
    return [
        op
        for op in ops
        if op.type in _READS and op not in initializing and not tf_internals.in_control_flow(op)
    ]


class _SyncOps(NamedTuple):
    """The aggregation graph: what the chief's aggregator runs, and a restarted replica's drain."""

    reset: tf.Operation  # every accumulator's step set to the current global step
    step: tf.Tensor  # the current global step
    report: tf.Tensor  # the next (replica, step, towers with data) report, dequeued
    needed: tf.Tensor  # placeholder: how many fresh gradients this step's update takes
    nonce: tf.Tensor  # placeholder: the tag of the aggregator a wake-up report is for
    wake: tf.Operation  # a wake-up report (replica -1) carrying the fed nonce
    release: list  # per replica: a token with no update (its report was stale)
    tokens: list  # per replica: the tokens in its queue, not yet taken
    update_and_release: list  # per replica: a token after the one update (fetched together)
    close: list  # every token queue closed, pending enqueues cancelled
    drain: tf.Operation  # this replica's leftover tokens, thrown away


class _DenseMean:
    """A variable's dense gradients of one step, tagged with the step: their mean, stale ones dropped."""

    def __init__(self, var, dtype):
        self.accumulator = v1.ConditionalAccumulator(
            dtype, shape=var.shape, shared_name=f"{var.op.name}/grad_accum"
        )

    def apply(self, grad, step):
        return self.accumulator.apply_grad(grad, local_step=step)

    def take(self, num_required: int):
        return self.accumulator.take_grad(num_required)


class _SparseMean:
    """A table's sparse gradients of one step: the mean over the replicas that sent one, as rows.

    TF's sparse accumulator in "MEAN" mode divides each row by the number of
    gradients that touched that row, which is not the step's mean gradient.
    So it sums ("SUM"), and every gradient carries one extra row past the
    table's last (a counter of ones), whose sum is the number of gradients
    accumulated: the mean divides by that count, read in the same take as the
    rows. Like the dense accumulator, it drops gradients tagged with a stale step.
    """

    def __init__(self, var):
        self._rows, self._width = var.shape[0], var.shape[1:]
        self._shape = [self._rows + 1, *self._width]
        self._dtype = var.dtype.base_dtype
        self._var_shape = sparse.shape_of(var)
        self.accumulator = v1.SparseConditionalAccumulator(
            self._dtype,
            shape=self._shape,
            shared_name=f"{var.op.name}/sparse_grad_accum",
            reduction_type="SUM",
        )

    def apply(self, grad, step):
        counter = tf.ones([1, *self._width], self._dtype)
        counted = tf.IndexedSlices(
            tf.concat([tf.cast(grad.values, self._dtype), counter], axis=0),
            tf.concat([tf.cast(grad.indices, tf.int64), tf.constant([self._rows], tf.int64)], axis=0),
            tf.constant(self._shape, tf.int64),
        )
        return self.accumulator.apply_indexed_slices_grad(counted, local_step=step)

    def take(self, num_required: int) -> tf.IndexedSlices:
        summed = self.accumulator.take_indexed_slices_grad(num_required)
        summed.indices.set_shape([None])
        summed.values.set_shape([None, *self._width])
        is_row = tf.not_equal(summed.indices, self._rows)
        counters = tf.boolean_mask(summed.values, tf.logical_not(is_row))
        count = tf.reduce_sum(tf.reshape(counters, [tf.shape(counters)[0], -1])[:, 0])
        values = tf.boolean_mask(summed.values, is_row) / count
        return tf.IndexedSlices(values, tf.boolean_mask(summed.indices, is_row), self._var_shape)


class _DrainOwnTokens(v1.train.SessionRunHook):
    """A replica that restarts throws away a release token left from its previous life.

    Otherwise its first step would not wait and it could report twice for one step.
    """

    def __init__(self, drain):
        self._drain = drain

    def after_create_session(self, session, coord):
        session.run(self._drain)


class _Aggregator(v1.train.SessionRunHook):
    """The chief's thread that closes steps: N-b distinct fresh reports -> one update -> release.

    It blocks on the report queue without a timeout: a dequeue cancelled by a
    timeout can lose the report it was completing, and a lost report is a
    replica that waits for ever. To stop, a watcher thread waits for the
    coordinator's stop (the end of the session, normal or not) and enqueues a
    wake-up report carrying this aggregator's nonce.

    At the end of training (`end`, which TF calls only when the loop ended
    without an error, and not preempted) it closes every token queue, so
    replicas still waiting (a straggler) stop at once instead of hanging. Any
    other stop leaves the queues open for the next aggregator: a closed queue
    outlives the chief on the PS, and a session recovered after a PS restart
    (the queues live with the global step, often on a PS that did not
    restart) or a restarted chief would find it closed. Every replica is
    released instead, through every step left in the chief's run: one left
    waiting would never see the stop (the chief's own step waited for a token
    while its aggregator, stopped by a lost PS, could no longer send one: the
    20-minute soak hung there).

    A report tagged `last_step` or later is released at once, with no update:
    with backup workers, a straggler released from a stale step can start one
    more step after the others have closed the last one and left (its stop
    check saw the step it had read). Counted, it would wait for ever for a
    second report.

    Uneven inputs (Join): a report with no towers of real data comes from a
    replica whose input has ended. It is not counted; it waits for the open
    step to close and is released with it (at once, if its step has closed:
    under SyncHybrid the next step's ring needs it), and the steps close on
    the replicas still reading (N-b less those whose input ended, at least
    one).
    When every replica's input has ended, training is over: the token queues
    are closed and every replica stops.

    With `every` (SyncHybrid) a step closes only once every replica has
    reported, those whose input ended included, and all are released by one
    run: their steps share one step id (the ring's collectives synchronise
    it), and the first to end cleans that step up on the PS, which would
    abort another replica's part of it still waiting there for its token.
    """

    def __init__(
        self,
        ops: _SyncOps,
        num_replicas: int,
        needed: int,
        last_step: int | None = None,
        every: bool = False,
        steps_per_run: int = 1,
        *,
        notice: preemption.Notice,
    ):
        self._ops, self._n, self._needed, self._last_step = ops, num_replicas, needed, last_step
        self._every, self._steps_per_run, self._notice = every, steps_per_run, notice
        self._in_run = threading.Event()  # the chief's main thread is inside a run of the train op
        self._threads: list[threading.Thread] = []
        self._closing = False  # set at the end of training: the token queues are being closed
        self.ended: set[int] = set()  # replicas whose input has ended (Join)
        self.steps = self.stale = 0
        self.contributions = [0] * num_replicas  # steps each replica's gradients were part of

    def after_create_session(self, session, coord):
        # A recovered session gets a new aggregator; the old one was woken by its coordinator.
        nonce = random.randrange(1, 2**62)
        self._threads = [
            threading.Thread(
                target=self._run, args=(session, coord, nonce), name="disttrain-sync-aggregator"
            ),
            threading.Thread(target=self._watch, args=(session, coord, nonce), name="disttrain-sync-watcher"),
        ]
        for thread in self._threads:
            thread.daemon = True
            coord.register_thread(thread)
            thread.start()

    def _watch(self, session, coord, nonce: int):
        coord.wait_for_stop()
        try:
            feed = {self._ops.nonce: nonce}
            session.run(self._ops.wake, feed_dict=feed, options=v1.RunOptions(timeout_in_ms=_CALL_MS))
        except Exception as e:  # noqa: BLE001 - best effort: the session may be gone
            log.warning("could not stop the sync aggregator: %s", str(e).splitlines()[0])

    def before_run(self, run_context):
        self._in_run.set()

    def after_run(self, run_context, run_values):
        self._in_run.clear()

    def end(self, session):
        if self._notice.requested():
            return  # the restarted chief's aggregator goes on with the same queues
        self._close_queues(session)

    def _closes(self, arrived: set[int], waiting: set[int]) -> bool:
        """Whether the open step closes now: enough fresh reports, or (`every`) every replica's."""
        if self._every:
            return bool(arrived) and len(arrived | waiting) == self._n
        return bool(arrived) and len(arrived) >= max(1, self._needed - len(self.ended))

    def _close_queues(self, session) -> None:
        """The end of training: every replica waiting at its token stops (its dequeue fails)."""
        self._closing = True
        try:
            session.run(self._ops.close, options=v1.RunOptions(timeout_in_ms=_CALL_MS))
        except Exception as e:  # noqa: BLE001 - best effort: the session may be gone
            log.warning("could not close the sync token queues: %s", str(e).splitlines()[0])

    def _ended_input(self, session, replica: int, step: int) -> bool:
        """Note that `replica`'s data has ended; once every replica's has, end training (True)."""
        if replica not in self.ended:
            self.ended.add(replica)
            log.info(
                f"sync aggregator: replica {replica}'s input has ended at global step {step}; "
                f"{self._n - len(self.ended)} of {self._n} replicas still read data"
            )
        if len(self.ended) < self._n:
            return False
        log.info(f"sync aggregator: every replica's input has ended at global step {step}: training is over")
        self._close_queues(session)
        return True

    def _release_the_rest_of_the_run(self, session) -> None:
        """After a stop that is not the end: a token for each step left in the chief's run.

        A run of k steps waits for a token in each of them, and the chief sees
        the stop only once its run returns. So while it runs, a replica whose
        queue is empty (it took its token) gets another, up to k in all: the
        others' runs go on beside the chief's (under SyncHybrid its ring pairs
        their steps). Those steps change nothing (no update closes them); a
        spare token is drained when a session is created.
        """
        ops, given, options = self._ops, [1] * self._n, v1.RunOptions(timeout_in_ms=_CALL_MS)
        taken_at = time.monotonic()
        while self._in_run.is_set() and min(given) < self._steps_per_run:
            if time.monotonic() - taken_at > Deadlines.RELEASE_IDLE_SECS:
                log.warning(
                    "sync aggregator: the chief's run took no token for %.0f s", Deadlines.RELEASE_IDLE_SECS
                )
                return
            empty = [r for r, n in enumerate(session.run(ops.tokens, options=options)) if n == 0]
            empty = [r for r in empty if given[r] < self._steps_per_run]
            if empty:
                session.run([ops.release[r] for r in empty], options=options)
                for r in empty:
                    given[r] += 1
                taken_at = time.monotonic()
            else:
                time.sleep(0.01)

    def _run(self, session, coord, nonce: int):
        ops = self._ops
        arrived: set[int] = set()  # counted for the open step
        waiting: set[int] = set()  # data ended: released when the open step closes, not counted
        try:
            session.run(ops.reset)
            step = int(session.run(ops.step))
            while True:
                replica, tag, weight = (int(x) for x in session.run(ops.report))
                if replica < 0:
                    if tag == nonce:
                        break
                    continue  # the wake-up of an earlier aggregator
                if weight == 0:
                    if self._ended_input(session, replica, step):
                        return  # every replica's data has ended: the queues are closed
                    if tag < step and not self._every:  # its step has closed: it must not wait for the next
                        session.run(ops.release[replica])
                        continue
                    waiting.add(replica)
                elif tag != step:  # its gradients were dropped: let it start again from fresh values
                    self.stale += 1
                    session.run(ops.release[replica])
                    continue
                elif self._last_step is not None and tag >= self._last_step:
                    session.run(ops.release[replica])  # past the end: it stops on seeing the step
                    continue
                else:
                    self.ended.discard(replica)  # restarted from an earlier position: it reads again
                    arrived.add(replica)
                if self._closes(arrived, waiting):
                    feed = {ops.needed: len(arrived)}
                    session.run([ops.update_and_release[r] for r in sorted(arrived | waiting)], feed)
                    step += 1
                    self.steps += 1
                    for r in arrived:
                        self.contributions[r] += 1
                    arrived.clear()
                    waiting.clear()
        except Exception as e:  # noqa: BLE001 - handed to the coordinator, which re-raises it
            if not (coord.should_stop() or self._closing):
                # Said here too: the coordinator re-raises it only once the chief's step returns.
                log.warning("sync aggregator stopped: %s: %s", type(e).__name__, _what_failed(e))
                coord.request_stop(e)
        finally:
            self._leave(session)

    def _leave(self, session) -> None:
        """As the aggregator stops: the waiting replicas released, unless the queues close; its counts said.

        Not the end of training: every replica waiting at its token (counted or
        not yet) is released, so that its step returns and its session sees the
        stop (a lost PS: the session is recovered); each redoes its step with
        fresh values and reports to the next aggregator. A spare token is
        drained when a session is created (_DrainOwnTokens).
        """
        if not self._closing:
            try:
                session.run(self._ops.release, options=v1.RunOptions(timeout_in_ms=_CALL_MS))
                self._release_the_rest_of_the_run(session)
            except Exception as e:  # noqa: BLE001 - best effort: the session may be gone
                log.warning("could not release the waiting replicas: %s", str(e).splitlines()[0])
        log.info(
            "sync aggregator: %d steps closed, per replica [%s], %d stale reports dropped",
            self.steps,
            ", ".join(map(str, self.contributions)),
            self.stale,
        )
