"""The training loop: build the graph, run a monitored session, checkpoint, stop.

`build` makes one replica's training graph under its strategy from a loss
function; `monitored_session` runs it to the last step with checkpoints,
throughput, the NaN guard and bounded recovery. Neither starts servers or
reads flags (see `disttrain.launch`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence

import tensorflow as tf

from disttrain.base import preemption, tf_errors, tf_internals
from disttrain.base.cluster import Cluster
from disttrain.base.config import RunSettings
from disttrain.base.deadlines import Deadlines
from disttrain.base.errors import EXIT_TRANSIENT, ConfigError, DivergedError, StalledError, TransientError
from disttrain.graph import input_context, input_feeds, placement, run_steps
from disttrain.graph.clipping import Clip
from disttrain.runtime import breakdown, metrics, peers, ps_serving, recovery
from disttrain.runtime import watchdog as watchdogs
from disttrain.strategies import waves
from disttrain.strategies.base import NON_FINITE, Strategy, scalar_loss
from disttrain.strategies.building import Step

v1 = tf.compat.v1
log = logging.getLogger("disttrain")


@dataclasses.dataclass
class Built:
    """One replica's training graph and the tensors the loop needs."""

    graph: tf.Graph
    strategy: Strategy
    step: Step  # what the strategy built: the reads and feeds the loop needs

    @property
    def train_op(self) -> tf.Operation:
        return self.step.train_op

    @property
    def loss(self) -> tf.Tensor:
        return self.step.loss

    @property
    def global_step(self) -> tf.Tensor:
        """What a step fetches as the global step (a worker-side read where the strategy has one)."""
        return self.step.global_step_fetch


def build(
    strategy: Strategy,
    loss_fn: Callable[..., tf.Tensor],
    optimizer_fn: Callable,
    check_numerics: bool,
    batch_size: int | None = None,
    clip: Clip | None = None,
    accumulate_steps: int | None = 1,
    steps_per_run: int | None = 1,
) -> Built:
    """Build this replica's training graph in the current default graph: towers, gradients, update.

    `loss_fn()` (or `loss_fn(input_context)`) builds one replica's loss,
    input included (called once per tower, micro-batch and step of a run,
    and once more in a scratch graph to plan placement when it can be).
    With `check_numerics` a NaN or Inf loss or gradient fails the step.
    `batch_size`: examples per tower and micro-batch, for the input context.
    `accumulate_steps`, `steps_per_run`: as `Strategy.minimize`.
    """

    def checked(loss):
        loss = scalar_loss(loss)
        return tf.debugging.check_numerics(loss, f"{NON_FINITE} loss") if check_numerics else loss

    if not callable(optimizer_fn):
        raise ConfigError(
            "optimizer_fn must be a function that builds the optimizer, such as lambda: "
            f"tf.compat.v1.train.AdamOptimizer(1e-3); got an object of type {type(optimizer_fn).__name__}"
        )
    if input_context.takes_context(loss_fn):
        checked_loss = lambda context: checked(loss_fn(context))
    else:
        checked_loss = lambda: checked(loss_fn())
    with strategy.scope():
        global_step = v1.train.get_or_create_global_step()
        step = strategy.build_step(
            optimizer_fn(),
            checked_loss,
            global_step,
            check_numerics,
            batch_size,
            clip=clip,
            accumulate_steps=accumulate_steps,
            steps_per_run=steps_per_run,
        )
    return Built(v1.get_default_graph(), strategy, step)


def without_autotune_thread(dataset: tf.data.Dataset) -> tf.data.Dataset:
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
    moment before the chief sits idle for half a minute. Every
    `say_every_secs` of waiting it says since when and until when.
    """

    def __init__(self, scaffold, master, config, max_wait_secs, say_every_secs=10.0, watchdog=None):
        self._scaffold, self._master, self._config, self._max_wait = scaffold, master, config, max_wait_secs
        self._say_every, self._watchdog = say_every_secs, watchdog

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
        start, since = time.monotonic(), time.strftime("%H:%M:%S")
        deadline = start + self._max_wait
        while True:  # in rounds, to say whom it waits for while it waits
            left = deadline - time.monotonic()
            round_secs = max(Deadlines.LEAST_ROUND_SECS, min(self._say_every, left))
            try:
                # A round's polls each return at once, unless a peer froze mid-call (its port still
                # open): then the round is judged hung, as a step would be.
                with self._bounded(
                    f"waiting for the chief's variables (rounds of {round_secs:.0f} s)", round_secs
                ):
                    return manager.wait_for_session(
                        self._master, config=self._config, max_wait_secs=round_secs
                    )
            except tf.errors.DeadlineExceededError:
                left = deadline - time.monotonic()
                if left > 0:
                    log.info(
                        f"waiting for the chief to initialise the variables{self._example()}: "
                        f"since {since} ({time.monotonic() - start:.0f} s), giving up in {left:.0f} s"
                    )
                    continue
            raise TransientError(
                f"the chief did not initialise the variables within {self._max_wait:.0f} s "
                "(is the chief running? raise TrainConfig.peer_wait_secs if it is slow to start)"
            ) from None

    def _bounded(self, what: str, round_secs: float):
        if self._watchdog is None:
            return contextlib.nullcontext()
        return self._watchdog.bounded(what, round_secs + self._max_wait)

    def _example(self) -> str:
        """' (e.g. NAME, 3 in all)': what is not initialised yet, or '' if that cannot be read now."""
        try:
            with v1.Session(self._master, config=self._config) as session:
                options = v1.RunOptions(timeout_in_ms=int(Deadlines.READY_READ_SECS * 1000))
                names = session.run(self._scaffold.ready_op, options=options)
        except tf.errors.OpError:
            return ""
        if not len(names):
            return " (all are now: preparing this task's own)"
        return f" (e.g. {names[0].decode()}, {len(names)} in all)"


class _StopAtStep(v1.train.StopAtStepHook):
    """TF's StopAtStepHook, which also stops before the first step if the global step is already there.

    TF's checks only after each step, so a run restarted on a finished run's
    log directory trained one step past the end and measured its throughput
    from that one step. `reached` says whether it stopped training. With
    several steps per run it feeds the last step to `stop_at` (the
    strategy's placeholder, or None), so that no step of a run goes past it.
    It compares `step_read` (the strategy's `stop_step_read`) when given,
    else the global step.
    """

    def __init__(self, last_step: int, stop_at: tf.Tensor | None = None, step_read: tf.Tensor | None = None):
        super().__init__(last_step=last_step)
        self.reached = False
        self._feed = {stop_at: last_step} if stop_at is not None else None
        self._step_read = step_read

    def begin(self):
        super().begin()
        if self._step_read is not None:
            self._global_step_tensor = self._step_read

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self._global_step_tensor, feed_dict=self._feed)

    def after_run(self, run_context, run_values):  # TF's, noting that it stopped training
        # The step fetched may have been read before any of the run's steps.
        if run_values.results + run_steps.steps_in(run_context) >= self._last_step:
            if run_context.session.run(self._global_step_tensor) >= self._last_step:
                self.reached = True
                run_context.request_stop()

    def after_create_session(self, session, coord):
        super().after_create_session(session, coord)
        step = int(session.run(self._global_step_tensor))
        if step >= self._last_step:
            self.reached = True
            log.info(
                f"global step {step} is already at the last step ({self._last_step}): nothing to train "
                "(the log directory holds a finished run: raise the step count or give a new log directory)"
            )
            coord.request_stop()


class _StallGuard(v1.train.SessionRunHook):
    """Stops the replica when `window` of its own steps leave the global step where it was.

    Every strategy's step moves the global step: the replica's own update
    (async), or the synchronous update it waited for (sync PS, all-reduce).
    A step that runs and moves nothing applied no update (a train op whose
    update never ran, as a graph cycle once made it: decision 0027, issue 20),
    and training on would report speed for a run that trains nothing.
    """

    def __init__(self, strategy_name: str, global_step: tf.Tensor, window: int):
        self._name, self._global_step, self._window = strategy_name, global_step, window

    def after_create_session(self, session, coord):
        self._since, self._steps = None, 0  # a new session (recovery) starts a new window

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        step = int(run_values.results)
        if step != self._since:
            self._since, self._steps = step, 0
            return
        self._steps += run_steps.steps_in(run_context)
        if self._steps >= self._window:
            raise StalledError(
                f"{self._name}: the global step has not moved in {self._steps} of this replica's steps "
                f"(still {step}): its train op applies no update; stopping "
                "(RunSettings.stall_steps sets the window)"
            )


class _InputEnded(v1.train.SessionRunHook):
    """Stops the replica after a step that had no data where its strategy's update needs some.

    That step changed nothing (`Strategy.when_data`): under async PS every
    pipeline of this replica has ended; under all-reduce, every pipeline of
    the group (all replicas stop after the same step). Sync PS ends it from
    its aggregator instead.
    """

    def __init__(self, task: str, no_data: tf.Tensor, synchronous: bool, global_step: tf.Tensor):
        self._task, self._global_step = task, global_step
        self._fetch = {"no_data": no_data}
        self._whose = "the group's" if synchronous else "this replica's"

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self._fetch)

    def after_run(self, run_context, run_values):
        if run_values.results["no_data"]:
            # The step fetched with the run may be read before its steps: read it again.
            step = run_context.session.run(self._global_step)
            log.info(
                f"{self._task}: every one of {self._whose} input pipelines has ended (at global step "
                f"{step}): training is over"
            )
            run_context.request_stop()


class StepWatch(v1.train.SessionRunHook):
    """Tells the watchdog what the loop waits in: a step, or what runs between steps.

    A step waits without a timeout on whatever it reads (a peer, its input,
    a queue). A step is judged once it has run `factor` times the longest of
    the last steps, and at least `min_secs`; the first step of each session
    (start-up, graph optimisation, a recovery: where the sync PS chaos soak
    once hung for good, unseen) after `first_secs`. The hooks after a step
    (checkpoints, summaries: runs on the PS tasks, which hang on a frozen
    PS as a step does) are judged from this hook's `after_run` to the
    `Done` hook's, which runs last: after `Deadlines.hooks_after(first_secs)`,
    or `factor` times the longest they took. Between steps (a loop of the
    user's own) only a lost peer ends the task. The values come from
    `Deadlines` (`step_min_secs`, `STEP_FACTOR`, `first_step_secs`).
    """

    def __init__(self, watchdog: watchdogs.Watchdog, min_secs: float, factor: float, first_secs: float):
        self._watchdog, self._min, self._factor, self._first = watchdog, min_secs, factor, first_secs
        self._recent: collections.deque[float] = collections.deque(maxlen=100)
        self._hooks_longest = 0.0  # the longest the hooks after a step took
        self._started = 0.0
        self._steps = self._run_steps = 0

    def after_create_session(self, session, coord):
        self._recent.clear()

    def before_run(self, run_context):
        self._started = time.monotonic()
        self._run_steps = run_steps.steps_in(run_context)
        first, last = self._steps + 1, self._steps + self._run_steps
        what = (
            f"step {first} of this task" if first == last else f"steps {first}-{last} of this task (one run)"
        )
        if self._recent:
            longest = max(self._recent)
            threshold = max(self._min, self._factor * longest)
            self._watchdog.enter(
                f"{what} (the longest of its last {len(self._recent)} took {longest:.1f} s)",
                threshold,
                may_hang=True,
            )
        else:
            self._watchdog.enter(f"{what} (the first of its session)", self._first, may_hang=True)

    def after_run(self, run_context, run_values):
        self._recent.append(time.monotonic() - self._started)
        self._steps += self._run_steps
        self._started = time.monotonic()
        threshold = max(Deadlines.hooks_after(self._first), self._factor * self._hooks_longest)
        self._watchdog.enter(
            f"the hooks after step {self._steps} (checkpoints, summaries)", threshold, may_hang=True
        )

    def hooks_done(self) -> None:
        self._hooks_longest = max(self._hooks_longest, time.monotonic() - self._started)
        longest = max(self._recent)
        self._watchdog.enter(f"after step {self._steps}", max(self._min, self._factor * longest))

    def end(self, session):
        self._watchdog.leave()

    class Done(v1.train.SessionRunHook):
        """The last hook: the hooks after a step have returned."""

        def __init__(self, watch: StepWatch):
            self._watch = watch

        def after_run(self, run_context, run_values):
            self._watch.hooks_done()


def _finish_together(
    cluster: Cluster,
    strategy: Strategy,
    built: Step,
    settings: RunSettings,
    global_step,
    saver,
    logdir: str,
    notice: preemption.Notice,
) -> list:
    """Under an asynchronous PS strategy, a chief that finishes first waits for the others' updates.

    Each replica's training ends on its own (its input, or the last step as
    it sees it), and the chief's final checkpoint is the run's model: one
    whose data ended first used to write it while the others still trained
    (their updates, up to most of the run's, in no checkpoint). Sync
    strategies end together. The hooks go after the strategy's (the
    overlap's drain) and before the checkpoint saver.
    """
    if strategy.synchronous or not strategy.uses_ps or cluster.is_local or cluster.num_replicas < 2:
        return []
    finished = ps_serving.PsQueues(cluster.num_replicas).finished()
    if not cluster.is_chief:
        return [_ReportFinished(finished.enqueue(cluster.replica_index), notice)]
    saving = None
    if settings.save_checkpoint_steps or settings.save_checkpoint_secs:  # as the checkpoint saver hook
        timer = v1.train.SecondOrStepTimer(
            every_secs=None if settings.save_checkpoint_steps else settings.save_checkpoint_secs,
            every_steps=settings.save_checkpoint_steps,
        )

        def save(session, step):
            saver.save(session, os.path.join(logdir, "model.ckpt"), global_step=step)

        saving = (save, timer)

    return [
        _AwaitReplicas(
            cluster.task_name,
            finished.size(),
            cluster.num_replicas - 1,
            global_step,
            Deadlines.of(settings).replicas_idle_secs,
            notice,
            built.global_step_refresh,
            saving,
        )
    ]


class _ReportFinished(v1.train.SessionRunHook):
    """At the end of a replica's training (not a preemption's), tells the chief it has finished."""

    def __init__(self, enqueue: tf.Operation, notice: preemption.Notice):
        self._enqueue, self._notice = enqueue, notice

    def end(self, session):
        if self._notice.requested():
            return  # it comes back
        with contextlib.suppress(tf.errors.OpError):  # PS 0 gone: the chief has checkpointed
            session.run(
                self._enqueue, options=v1.RunOptions(timeout_in_ms=int(Deadlines.TELL_PS_SECS * 1000))
            )


class _AwaitReplicas(v1.train.SessionRunHook):
    """At the end of the chief's training, waits until the other replicas have finished theirs.

    Bounded: it stops waiting once the global step has not moved for
    `idle_secs` (a replica that died and was not restarted trains no more).
    `notice` (this task's preemption) ends it at once. While it waits,
    `saving` = (save, timer): `save(session, step)` writes a checkpoint as
    often as training would (`timer`, on the global step): the others may
    train for long. Then it runs `refresh` (the
    strategy's `global_step_refresh`): the final checkpoint is named by the
    step the hooks read, which a mirror of the global step would give as of
    the chief's own last update (and, at a step already saved, the saver
    would write nothing).
    """

    def __init__(
        self,
        task: str,
        finished: tf.Tensor,
        others: int,
        global_step: tf.Tensor,
        idle_secs: float,
        notice: preemption.Notice,
        refresh: tf.Operation | None = None,
        saving: tuple[Callable, v1.train.SecondOrStepTimer] | None = None,
    ):
        self._task, self._finished, self._others = task, finished, others
        self._global_step, self._idle_secs, self._refresh = global_step, idle_secs, refresh
        self._notice = notice
        self._save, self._timer = saving if saving is not None else (None, None)
        self.final_step: int | None = None  # the global step once the others have finished

    def end(self, session):
        if not self._notice.requested():
            self._await(session)
        if self._refresh is not None:
            session.run(self._refresh)
        self.final_step = int(session.run(self._global_step))

    def _await(self, session):
        finished, step = session.run([self._finished, self._global_step])
        if finished >= self._others:
            return
        log.info(
            f"{self._task}: its training has ended at global step {step}; waiting for the other replicas' "
            f"({finished} of {self._others} finished) before the final checkpoint"
        )
        moved = time.monotonic()
        if self._timer is not None:
            self._timer.update_last_triggered_step(step)
        while finished < self._others and not self._notice.requested():
            if time.monotonic() - moved > self._idle_secs:
                log.warning(
                    f"{self._task}: {self._others - finished} replica(s) have not finished and the global "
                    f"step has stayed at {step} for {self._idle_secs:.0f} s (peer_wait_secs): writing "
                    "the final checkpoint without them"
                )
                return
            time.sleep(0.2)
            finished, now = session.run([self._finished, self._global_step])
            if now != step:
                step, moved = now, time.monotonic()
            if self._save is not None and self._timer.should_trigger_for_step(step):
                self._timer.update_last_triggered_step(step)
                self._save(session, step)
        if finished >= self._others:
            log.info(f"{self._task}: every replica has finished, at global step {step}")


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

    def __init__(self, inner, on_reconnect, lost_peer_log: _LostPeerLog, watchdog=None, recovering_secs=None):
        self._inner, self._on_reconnect, self._created = inner, on_reconnect, 0
        self._log, self._watchdog, self._recovering = lost_peer_log, watchdog, recovering_secs

    def create_session(self):
        texts = self._log.take()
        if self._created and self._watchdog is not None:
            self._watchdog.enter("recovering the session", self._recovering)
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


def checkpoint_mismatch(checkpoint: str, variables) -> str | None:
    """What first stops `variables` from being restored from `checkpoint`, as words; None if nothing.

    Split variables are compared whole (key and shape), as the Saver reads
    them: TF re-slices a checkpoint written on any number of PS for any
    other and for one process. E.g. "has no variable 'fc1/weights'".
    """
    saved = tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map()
    for name, shape in sorted(tf_internals.checkpoint_keys(variables).items()):
        if name not in saved:
            return f"has no variable {name!r}"
        if list(saved[name]) != shape:
            return f"holds {list(saved[name])}, not {shape}, for {name!r}"
    return None


def check_restorable(checkpoint: str | None, variables) -> None:
    """Refuse, in one line before any session, a checkpoint this graph cannot restore.

    A variable the checkpoint lacks, or holds in another shape, would
    otherwise fail the restore on the PS tasks with pages of traceback.
    """
    if checkpoint is None:
        return
    problem = checkpoint_mismatch(checkpoint, variables)
    if problem is not None:
        raise ConfigError(
            f"the checkpoint {checkpoint} {problem} of this model: it was written by another "
            "model or optimizer; give a new --logdir (or logdir=), or train what wrote it"
        )


def check_replica_memory(graph: tf.Graph, task: str, cap: int | None) -> None:
    """Refuse, in one line before any session, a model whose variables on this replica exceed `cap` bytes.

    Counts every variable not on a PS task (optimizer slots, worker-side
    copies and mirrors included), and names the largest embedding table
    among them, since a table is what outgrows a worker.
    """
    if cap is None:
        return
    held = [
        spec
        for spec in placement.variable_specs(graph)
        if tf.DeviceSpec.from_string(graph.get_operation_by_name(spec.name).device).job != "ps"
    ]
    total = sum(spec.nbytes for spec in held)
    if total <= cap:
        return
    tables: dict[str, int] = collections.defaultdict(int)
    for spec in held:
        if spec.table:
            tables[spec.name.rsplit("/part_", 1)[0]] += spec.nbytes
    if tables:
        name = max(tables, key=tables.get)
        largest = f"its largest table, {name}, is {_bytes(tables[name])}"
    else:
        largest = f"its largest variable, {max(held, key=lambda s: s.nbytes).name}, holds the most"
    raise ConfigError(
        f"{task} would hold {_bytes(total)} of variables, over replica_memory_bytes={cap} ({_bytes(cap)}): "
        f"{largest}; SyncHybrid keeps embedding tables on the PS tasks, cut by rows, and only the rest on "
        "each replica"
    )


def _bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


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


@contextlib.contextmanager
def monitored_session(
    cluster: Cluster,
    strategy: Strategy,
    logdir: str,
    steps: int,
    *,
    settings: RunSettings,
    batch_size: int,
    target: str = "",
    session_config: v1.ConfigProto | None = None,
    hooks: Sequence[v1.train.SessionRunHook] = (),
    on_reconnect: Callable[[list[str]], None] | None = None,
    notice: preemption.Notice,
):
    """A MonitoredSession that trains this replica until the global step reaches `steps`.

    Call after the graph is built (`strategy.minimize`), with that graph as
    the default. The chief restores the latest readable checkpoint in
    `logdir`, saves periodically and at the end, and writes the cluster's
    scalars; every replica writes its own throughput (`batch_size` examples
    per tower and step) and its result.json. The session's `result`
    holds what this task measured once the block has ended. A NaN or Inf
    becomes DivergedError. `notice`: this task's preemption notice, which
    stops the loop at a step boundary.
    """
    built = _built_step(strategy)
    watchdog = replica_watchdog(cluster, strategy, settings, logdir, steps)
    hooked = _session_hooks(
        cluster, strategy, built, logdir, settings, batch_size, steps, hooks, watchdog, notice
    )
    creator = _session_creator(
        cluster, hooked.scaffold, target, session_config, settings, logdir, hooked.live, watchdog
    )
    deadlines = Deadlines.of(settings)
    watchdog.start().enter("creating the session", deadlines.creating_session_secs)
    ending = _ending_errors(cluster, hooked.stop_at, hooked.throughput, notice)
    with _lost_peer_logging() as lost_peer_log, ending:
        creator = _Reconnecting(
            creator, on_reconnect, lost_peer_log, watchdog, deadlines.recovering_session_secs
        )
        with v1.train.MonitoredSession(
            session_creator=creator, hooks=hooked.hooks, stop_grace_period_secs=Deadlines.STOP_THREADS_SECS
        ) as session:
            try:
                yield session
            except BaseException:
                watchdog.enter("closing the session after an error", deadlines.closing_session_secs)
                raise
            _closing(watchdog, cluster, settings, notice)
    watchdog.stop()
    session.result = _reported(cluster, logdir, hooked)


def _built_step(strategy: Strategy) -> Step:
    """The record of the strategy's build, which the loop reads; a strategy that built nothing is refused."""
    if strategy.built is None:
        raise ConfigError(
            f"{type(strategy).__name__} has built no step: call strategy.minimize(...) inside "
            "strategy.scope() before disttrain.session(strategy, ...)"
        )
    return strategy.built


# The session's hooks by phase, in the order MonitoredSession runs them (each of begin,
# after_create_session, before_run, after_run and end goes through the list in order).
HOOK_PHASES = (
    "inputs",  # the fed inputs start first: a strategy's hook may run steps when its session starts
    "strategy",  # their end() (an async drain of queued gradients) runs before the final step is read
    "stop",  # the last step, as this replica sees it
    "throughput",  # reads the final global step in its end()
    "user",  # the hooks fit() or session() was given
    "watch",  # the input position, the stall guard, the watchdog's step phases, step traces
    "finish_together",  # async PS: a chief that finishes first waits for the others' updates
    "preemption",  # a PS's or this task's notice stops the loop at a step boundary
    "checkpoints",  # the chief's saver: its end() is the final checkpoint, after the phases above
    "step_done",  # last: every hook after a step (the saver's included) has returned
)


@dataclasses.dataclass(frozen=True)
class _Hooked:
    """A replica session's hooks by phase, and the parts of them the session itself needs."""

    phases: dict[str, list]
    scaffold: v1.train.Scaffold
    live: bool  # a restarted chief adopts the variables live PS tasks still hold

    @property
    def throughput(self) -> metrics.ThroughputHook:
        (hook,) = self.phases["throughput"]
        return hook

    @property
    def stop_at(self) -> _StopAtStep:
        (hook,) = self.phases["stop"]
        return hook

    @property
    def hooks(self) -> list:
        if tuple(self.phases) != HOOK_PHASES:
            raise RuntimeError(f"hook phases out of order: {tuple(self.phases)}, not {HOOK_PHASES}")
        return [hook for phase in self.phases.values() for hook in phase]


def _session_hooks(
    cluster: Cluster,
    strategy: Strategy,
    built: Step,
    logdir: str,
    settings: RunSettings,
    batch_size: int,
    steps: int,
    hooks: Sequence[v1.train.SessionRunHook],
    watchdog: watchdogs.Watchdog,
    notice: preemption.Notice,
) -> _Hooked:
    """Every hook of a replica's session, in HOOK_PHASES' order.

    Made in the order the session used to make them: the saver is made after
    the strategy's and the watching hooks, so it saves what they create too.
    """
    global_step = built.global_step_fetch
    throughput = _throughput_hook(cluster, strategy, built, logdir, settings, batch_size, global_step)
    stop_at = _StopAtStep(last_step=steps, stop_at=built.stop_at, step_read=built.stop_step_read)
    phases = {
        "inputs": [input_feeds.StartInputsHook()],
        "strategy": _strategy_hooks(strategy, steps, notice),
        "stop": [stop_at],
        "throughput": [throughput],
        "user": list(hooks),
        "watch": _watch_hooks(cluster, strategy, built, logdir, settings, global_step, watchdog),
    }
    saver = v1.train.Saver(max_to_keep=settings.keep_checkpoints, sharded=True)
    scaffold = strategy.scaffold(saver)
    notices = []
    if strategy.uses_ps and cluster.num_ps and not cluster.is_local:
        queues = ps_serving.PsQueues(cluster.num_replicas)
        notices = [(f"/job:ps/task:{i}", queues.preempted(i).size()) for i in range(cluster.num_ps)]
    phases["finish_together"] = _finish_together(
        cluster, strategy, built, settings, v1.train.get_global_step(), saver, logdir, notice
    )
    phases["preemption"] = [
        recovery.PreemptionHook(
            v1.train.get_global_step(),
            notices,
            cluster.is_chief,
            notice,
            stop_on_request=not strategy.votes_on_preemption,
        )
    ]
    phases["checkpoints"] = _checkpoint_saver(cluster, settings, logdir, scaffold)
    phases["step_done"] = [StepWatch.Done(next(h for h in phases["watch"] if isinstance(h, StepWatch)))]
    live = bool(notices) and strategy.adopts_live_ps_state
    return _Hooked(phases, scaffold, live)


def _checkpoint_saver(cluster: Cluster, settings: RunSettings, logdir: str, scaffold) -> list:
    """The chief's checkpoint saver, when the settings save checkpoints (none elsewhere)."""
    if not (cluster.is_chief and (settings.save_checkpoint_steps or settings.save_checkpoint_secs)):
        return []
    return [
        v1.train.CheckpointSaverHook(
            logdir,
            save_secs=None if settings.save_checkpoint_steps else settings.save_checkpoint_secs,
            save_steps=settings.save_checkpoint_steps,
            scaffold=scaffold,
        )
    ]


def _reported(cluster: Cluster, logdir: str, hooked: _Hooked) -> metrics.TaskThroughput:
    """What this task measured, written to its result.json and logged in one line."""
    result = hooked.throughput.result
    # The chief's own training ended before the others' updates (async): the run's last step is theirs.
    for hook in hooked.phases["finish_together"]:
        if isinstance(hook, _AwaitReplicas) and hook.final_step is not None:
            result.global_step = max(result.global_step, hook.final_step)
    timed = [hook for hook in hooked.phases["watch"] if isinstance(hook, breakdown.BreakdownHook)]
    where = timed[0].breakdown() if timed else None  # None: never traced (or breakdown_budget=0)
    if where is not None:
        result.breakdown = dataclasses.asdict(where)
    write_result(logdir, cluster.task_type, cluster.task_index, result)
    log.info(
        f"{cluster.task_name} finished: {result.local_steps} local steps "
        f"to global step {result.global_step}, "
        f"loss {result.final_loss:.4f}, {result.examples_per_sec:.1f} examples/sec (this task)"
    )
    if where is not None:
        log.info(f"{cluster.task_name} {where.summary()}")
    if where is not None and cluster.is_chief:
        name, loads = f"{cluster.task_type}_{cluster.task_index}", read_run(logdir).get("ps_loads") or []
        more = "the changes that would remove it, ranked" if breakdown.causes(where, name, loads) else "more"
        log.info(f"verdict: {breakdown.verdict(where, name, loads)} ({more}: disttrain-diagnose {logdir})")
    return result


def _closing(
    watchdog: watchdogs.Watchdog, cluster: Cluster, settings: RunSettings, notice: preemption.Notice
) -> None:
    """The watchdog's phase while the session closes after its loop ended without an error.

    A replica's close (hooks' ends, the overlap drain) that does not return
    ends it: with 0 when training ended, 150 when it was preempted. The
    chief's is not judged as hung: it writes the final checkpoint, which may
    take long for a large model; only a lost peer ends it.
    """
    code = EXIT_TRANSIENT if notice.requested() else 0
    threshold = Deadlines.of(settings).closing_session_secs
    watchdog.enter("closing the session", threshold, may_hang=not cluster.is_chief, hung_code=code)


def _throughput_hook(
    cluster: Cluster,
    strategy: Strategy,
    built: Step,
    logdir: str,
    settings: RunSettings,
    batch_size,
    global_step,
):
    """This replica's throughput (and the cluster's, on the chief), `batch_size` examples per tower."""
    counting = metrics.ThroughputSettings(
        examples_per_local_step=batch_size * strategy.num_towers * built.accumulate_steps,
        examples_per_global_step=strategy.examples_per_step(batch_size),
        every_n=settings.log_every_steps,
        task_logdir=metrics.task_logdir(logdir, cluster.task_type, cluster.task_index),
        cluster_logdir=logdir if cluster.is_chief else None,
        decay_threshold=settings.decay_threshold,
        decay_window=settings.decay_window,
    )
    return metrics.ThroughputHook(
        task=cluster.task_name,
        loss=built.loss,
        global_step=global_step,
        settings=counting,
        data_weight=built.data_weight,
        steps_trained=built.steps_trained,
    )


@contextlib.contextmanager
def _lost_peer_logging():
    """For the block, TF's logger at INFO at least and filtered by a `_LostPeerLog`, which it yields."""
    tf_logger = tf.get_logger()
    lost_peer_log = _LostPeerLog(tf_logger.getEffectiveLevel())
    level = tf_logger.level
    tf_logger.addFilter(lost_peer_log)
    tf_logger.setLevel(min(tf_logger.getEffectiveLevel(), logging.INFO))
    try:
        yield lost_peer_log
    finally:
        tf_logger.removeFilter(lost_peer_log)
        tf_logger.setLevel(level)


@contextlib.contextmanager
def _ending_errors(
    cluster: Cluster, stop_at: _StopAtStep, throughput: metrics.ThroughputHook, notice: preemption.Notice
):
    """What a session's errors mean once it ends: a PS gone after the last step, or a NaN.

    A PS that left after the last step (training is over) ends the block
    quietly; a failed numerics check becomes DivergedError; anything else
    passes through.
    """
    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
        # Raised by the close, after the last step: a loop beside the step (the async overlap's
        # transfer loop, draining the last gradients) lost a PS that left because training is over.
        if not stop_at.reached or notice.requested():
            raise
        log.info(
            f"{cluster.task_name}: a PS left while the last gradients were applied "
            f"({tf_errors.first_error_line([str(e.message)])}); training is over: exiting"
        )
    except tf.errors.InvalidArgumentError as e:
        if NON_FINITE not in str(e.message):
            raise
        what = str(e.message).split(NON_FINITE, 1)[1].split(":")[0].strip()
        raise DivergedError(
            f"{what} became NaN or Inf after global step {throughput.result.global_step}: stopping; "
            "the last checkpoint holds no diverged value (lower the learning rate?)"
        ) from None


def replica_watchdog(cluster: Cluster, strategy: Strategy, settings: RunSettings, logdir: str, steps: int):
    """The watchdog of a replica: the peers it cannot go on without, and how it tells training is over.

    Those its device filters name; under a synchronous PS strategy also the
    chief, whose aggregator releases every step. A replica alone has none.
    """
    needed = peers.peers(cluster, strategy.device_filters()) if not cluster.is_local else []
    if strategy.synchronous and strategy.uses_ps and not cluster.is_chief and not cluster.is_local:
        chief = dict(peers.peers(cluster, []))
        job, index = cluster.replica_jobs[0]
        name = f"/job:{job}/task:{index}"
        if name in chief and name not in dict(needed):
            needed.append((name, chief[name]))

    def over() -> bool:
        step = recovery.checkpoint_step(v1.train.latest_checkpoint(logdir))
        if step is None:  # no checkpoints (both intervals None): the chief's result records the end
            step = chief_result_step(logdir, cluster)
        return (step or -1) >= steps

    return watchdogs.Watchdog(
        cluster.task_name, needed, Deadlines.of(settings).peer_secs, settings.wait_log_secs, over
    )


def _strategy_hooks(strategy: Strategy, steps: int, notice: preemption.Notice) -> list:
    """The strategy's hooks, handed this task's preemption notice (a subclass written for 0.1.0's
    `hooks(last_step)` takes none, and its hooks read the process's)."""
    if "notice" in inspect.signature(strategy.hooks).parameters:
        return strategy.hooks(last_step=steps, notice=notice)
    return strategy.hooks(last_step=steps)


def _watch_hooks(
    cluster: Cluster,
    strategy: Strategy,
    built: Step,
    logdir: str,
    settings: RunSettings,
    global_step,
    watchdog,
):
    """The hooks that watch a replica: its input position, the stall guard, step traces (as set)."""
    task_dir = metrics.task_logdir(logdir, cluster.task_type, cluster.task_index)
    hooks = [
        input_context.InputPositionHook(
            task_dir,
            strategy.input_context(),
            global_step,
            settings.save_checkpoint_steps,
            settings.save_checkpoint_secs,
            # One beside each kept checkpoint, so that a restore from any of them finds its position.
            keep=None if settings.keep_checkpoints is None else settings.keep_checkpoints + 1,
        )
    ]
    if built.no_data is not None:
        hooks.append(_InputEnded(cluster.task_name, built.no_data, strategy.synchronous, global_step))
    if settings.stall_window:
        hooks.append(_StallGuard(type(strategy).__name__, global_step, settings.stall_window))
    deadlines = Deadlines.of(settings)
    hooks.append(
        StepWatch(watchdog, deadlines.step_min_secs, Deadlines.STEP_FACTOR, deadlines.first_step_secs)
    )
    if settings.trace_steps:
        hooks.append(
            metrics.TraceHook(
                task_dir, settings.trace_steps, settings.log_every_steps, global_step, strategy.traced_loops()
            )
        )
    if settings.breakdown_budget:
        after = min(settings.log_every_steps, 20)  # past start-up
        budget = settings.breakdown_budget
        hooks.append(breakdown.BreakdownHook(cluster.task_name, after, budget, task_dir, global_step))
    return hooks


def _session_creator(
    cluster: Cluster, scaffold, target, session_config, settings: RunSettings, logdir, live, watchdog
):
    """The chief's creator (restores, or adopts `live` PS state) or a worker's (waits for the chief)."""
    if not cluster.is_chief:
        return _WorkerSessionCreator(
            scaffold,
            target,
            session_config,
            Deadlines.of(settings).chief_variables_secs,
            settings.wait_log_secs,
            watchdog,
        )
    check_restorable(usable_checkpoint(logdir), v1.global_variables())
    return recovery.ChiefSessionCreator(
        scaffold,
        target,
        session_config,
        logdir,
        v1.report_uninitialized_variables(v1.global_variables()) if live else None,
        v1.train.get_global_step(),
        adopt=live,
    )


def chief_result_step(logdir: str, cluster: Cluster, written_after: float = 0.0) -> int | None:
    """The global step in the chief's result.json (written as it finished), or None without one.

    `written_after`: a time (time.time()) before which the file is an earlier run's, and not counted.
    """
    job, index = cluster.replica_jobs[0] if cluster.replica_jobs else (cluster.task_type, cluster.task_index)
    path = os.path.join(metrics.task_logdir(logdir, job, index), "result.json")
    try:
        if os.path.getmtime(path) < written_after:
            return None
        with open(path) as f:
            return int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError):
        return None


def write_run(logdir: str, strategy: Strategy, built: Built, batch_size: int) -> str:
    """What ran, for the tools that read a run afterwards (disttrain-diagnose): <logdir>/run.json.

    The cluster's shape, the strategy and its knobs, the batch, the model's
    bytes and trainable variables, and the bytes of variables on each PS task (optimizer slots not
    counted; [] without PS tasks), as the chief built them.
    """
    cluster, graph = strategy.cluster, built.graph
    variables = graph.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES)
    run = {
        "cluster": {
            "ps": cluster.num_ps,
            "replicas": 1 if cluster.is_local else cluster.num_replicas,
            "towers": strategy.num_towers,
        },
        "strategy": {
            "class": type(strategy).__name__,
            "kind": strategy.kind,
            "synchronous": strategy.synchronous,
            "baseline": strategy.baseline,
            **{k: getattr(strategy, k, None) for k in (*strategy.knobs, "overlap") if hasattr(strategy, k)},
        },
        "batch_size": batch_size,
        "steps_per_run": built.step.steps_per_run,
        "accumulate_steps": built.step.accumulate_steps,
        "model_bytes": sum(waves.static_bytes(v) for v in variables),
        "variables": len(variables),
        "ps_loads": placement.ps_loads(graph, cluster.num_ps, include_slots=False) if cluster.num_ps else [],
    }
    os.makedirs(logdir, exist_ok=True)
    path = os.path.join(logdir, "run.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(run, f, indent=1, default=str)
    os.replace(tmp, path)
    return path


def read_run(logdir: str) -> dict:
    """What `write_run` wrote in `logdir` ({} when it wrote nothing: a user's own loop, `session`)."""
    try:
        with open(os.path.join(logdir, "run.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


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
