"""Asynchronous parameter servers: each worker applies its own gradients."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable

import tensorflow as tf

from disttrain.base import preemption, tf_errors, tf_internals
from disttrain.base.deadlines import Deadlines
from disttrain.strategies import sparse, transfer, waves
from disttrain.strategies.ps import PsStrategy

v1 = tf.compat.v1
log = logging.getLogger("disttrain")


class AsyncParameterServer(PsStrategy):
    """Variables on PS tasks, balanced by bytes; every replica updates them on its own.

    No replica waits for another, so a slow or lost worker never stalls the
    rest; the price is that gradients may be computed from slightly stale
    variables. One increment of the global step is one replica's batch.

    overlap: take the network out of the step. The model reads worker-side
      copies of the variables, and a step ends once its gradients are queued
      on the worker. A transfer loop (a queue runner: its own thread and
      session.run, started, stopped and error-checked with the session) takes
      each queued gradient, applies it on the PS and pulls each variable into
      its copy as soon as that variable is updated, while the next steps
      compute. The queue holds one gradient, so a step waits only if the loop
      is more than a step behind: gradients are at most two updates of this
      worker stale (plus whatever other workers pushed), none is dropped, and
      the last ones are applied before the session closes. Hooks read a
      worker-side mirror of the global step, so a step never touches a PS.
      Embedding tables are the exception: they are never copied (only the
      rows a step looks up cross the network, in the step, gathered on the
      PS that holds them), and their sparse gradients are queued and pushed
      as rows like the rest.
    transfer_dtype: 'bfloat16' or 'float16' sends gradients, variable reads
      and a table's rows in 16 bits, cast on the side that sends them
      (`disttrain.strategies.transfer`), with or without overlap; variables,
      optimizer state and the update stay float32 on the PS.
    piece_bytes: cut every variable larger than this into pieces (partitioned
      variables on the PS, each updated on its own) and move them in order,
      a couple of waves at a time (`disttrain.strategies.waves`). With
      overlap, each piece is applied and pulled back while the next ones are
      pushed, so both directions of the link are busy; without, a step's
      reads arrive in the order the model asks for them, first layers first.
      Only `get_variable` variables can be cut (Keras layers' stay whole).
    """

    kind = "async_ps"
    synchronous = False
    knobs = ("overlap", "transfer_dtype", "piece_bytes")

    @dataclasses.dataclass
    class Made(PsStrategy.Made):
        """The overlap's pieces of a build, made by its first step of the run."""

        copies: list = dataclasses.field(default_factory=list)  # (worker copy, PS variable)
        transfer_op: tf.Operation | None = None  # one round of the transfer loop
        counts: tuple | None = None  # (gradients queued, gradients applied) on this worker
        loop: _TransferLoop | None = None
        enqueue_and_count: Callable | None = None  # (flat gradients) -> queue them and count them

    def __init__(
        self,
        cluster,
        num_towers: int | None = None,
        max_imbalance: float = 0.05,
        overlap: bool = False,
        transfer_dtype: str | None = None,
        piece_bytes: int | None = None,
    ):
        super().__init__(cluster, num_towers, max_imbalance, piece_bytes)
        self.overlap = overlap
        self.transfer_dtype = transfer.parse(transfer_dtype, type(self).__name__)

    @property
    def transfer_op(self) -> tf.Operation | None:
        """One round of the overlap's transfer loop (None without overlap, or before minimize())."""
        return self.made.transfer_op

    def _local_copy(self, var) -> tf.Tensor:
        """The worker-side copy the model reads instead of `var` (created on first use)."""
        with tf.device(self.compute_devices[0]), tf.name_scope("local_copy"):
            copy = _local_variable(var.read_value, var.op.name.replace("/", "_"))
            self.made.copies.append((copy, var))
            return copy.read_value()

    def compute_gradients(self, optimizer, loss, read=None):
        return super().compute_gradients(optimizer, loss, read=self._copy_of if self.overlap else read)

    def _copy_of(self, var) -> tf.Tensor:
        """A read of `var`'s worker-side copy: the one the run's first step made, else a new one."""
        for copy, original in self.made.copies:
            if original is var:
                return copy.read_value()
        return self._local_copy(var)

    def apply_gradients(self, optimizer, grads_and_vars, global_step):
        if not self.overlap:
            sent = transfer.leaving(grads_and_vars, self.transfer_dtype)
            step = self.when_data(
                lambda: optimizer.apply_gradients(transfer.arrived(sent), global_step=global_step)
            )
            transfer.narrow_reads([step], self.transfer_dtype)
            return step
        if self.step_in_run > 0:  # a later step of the run: its gradients join the first step's queue
            with tf.device(self.compute_devices[0]), tf.name_scope("gradient_queue"):
                flat = _flat(grads_and_vars)[1]
                return self.when_data(lambda: self.made.enqueue_and_count(flat))
        worker = self.compute_devices[0]
        queue, step, per_grad = self._queued(grads_and_vars)
        to_push = []
        for (grad, var), (values, *indices) in zip(
            grads_and_vars, self._in_waves(per_grad, grads_and_vars), strict=True
        ):
            if sparse.is_sparse(grad):
                # The shape from the variable: grad.dense_shape may depend on this step's ops.
                to_push.append((tf.IndexedSlices(values, indices[0], sparse.shape_of(var)), var))
            else:
                to_push.append((values, var))
        graph = v1.get_default_graph()
        before = len(graph.get_operations())
        push = optimizer.apply_gradients(to_push, global_step=global_step)
        updates = _updates_by_variable(graph.get_operations()[before:])
        made, build = self.made, self.building
        queued, applied = made.counts
        with tf.device(worker), tf.name_scope("pull"):
            pulls = self._pulls(updates, push)
            # Hooks fetch this mirror as the global step: a step must not read the variable on
            # its PS, where that small read waits behind the pull in flight (one TCP stream).
            mirror = _local_variable(global_step.read_value, "global_step")
            with tf.control_dependencies([push]):
                after = global_step.read_value()
                pulls.append(mirror.assign(after, read_value=False))
        with tf.device(worker), tf.name_scope("stop_step"):
            # The global step less this replica's rounds pushed so far, this one included: plus
            # `queued`, the step once its queue is applied, written in one assign. The loop stops
            # by it, so that its own gradients in flight take it no further than the last step.
            before_queue = _local_variable(global_step.read_value, "global_step_before_queue")
            pulls.append(before_queue.assign(after - applied.read_value() - 1, read_value=False))
            build.stop_step_read = before_queue.read_value() + queued.read_value()
        with tf.device(worker), tf.control_dependencies(pulls):
            made.transfer_op = applied.assign_add(1, read_value=False)
        build.global_step_read = mirror.read_value()
        with tf.device(worker):
            build.global_step_refresh = mirror.assign(global_step.read_value(), read_value=False)
        tf_internals.set_global_step_read(graph, build.global_step_read)
        made.loop = _TransferLoop(
            queue,
            [made.transfer_op],
            close_op=queue.close(),
            cancel_op=queue.close(cancel_pending_enqueues=True),
            queue_closed_exception_types=(tf.errors.OutOfRangeError, tf.errors.CancelledError),
        )
        v1.train.add_queue_runner(made.loop)
        transfer.narrow_reads([step, made.transfer_op], self.transfer_dtype)
        return step

    def _queued(self, grads_and_vars):
        """Queue this step's gradients on the worker (the step ends there).

        Returns the queue, the op that enqueues and counts (the step's train
        op) and, per gradient, its tensors as the transfer loop dequeues them.
        Sets `made.counts` (gradients queued, gradients applied).
        """
        parts, flat = _flat(grads_and_vars)
        wire = [self.transfer_dtype if t.dtype.is_floating and self.transfer_dtype else t.dtype for t in flat]
        with tf.device(self.compute_devices[0]), tf.name_scope("gradient_queue"):
            queue = v1.FIFOQueue(1, wire, name="gradients")
            queued = _local_variable(lambda: tf.constant(0, tf.int64), "queued")
            applied = _local_variable(lambda: tf.constant(0, tf.int64), "applied")

            def enqueue_and_count(flat=flat):
                enqueue = queue.enqueue([tf.cast(t, w) for t, w in zip(flat, wire, strict=True)])
                with tf.control_dependencies([enqueue]):
                    return queued.assign_add(1, read_value=False)

            step = self.when_data(enqueue_and_count)  # a step with no data queues nothing
            self.made.enqueue_and_count = enqueue_and_count
            received = queue.dequeue()
            received = list(received) if isinstance(received, list | tuple) else [received]
        for tensor, sent in zip(received, flat, strict=True):
            tensor.set_shape(sent.shape)
        per_grad = []
        for p in parts:
            per_grad.append(received[: len(p)])
            received = received[len(p) :]
        self.made.counts = (queued, applied)
        return queue, step, per_grad

    def _pulls(self, updates, push) -> list:
        """Each worker-side copy refreshed from its PS as soon as its own variable's update is done.

        While the rest are still arriving or being applied, so the two
        directions of the link overlap.
        """
        pulls = []
        for copy, var in self.made.copies:
            with tf.control_dependencies(updates.get(var.handle.name) or [push]):
                fresh = var.read_value()  # sent in 16 bits with a transfer dtype (narrow_reads)
            pulls.append(copy.assign(fresh, read_value=False))
        return pulls

    def _in_waves(self, per_grad, grads_and_vars) -> list[list[tf.Tensor]]:
        """Each gradient's queued tensors moved to its variable's PS, in waves of about piece_bytes.

        In order (see `waves`), each piece is applied and pulled back while the
        next ones are still being pushed. Without piece_bytes, all at once.
        """
        worker = self.compute_devices[0]
        order = waves.Waves(self.piece_bytes)
        moved = []
        for tensors, (_, var) in zip(per_grad, grads_and_vars, strict=True):
            gate = order.gate(sum(waves.static_bytes(t) for t in tensors))
            with tf.device(worker), tf.control_dependencies(gate):
                leaving = [tf.identity(t) for t in tensors] if gate else tensors
            with tf.device(var.device):
                here = [tf.identity(t) for t in leaving]
                moved.append([tf.cast(here[0], var.dtype.base_dtype), *here[1:]])
            order.arrived([t.op for t in here])
        return moved

    def hooks(self, last_step: int | None = None, notice: preemption.Notice | None = None) -> list:
        made = self.made
        if made.counts is None:
            return []
        cluster = self.cluster
        return [
            _DrainHook(
                *made.counts,
                loop=made.loop,
                task=cluster.task_name,
                chief=cluster.is_chief,
                notice=preemption.given(notice),
            )
        ]

    def traced_loops(self) -> list:
        return [self.made.loop] if self.made.loop is not None else []


class _TransferLoop(tf_internals.RoundsQueueRunner):
    """The transfer loop's queue runner, which can trace some of its rounds on request.

    `trace(n)` asks for the next n rounds to run with a full trace;
    `stop_tracing()` cancels what has not started; `take_traces()` returns
    the StepStats of the rounds traced since the last call. The loop itself
    is QueueRunner's (see `tf_internals.RoundsQueueRunner`).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._trace_lock = threading.Lock()
        self._to_trace = 0
        self._in_flight = 0  # traced rounds running now
        self._traces: list = []

    def trace(self, rounds: int) -> None:
        with self._trace_lock:
            self._to_trace += rounds

    def stop_tracing(self) -> bool:
        """Start no more traced rounds; True while a traced round is still running."""
        with self._trace_lock:
            self._to_trace = 0
            return self._in_flight > 0

    def take_traces(self) -> list:
        with self._trace_lock:
            traces, self._traces = self._traces, []
        return traces

    def _round(self, plain):
        with self._trace_lock:
            tracing = self._to_trace > 0
            self._to_trace -= tracing
            self._in_flight += tracing
        if not tracing:
            plain()
            return
        metadata = v1.RunMetadata()
        try:
            plain(options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE), run_metadata=metadata)
        finally:
            with self._trace_lock:
                self._in_flight -= 1
                self._traces.append(metadata.step_stats)


def _flat(grads_and_vars) -> tuple[list[tuple], list[tf.Tensor]]:
    """Each gradient's tensors as queued, and all of them in order.

    A sparse gradient travels as its (values, indices); its row count changes every step.
    """
    parts = [(g.values, g.indices) if sparse.is_sparse(g) else (g,) for g, _ in grads_and_vars]
    return parts, [t for p in parts for t in p]


def _updates_by_variable(ops) -> dict[str, list[tf.Operation]]:
    """The ops among `ops` that write a resource variable, by the variable's handle tensor name."""
    writes = ("ResourceApply", "ResourceSparseApply", "AssignVariableOp", "AssignSubVariableOp")
    updates: dict[str, list[tf.Operation]] = {}
    for op in ops:
        if op.type.startswith(writes):
            updates.setdefault(op.inputs[0].name, []).append(op)
    return updates


def _local_variable(initial_value, name: str) -> tf.Variable:
    """A variable of this task alone: initialised by every session, never checkpointed."""
    return v1.Variable(
        initial_value=initial_value, trainable=False, collections=[v1.GraphKeys.LOCAL_VARIABLES], name=name
    )


class _DrainHook(v1.train.SessionRunHook):
    """At the end of training, wait until the transfer loop has applied every queued gradient.

    Not for a loop that has stopped: it stops the session's coordinator when
    it fails (its PS gone, say), and what it left queued will never be applied.
    A loop that stopped because its PS left (training is over: the PS
    lingered less long than this drain took) also leaves the session
    unclosable: the round in flight had its part on the PS, and unless gRPC
    fails fast (GRPC_FAIL_FAST=true) its call waits for a PS that, gone
    because training ended, never comes back (decision 0016). Then a replica
    other than the chief says so in one line and, if its close has not
    returned `close_grace_secs` later, exits with 0. Not the chief (every
    PS waits for its report, so a PS it lost was lost to a fault, and its
    final checkpoint is still to be written), nor a preempted replica
    (which exits 150, to be restarted).
    """

    def __init__(
        self,
        queued,
        applied,
        loop=None,
        task="",
        chief=True,
        timeout_secs=Deadlines.DRAIN_SECS,
        close_grace_secs=Deadlines.DRAIN_CLOSE_GRACE_SECS,
        *,
        notice: preemption.Notice,
    ):
        self._counts = (queued.read_value(), applied.read_value())
        self._loop, self._task, self._chief, self._notice = loop, task, chief, notice
        self._timeout_secs, self._close_grace_secs = timeout_secs, close_grace_secs
        self._coord = None

    def after_create_session(self, session, coord):
        self._coord = coord

    def end(self, session):
        deadline = time.monotonic() + self._timeout_secs
        while True:
            queued, applied = session.run(self._counts)
            if applied >= queued:
                return
            left = queued - applied
            if self._coord is not None and self._coord.should_stop():
                error = getattr(self._loop, "error", None)
                lost_ps = isinstance(error, tf.errors.UnavailableError | tf.errors.AbortedError)
                # A session ends without an error at the last step or on a preemption (which exits 150).
                if self._chief or not lost_ps or self._notice.requested():
                    log.warning("%d queued gradient(s) not applied: the transfer loop stopped", left)
                    return
                first = tf_errors.first_error_line([str(error.message)])
                log.info(
                    f"{self._task}: a PS left while the last gradients were applied ({left} not "
                    f"applied: {first}); training is over: exiting"
                )
                exit_if_still_running = threading.Timer(self._close_grace_secs, _exit_training_over)
                exit_if_still_running.daemon = True
                exit_if_still_running.start()
                return
            if time.monotonic() > deadline:
                log.warning("%d queued gradient(s) not applied after %.0f s", left, self._timeout_secs)
                return
            time.sleep(0.02)


def _exit_training_over() -> None:
    """End this process with 0: training is over, and only a close that cannot return is left."""
    logging.shutdown()
    os._exit(0)
