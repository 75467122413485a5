"""One training entry for any model, and role dispatch: what each task does from start to exit.

`fit(loss_fn, optimizer_fn, ...)` is the whole life of one task of a user's
script, whatever its role; `session(strategy, ...)` is the same for a user's
own loop; the gin and model_zoo path (bin/train.py) is `disttrain.edges.zoo_run`, a
thin adapter over the same paths. What each role does is one table,
`ROLES`, that every entry reads. A PS only serves: it starts its server, waits until every
replica has said it is done (through a queue on the PS), and returns so that
the process exits 0 (TF's `server.join()` never returns).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import inspect
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence

import tensorflow as tf

from disttrain.base import logs, preemption, tf_errors
from disttrain.base.cluster import CHIEF, EVALUATOR, LOCAL, PS, WORKER, Cluster
from disttrain.base.config import RunSettings, whole_count
from disttrain.base.deadlines import Deadlines
from disttrain.base.errors import EXIT_TRANSIENT, ConfigError, DisttrainError, PreemptedError, TransientError
from disttrain.graph import placement
from disttrain.graph.clipping import Clip
from disttrain.runtime import evaluation, exporting, metrics, peers, ps_serving, recovery, trainer
from disttrain.runtime import watchdog as watchdogs
from disttrain.strategies import AsyncParameterServer, Strategy, SyncAllReduce

v1 = tf.compat.v1
log = logging.getLogger("disttrain")

SERVE, TRAIN, EVALUATE = "serve", "train", "evaluate"
# What a task of each type does, whatever the entry (fit, session, zoo_run.run).
ROLES = {PS: SERVE, WORKER: TRAIN, CHIEF: TRAIN, LOCAL: TRAIN, EVALUATOR: EVALUATE}


# ---- the one entry for any model ---------------------------------------------


def fit(
    loss_fn: Callable[[], tf.Tensor],
    optimizer_fn: Callable[[], v1.train.Optimizer],
    *,
    steps: int,
    logdir: str,
    strategy: Strategy | Callable[[Cluster], Strategy] | None = None,
    cluster: Cluster | None = None,
    batch_size: int = 1,
    hooks: Sequence[v1.train.SessionRunHook] = (),
    eval_fn: Callable | None = None,
    eval_steps: int = 10,
    export_best: exporting.BestExport | None = None,
    **settings,
) -> metrics.TaskThroughput | None:
    """Train `loss_fn` with `optimizer_fn()` on this task's part of the cluster; any role.

    loss_fn: builds one replica's loss, a floating-point scalar, input
      included, in graph mode (get_variable, Keras layers, tf.nn); called once
      per tower, and once more in a scratch graph to plan placement when its
      variables all come from get_variable. What it keeps between calls (an
      iterator) it keeps per `v1.get_default_graph()` (docs/own_model.md).
    optimizer_fn: returns a tf.compat.v1 optimizer (called inside the graph).
    steps: training ends when the global step reaches this (an integer >= 1).
    logdir: checkpoints (restored on start), TensorBoard events, task results.
    strategy: a strategy class, a callable cluster -> strategy (e.g.
      `functools.partial(disttrain.AsyncParameterServer, overlap=True)`) or one
      built for this task. None: AsyncParameterServer with PS tasks, else SyncAllReduce.
    cluster: None reads TF_CONFIG; no TF_CONFIG means one local process.
    batch_size: examples per tower and step, for examples/sec. hooks: more session hooks for every replica.
    eval_fn: `eval_fn()` or `eval_fn(input_context)` builds held-out metrics (a
      scalar loss, or a dict name -> scalar) with the training variables'
      names; a task of type 'evaluator' measures each checkpoint on the same
      `eval_steps` batches and writes `eval/<name>` scalars under `<logdir>/eval`.
    export_best: a `disttrain.BestExport`: the evaluator also exports each best
      checkpoint so far as a SavedModel; None: it exports nothing.
    settings: any RunSettings field (log_every_steps, save_checkpoint_steps,
      peer_wait_secs, ps_linger_secs, check_numerics, clip_norm, clip_where, ...).

    A PS serves until training is done and returns None; a replica trains
    and returns what it measured. What ends a task ends the process with one
    line on stderr and its documented exit code (docs/faults.md).
    """
    with errors_to_exit(cluster):
        settings = RunSettings.of(**settings)
        steps, logdir, batch_size, hooks = _checked(steps, logdir, batch_size, hooks)
        eval_steps = whole_count(eval_steps, "eval_steps")
        cluster = _checked_cluster(cluster, export_best)
        _start_process(settings)
        role = ROLES[cluster.task_type]
        if role == SERVE:
            refuse_what_replicas_refuse(strategy, cluster, settings)
            return serve(cluster, settings, logdir, steps)
        if role == EVALUATE:
            return _evaluate(eval_fn, export_best, logdir, batch_size, eval_steps, steps, settings, cluster)
        run = dict(steps=steps, logdir=logdir, settings=settings, batch_size=batch_size, hooks=hooks)
        return train_replica(make_strategy(strategy, cluster), loss_fn, optimizer_fn, **run)


def _checked_cluster(cluster, export_best) -> Cluster:
    """The cluster to run in (None: TF_CONFIG's, or one local process), its type and export_best's checked."""
    if cluster is not None and not isinstance(cluster, Cluster):
        raise ConfigError(
            f"cluster is a {type(cluster).__name__}: give a disttrain.Cluster "
            "(Cluster.from_tf_config(...), Cluster.from_hosts(...)), or None to read TF_CONFIG"
        )
    if export_best is not None and not isinstance(export_best, exporting.BestExport):
        raise ConfigError(f"export_best={export_best!r}: give a disttrain.BestExport, or None")
    return Cluster.from_env() if cluster is None else cluster


def _start_process(settings: RunSettings) -> None:
    """What every task's process does first: the console, SIGTERM as a preemption, the thread pools."""
    logs.to_console()
    preemption.PROCESS.install(Deadlines.of(settings).preempted_secs)
    set_process_threads(settings.intra_op_threads, settings.inter_op_threads)


def _evaluate(
    eval_fn,
    export_best,
    logdir: str,
    batch_size: int,
    eval_steps: int,
    steps: int,
    settings: RunSettings,
    cluster: Cluster,
) -> None:
    """An evaluator task of `fit`: evaluate each checkpoint with `eval_fn` until the last one (and export)."""
    if eval_fn is None:
        raise ConfigError(
            "an evaluator task needs fit(..., eval_fn=...): start the script as ps, worker or "
            "chief, or give eval_fn"
        )
    build = lambda: evaluation.call_eval_fn(eval_fn, batch_size)
    evaluation.evaluate_checkpoints(
        logdir, build, eval_steps, steps, Deadlines.of(settings).evaluator_secs, export_best, cluster=cluster
    )


def _checked(steps, logdir, batch_size, hooks) -> tuple[int, str, int, list[v1.train.SessionRunHook]]:
    """fit's and session's own arguments as the loop takes them; a ConfigError for any out of range."""
    if not isinstance(logdir, str | os.PathLike) or not os.fspath(logdir):
        raise ConfigError(
            f"logdir must be a directory path (checkpoints, events and results go there), got {logdir!r}"
        )
    if isinstance(hooks, v1.train.SessionRunHook):
        raise ConfigError(f"hooks is one {type(hooks).__name__}: give a list, hooks=[hook]")
    hooks = list(hooks or ())  # None: none
    for hook in hooks:
        if not isinstance(hook, v1.train.SessionRunHook):
            raise ConfigError(
                f"hooks holds a {type(hook).__name__}, not a tf.compat.v1.train.SessionRunHook: the "
                "training loop runs session hooks only (Keras callbacks do not run in it)"
            )
    return whole_count(steps, "steps"), os.fspath(logdir), whole_count(batch_size, "batch_size"), hooks


@contextlib.contextmanager
def session(
    strategy: Strategy,
    *,
    steps: int,
    logdir: str,
    batch_size: int = 1,
    hooks: Sequence[v1.train.SessionRunHook] = (),
    settings: RunSettings | None = None,
    **more_settings,
):
    """A monitored session for a loop of the user's own, after `strategy.minimize(...)`.

        with disttrain.session(strategy, steps=1000, logdir="/tmp/run") as session:
            while not session.should_stop():
                session.run(train_op)

    Everything `fit` does comes with it (servers, bounded peer waits, checkpoints, throughput,
    NaN guard, telling the PS when done). On a PS task it serves until training is done and then
    exits the process with code 0: a PS never enters the body. A replica started when the latest
    checkpoint is already at `steps` (restarted after the end) waits for no peer: its session
    stops before the first step. `session.result` is what this task measured, once the block
    has ended.
    """
    cluster = strategy.cluster
    with errors_to_exit(cluster):
        settings = settings or RunSettings.of(**more_settings)
        steps, logdir, batch_size, hooks = _checked(steps, logdir, batch_size, hooks)
        logs.to_console()
        notice = preemption.PROCESS.install(Deadlines.of(settings).preempted_secs)
        if ROLES[cluster.task_type] == SERVE:
            serve(cluster, settings, logdir, steps)
            sys.exit(0)
        over = _training_over(cluster, strategy, settings, logdir, steps)
        if over is not None:
            yield over
            return
        target, on_reconnect, session_config = _connect(cluster, strategy, settings, logdir)
        with trainer.monitored_session(
            cluster,
            strategy,
            logdir,
            steps,
            settings=settings,
            batch_size=batch_size,
            target=target,
            session_config=session_config,
            hooks=hooks,
            on_reconnect=on_reconnect,
            notice=notice,
        ) as monitored:
            yield monitored
        # Preempted, a replica is not done: a PS that counted it would leave. Only a PS that is
        # being preempted itself is told, so that it leaves once the chief has checkpointed.
        if not cluster.is_local and (notice.peer or not notice.requested()):
            ps_serving.signal_done(cluster, target, only=notice.peer)
        if notice.requested():
            raise PreemptedError(
                f"{cluster.task_name} preempted ({notice.reason}): stopped at global step "
                f"{monitored.result.global_step}; exiting to be restarted"
            )


class _Over:
    """What `session` yields to a replica started after training ended: it stops before any step."""

    def __init__(self, result: metrics.TaskThroughput):
        self.result = result

    def should_stop(self) -> bool:
        return True

    def run(self, *args, **kwargs):
        raise RuntimeError("training was over before this task started: there is no step to run")


def _over_at(cluster: Cluster, logdir: str, steps: int) -> int | None:
    """The latest checkpoint's global step when it is already at `steps` (training is over), else None.

    A task killed between the last step and its exit is restarted after its
    peers have gone: waiting for them would end in a loop of restarts. So it
    says so and ends at once, as finished.
    """
    latest = v1.train.latest_checkpoint(logdir)
    step = recovery.checkpoint_step(latest)
    if step is None or step < steps:
        return None
    log.info(
        f"{cluster.task_name}: training is already over: {latest} is at global step {step}, train_steps "
        f"is {steps} (to train more, raise the step count or give a new log directory); exiting"
    )
    return step


def _training_over(
    cluster: Cluster, strategy: Strategy, settings: RunSettings, logdir: str, steps: int
) -> _Over | None:
    """A replica started after training ended: tell the PS tasks still waiting for it, then end.

    Under a PS strategy each PS serves until the replicas report (or the
    chief and a linger); those already gone are skipped.
    """
    step = _over_at(cluster, logdir, steps)
    if step is None:
        return None
    if cluster.num_ps and not cluster.is_local and not preemption.PROCESS.requested():
        config = strategy.session_config(settings.intra_op_threads, settings.inter_op_threads)
        ps_serving.signal_done(cluster, peers.start_server(cluster, config).target)
    result = metrics.TaskThroughput(cluster.task_name, cluster.is_chief, global_step=step)
    trainer.write_result(logdir, cluster.task_type, cluster.task_index, result)
    return _Over(result)


def make_strategy(strategy, cluster: Cluster) -> Strategy:
    """A strategy for this task from a class, a callable cluster -> strategy, an instance or None."""
    if strategy is None:
        strategy = (
            SyncAllReduce if cluster.replica_jobs and not cluster.num_ps and not cluster.is_local else None
        )
        strategy = strategy or AsyncParameterServer
    if isinstance(strategy, Strategy):
        if strategy.cluster != cluster:
            raise ConfigError(
                f"the strategy was built for {strategy.cluster.task_name}, not {cluster.task_name}"
            )
        return strategy
    if not callable(strategy):
        raise ConfigError(
            f"strategy={strategy!r}: expected a strategy class such as disttrain.AsyncParameterServer, "
            "a callable cluster -> strategy, or a strategy built for this task"
        )
    _callable_with_a_cluster(strategy)
    return strategy(cluster)


def _callable_with_a_cluster(factory) -> None:
    """A ConfigError when `factory(cluster)` cannot bind its arguments (a misspelt knob in a partial)."""
    target, args, keywords = factory, (), {}
    if isinstance(factory, functools.partial):
        target, args, keywords = factory.func, factory.args, factory.keywords
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # no signature to read (a builtin): called as it is
        return
    try:
        signature.bind(*args, "cluster", **keywords)
    except TypeError as e:
        given = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in keywords.items())])
        name = getattr(target, "__name__", type(target).__name__)
        shown = f"functools.partial({name}, {given})" if given else name
        raise ConfigError(f"strategy={shown} cannot be called with the cluster: {e}") from None


def refuse_what_replicas_refuse(strategy, cluster: Cluster, settings: RunSettings) -> None:
    """On a PS: ConfigError for what the replicas refuse at start, so that it exits 2 with them.

    The replicas build the strategy, which checks its knobs, and refuse an
    aggregate clip it has no place for: they exit 2 at once. A PS that did
    not refuse the same would serve for ever for replicas that never come.
    (An evaluator waits for checkpoints `peer_wait_secs` at most.)
    """
    if not cluster.replica_jobs:
        return
    if not isinstance(strategy, Strategy):
        job, index = cluster.replica_jobs[0]
        strategy = make_strategy(strategy, Cluster(jobs=cluster.jobs, task_type=job, task_index=index))
    strategy.check_clip(Clip.of(settings))


@contextlib.contextmanager
def errors_to_exit(cluster: Cluster | None = None):
    """Turn what ends a task into one line on stderr and the documented exit code.

    Given this task's cluster, the peers TF's error shows failing are probed
    and named gone or restarted; the task never names itself.
    """
    try:
        yield
    except DisttrainError as e:
        fail(str(e), e.exit_code)
    except (
        tf.errors.UnavailableError,
        tf.errors.AbortedError,
        tf.errors.InternalError,
        tf.errors.CancelledError,
        tf.errors.FailedPreconditionError,
    ) as e:
        texts = [str(e.message or type(e).__name__)]
        passed_on = not isinstance(e, tf.errors.UnavailableError | tf.errors.AbortedError)
        if passed_on and not tf_errors.failed_with_a_peer(texts[0]):
            raise
        if cluster is None or cluster.is_local:
            lost = tf_errors.lost_peers(None, texts, {})
        else:
            lost = peers.probe_lost(cluster, [], texts)
        fail(_lost_contact(lost), EXIT_TRANSIENT)
    except RuntimeError as e:
        if not tf_errors.built_after_start(e):
            raise
        fail(BUILT_IN_THE_LOOP)
    except KeyboardInterrupt:
        fail("interrupted", 130)


# Seed 003: a TF 1 loop that builds an op at every step grows its graph, and every step slows.
BUILT_IN_THE_LOOP = (
    "an op was built after training started (its graph is finalized when the session starts): build "
    "every op before the session, outside the training loop, and run it there "
    "(a loop that builds ops at every step grows its graph and slows each step; docs/diagnose.md)"
)


def _lost_contact(lost: str) -> str:
    """How a task says peers are gone, on every path TF's error may take (which one is timing)."""
    return f"lost contact: {lost}"


def fail(message: str, code: int = ConfigError.exit_code):
    """One line on stderr, then exit with `code`.

    gin adds a line to an error raised in a configurable ("In call to
    configurable 'imagenet_input' (<function ...>)"): it is folded in as
    the configurable's name.
    """
    line, *more = message.strip().splitlines() or [""]
    configurable = re.search(r"In call to configurable '([^']+)'", "\n".join(more))
    if configurable:
        line += f" (in gin's {configurable[1]})"
    print(f"disttrain: error: {line}", file=sys.stderr, flush=True)
    sys.exit(code)


# ---- the two roles every entry shares ------------------------------------------


def serve(cluster: Cluster, settings: RunSettings, logdir: str, steps: int) -> None:
    """A PS task's whole life: serve variables until every replica is done (or the chief and a linger).

    Started when the checkpoint in `logdir` is already at `steps`, it ends at
    once: no replica would report to it.
    """
    if _over_at(cluster, logdir, steps) is not None:
        return
    server = peers.start_server(
        cluster, v1.ConfigProto(intra_op_parallelism_threads=settings.intra_op_threads)
    )
    log.info(f"{cluster.task_name} serving at {cluster.address}")
    deadlines = Deadlines.of(settings)
    replicas = [(f"/job:{job}/task:{i}", cluster.jobs[job][i]) for job, i in cluster.replica_jobs]
    over = lambda: (recovery.checkpoint_step(v1.train.latest_checkpoint(logdir)) or -1) >= steps
    # Ends this PS when no replica has been reachable for peer_secs (after serving_secs, while
    # they start): nobody would ever report to it.
    watchdog = watchdogs.Watchdog(
        cluster.task_name, replicas, deadlines.peer_secs, settings.wait_log_secs, over, all_needed=False
    )
    watchdog.start().enter("serving", deadlines.serving_secs)
    notice = preemption.PROCESS
    reported = ps_serving.serve_until_done(
        cluster, server.target, deadlines.linger_secs, deadlines.ps_preempted_secs, notice
    )
    watchdog.stop()
    if notice.requested():
        chief = "the chief checkpointed first" if 0 in reported else "the chief did not report a checkpoint"
        raise PreemptedError(f"{cluster.task_name} preempted ({notice.reason}): {chief}; exiting")
    log.info(f"{cluster.task_name} done: {len(reported)}/{cluster.num_replicas} replicas reported; exiting")


def _connect(cluster: Cluster, strategy: Strategy, settings: RunSettings, logdir: str):
    """Start this replica's server and wait for its peers: (target, on_reconnect, session config)."""
    session_config = strategy.session_config(settings.intra_op_threads, settings.inter_op_threads)
    trainer.check_writable(logdir)
    if cluster.is_local:
        return "", None, session_config
    server = peers.start_server(cluster, session_config)
    target = server.target
    others = peers.peers(cluster, strategy.device_filters())
    deadlines = Deadlines.of(settings)
    peers.wait_for_peers(others, deadlines.peer_secs, say_every_secs=settings.wait_log_secs)
    peers.check_cluster_agrees(cluster, target, peers.spec_anchor(cluster), deadlines.cluster_check_secs)

    def on_reconnect(tf_texts: list[str]):
        lost = peers.probe_lost(cluster, others, tf_texts)
        if not strategy.recovers_in_process:
            raise TransientError(
                f"{_lost_contact(lost)}; {type(strategy).__name__} cannot recover in-process: "
                "exiting to restart from the last checkpoint"
            )
        log.info(f"{cluster.task_name} lost its session: {lost}; checking peers")
        peers.wait_for_peers(others, deadlines.peer_secs, say_every_secs=settings.wait_log_secs)
        latest = v1.train.latest_checkpoint(logdir) if cluster.is_chief else None
        log.info(f"{cluster.task_name} every peer is reachable again; resuming from {latest or 'the chief'}")

    return target, on_reconnect, session_config


def train_replica(
    strategy: Strategy,
    loss_fn: Callable[[], tf.Tensor],
    optimizer_fn: Callable,
    *,
    steps: int,
    logdir: str,
    settings: RunSettings,
    batch_size: int,
    hooks: Sequence[v1.train.SessionRunHook] = (),
    on_built: Callable[[], None] | None = None,
) -> metrics.TaskThroughput:
    """A replica's whole life: build its graph, train it to `steps` in `session`, return what it measured."""
    cluster = strategy.cluster
    trainer.check_writable(logdir)
    built = trainer.build(
        strategy,
        loss_fn,
        optimizer_fn,
        settings.check_numerics,
        batch_size,
        clip=Clip.of(settings),
        accumulate_steps=settings.accumulate_steps,
        steps_per_run=settings.steps_per_run,
    )
    trainer.check_replica_memory(built.graph, cluster.task_name, settings.replica_memory_bytes)
    if cluster.is_chief:
        texts = {"run/settings": repr(settings), "run/cluster": cluster.describe()}
        texts["run/strategy"] = strategy.describe()
        if strategy.uses_ps and cluster.num_ps:
            texts["run/placement"] = placement_report(strategy, built.graph)
            log.info(texts["run/placement"])
        metrics.write_texts(logdir, texts)
        trainer.write_run(logdir, strategy, built, batch_size)
        if on_built is not None:
            on_built()
    with session(
        strategy, steps=steps, logdir=logdir, batch_size=batch_size, hooks=hooks, settings=settings
    ) as monitored:
        while not monitored.should_stop():
            monitored.run(built.train_op)
    return monitored.result


def placement_report(strategy: Strategy, graph: tf.Graph, title: str = "placement (variables per PS)") -> str:
    """Bytes per PS in the built graph, and the variables too large to place whole fairly."""
    lines = [placement.report(graph, strategy.cluster.num_ps, title)]
    for big in strategy.placed_whole:
        lines.append(
            f"  {big.name} ({big.nbytes / 2**20:.2f} MiB) is on /job:ps/task:{big.task} whole: it is not a "
            "get_variable variable, so it could not be split"
        )
    return "\n".join(lines)


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


def read_results(logdir: str) -> dict[str, dict]:
    """The result.json of every replica that finished, by task directory name."""
    out = {}
    for path in sorted(glob.glob(os.path.join(logdir, "tasks", "*", "result.json"))):
        with open(path) as f:
            out[os.path.basename(os.path.dirname(path))] = json.load(f)
    return out
