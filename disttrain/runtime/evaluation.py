"""The evaluator: each new checkpoint measured on the same held-out batches, beside training.

One loop for the zoo's evaluator task (its model's loss and accuracy on
`TrainConfig.eval_input_fn`) and a user's (`fit(..., eval_fn=...)`): build
the metrics once in a graph of their own, then for each checkpoint the chief
writes, restore it in a new session (so the input starts afresh and every
checkpoint sees the same batches), average each metric over `eval_steps`
batches, write `eval/<name>` scalars under `<logdir>/eval` and log one line.
It stops after the checkpoint of the last step, or when none comes within
`wait_secs`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping

import tensorflow as tf

from disttrain.base.cluster import Cluster
from disttrain.base.errors import ConfigError
from disttrain.graph import input_context, input_feeds
from disttrain.runtime import exporting, metrics, trainer

POLL_SECS = 2.0  # how often the evaluator looks for a new checkpoint, and whether training is over

v1 = tf.compat.v1
log = logging.getLogger("disttrain")


def as_metrics(built) -> dict[str, tf.Tensor]:
    """What an eval function returned, as name -> scalar tensor (a lone tensor is the loss).

    A ConfigError, before any checkpoint is read, for anything else: a
    tuple, a value that is no tensor, a metric that is not a numeric scalar.
    """
    named = dict(built) if isinstance(built, Mapping) else {"loss": built}
    for name, value in named.items():
        if not tf.is_tensor(value):
            raise ConfigError(
                f"eval_fn returned {type(value).__name__}"
                + (f" for {name!r}" if isinstance(built, Mapping) else "")
                + ": return a scalar tensor, or a dict of name -> scalar tensor"
            )
        if value.shape.rank or not (value.dtype.is_floating or value.dtype.is_integer):
            raise ConfigError(
                f"eval_fn's {name!r} is a {value.dtype.name} tensor of shape {value.shape.as_list()}: each "
                "metric is a numeric scalar, averaged over eval_steps batches (tf.reduce_mean a "
                "per-example one)"
            )
    return named


def call_eval_fn(eval_fn: Callable, batch_size: int | None) -> dict[str, tf.Tensor]:
    """`eval_fn()`, or `eval_fn(context)` with the one pipeline an evaluator has."""
    if input_context.takes_context(eval_fn):
        return as_metrics(
            eval_fn(input_context.InputContext(batch_size=batch_size, global_batch_size=batch_size))
        )
    return as_metrics(eval_fn())


def evaluate_checkpoints(
    logdir: str,
    build_metrics: Callable[[], dict[str, tf.Tensor]],
    eval_steps: int,
    last_step: int,
    wait_secs: float,
    export_best: exporting.BestExport | None = None,
    cluster: Cluster | None = None,
) -> list[tuple[int, dict[str, float]]]:
    """Evaluate every new checkpoint in `logdir` until the one at `last_step`; return what was measured.

    Training may end before `last_step` (data that does not repeat): once
    the chief of `cluster` has finished (its result.json, written after this
    call began: an older one is an earlier run's), the evaluator stops when
    the newest checkpoint is measured. Otherwise it stops after `wait_secs`
    without a new checkpoint.

    `build_metrics()` builds the metrics (variables named as in training, so
    that the checkpoint restores them) in a fresh graph; NumPy arrays its
    datasets are built from are fed when each session starts
    (`disttrain.graph.input_feeds`). With `export_best`, each checkpoint whose
    metric is the best so far is exported as well
    (`disttrain.runtime.exporting.BestExport`), its serving function built in the
    same graph.
    """
    measured = []
    started = time.time()

    def finished() -> int | None:
        """The chief's last global step once it has finished in this run, else None."""
        return None if cluster is None else trainer.chief_result_step(logdir, cluster, written_after=started)

    with tf.Graph().as_default():
        values = input_feeds.feeding(build_metrics)()
        exporter = _best_exporter(logdir, export_best, sorted(values))
        global_step = v1.train.get_or_create_global_step()
        saver = v1.train.Saver()
        writer = v1.summary.FileWriter(os.path.join(logdir, "eval"))
        for path in _new_checkpoints(logdir, wait_secs, finished):
            if exporter is not None:
                exporter.check(path)
            with v1.Session() as session:
                saver.restore(session, path)
                step, means = _measure(session, values, global_step, eval_steps)
                _write_result(writer, step, means)
                if exporter is not None:
                    exporter.offer(session, path, step, means)
            measured.append((step, means))
            if step >= last_step:
                break
        writer.close()
    _log_end(measured, last_step, finished(), wait_secs)
    return measured


def _best_exporter(
    logdir: str, export_best: exporting.BestExport | None, names: list[str]
) -> exporting.BestExporter | None:
    """The exporter of each best checkpoint, told the values earlier evaluators measured (None: no export)."""
    if export_best is None:
        return None
    earlier = measured_before(logdir, f"eval/{export_best.metric}")
    return exporting.BestExporter(export_best, names, earlier)


def _new_checkpoints(logdir: str, wait_secs: float, finished: Callable[[], int | None]) -> Iterator[str]:
    """Each new checkpoint of `logdir` until the chief's last is measured or none comes in `wait_secs`."""
    newest_path, newest_at = None, time.monotonic()  # the last checkpoint measured, and when

    def stop_waiting() -> bool:  # after a poll found no new checkpoint
        if finished() is not None and v1.train.latest_checkpoint(logdir) == newest_path:
            return True  # the chief has finished, and its last checkpoint is measured
        return time.monotonic() - newest_at >= wait_secs

    polls = v1.train.checkpoints_iterator(
        logdir, min_interval_secs=1, timeout=POLL_SECS, timeout_fn=stop_waiting
    )
    for path in polls:
        yield path  # the caller measures it before it asks for the next one
        newest_path, newest_at = path, time.monotonic()


def _measure(
    session: v1.Session, values: dict[str, tf.Tensor], global_step: tf.Tensor, eval_steps: int
) -> tuple[int, dict[str, float]]:
    """The restored checkpoint's global step, and each metric's mean over `eval_steps` fresh batches."""
    names = sorted(values)
    input_feeds.start_inputs(session)
    runs = [session.run([values[n] for n in names]) for _ in range(eval_steps)]
    step = int(session.run(global_step))
    return step, {n: float(sum(r[i] for r in runs) / len(runs)) for i, n in enumerate(names)}


def _write_result(writer: v1.summary.FileWriter, step: int, means: dict[str, float]) -> None:
    """One checkpoint's `eval/<name>` scalars, flushed for TensorBoard, and its console line."""
    writer.add_summary(metrics.scalar_summary({f"eval/{n}": v for n, v in means.items()}), step)
    writer.flush()
    said = "  ".join(f"eval {n} {v:.4f}" for n, v in means.items())
    log.info(f"evaluator: step {step}  {said}")


def _log_end(
    measured: list[tuple[int, dict[str, float]]], last_step: int, end: int | None, wait_secs: float
) -> None:
    """Log why the evaluator stopped: last step measured, chief finished (at `end`), or no new checkpoint."""
    if measured and (measured[-1][0] >= last_step or end is not None):
        step = end if end is not None else measured[-1][0]
        log.info(f"evaluator: training is over at global step {step}, and its last checkpoint is measured")
    elif end is not None:
        log.warning(
            f"evaluator: training is over at global step {end} and wrote no checkpoint (none is written "
            "when both save_checkpoint_steps and save_checkpoint_secs are None): nothing to evaluate"
        )
    else:
        log.warning(
            f"evaluator: no new checkpoint in {wait_secs:.0f} s; stopping "
            + (f"after step {measured[-1][0]}" if measured else "without evaluating one")
        )


def measured_before(logdir: str, tag: str) -> list[float]:
    """The values of the scalar `tag` that evaluators of `logdir` wrote before (none: empty)."""
    values = []
    for path in sorted(tf.io.gfile.glob(os.path.join(logdir, "eval", "events.out.tfevents.*"))):
        try:
            for event in v1.train.summary_iterator(path):
                values += [v.simple_value for v in event.summary.value if v.tag == tag]
        except tf.errors.DataLossError:  # a file cut short by a killed evaluator: what it holds before
            continue
    return values
