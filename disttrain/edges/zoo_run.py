"""The gin / model_zoo path: one task of a TrainConfig run, in any role (disttrain-train, bin/train.py).

A thin adapter over `launch`'s paths: a model_zoo model and its input
pipeline become a loss function (`zoo_loss_fn`), and each role of
`launch.ROLES` runs what it runs for `fit`. The library never reads gin:
`config` is a TrainConfig that the entry point's gin has already bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tensorflow as tf

from disttrain import launch
from disttrain.base import preemption
from disttrain.base.cluster import EVALUATOR, PS, Cluster
from disttrain.base.config import TrainConfig
from disttrain.base.deadlines import Deadlines
from disttrain.graph import placement
from disttrain.graph.clipping import Clip
from disttrain.runtime import evaluation, trainer
from disttrain.strategies import Strategy

v1 = tf.compat.v1
log = logging.getLogger("disttrain")


def zoo_loss_fn(config: TrainConfig, cluster: Cluster, strategy: Strategy) -> Callable[[], tf.Tensor]:
    """One replica's loss for a model_zoo model: its input pipeline (made on first call) and the model."""
    model = config.model
    iterators = {}  # one per graph: a scratch build for placement gets its own

    def loss_fn():
        graph = v1.get_default_graph()
        if graph not in iterators:
            with tf.device(strategy.input_device):
                dataset = config.input_fn(
                    model, config.batch_size, max(cluster.replica_index, 0), cluster.num_replicas
                )
                # A plain iterator: the zoo's synthetic inputs have no position worth saving, and
                # serializing an iterator waits for its prefetch (or fails on a py_function).
                iterators[graph] = v1.data.make_one_shot_iterator(trainer.without_autotune_thread(dataset))
        features, labels = iterators[graph].get_next()
        return model.training_loss(features, labels, config.regularization)

    return loss_fn


def build_zoo(cluster: Cluster, config: TrainConfig, strategy: Strategy) -> trainer.Built:
    """A model_zoo replica's training graph in the current graph, placement planned from its shapes."""
    strategy.plan_placement(config.model.build_variables)
    return trainer.build(
        strategy,
        zoo_loss_fn(config, cluster, strategy),
        config.optimizer,
        config.check_numerics,
        config.batch_size,
        clip=Clip.of(config),
        accumulate_steps=config.accumulate_steps,
        steps_per_run=config.steps_per_run,
    )


def _serve(cluster: Cluster, config: TrainConfig, logdir: str, on_built) -> int:
    launch.serve(cluster, config, logdir, config.train_steps)
    return 0


def _train(cluster: Cluster, config: TrainConfig, logdir: str, on_built) -> int:
    strategy = config.strategy(cluster)
    strategy.plan_placement(config.model.build_variables)  # split large variables from shapes alone
    launch.train_replica(
        strategy,
        zoo_loss_fn(config, cluster, strategy),
        config.optimizer,
        steps=config.train_steps,
        logdir=logdir,
        settings=config,
        batch_size=config.batch_size,
        on_built=on_built,
    )
    return 0


def _evaluate(cluster: Cluster, config: TrainConfig, logdir: str, on_built) -> int:
    """Evaluate each new checkpoint on the same batches of the eval input; stop after the last one."""
    model = config.model
    input_fn = config.eval_input_fn
    if input_fn is None:
        log.warning(
            "evaluator: TrainConfig.eval_input_fn is not set, so it evaluates on the training input "
            "(bind it to a held-out split for a held-out accuracy)"
        )
        input_fn = config.input_fn

    def build_metrics():
        dataset = input_fn(model, config.batch_size, 0, 1)
        features, labels = v1.data.make_one_shot_iterator(dataset).get_next()
        logits = model(features, training=False)
        return {"loss": model.loss(logits, labels), "accuracy": model.accuracy(logits, labels)}

    evaluation.evaluate_checkpoints(
        logdir,
        build_metrics,
        config.eval_steps,
        config.train_steps,
        Deadlines.of(config).evaluator_secs,
        cluster=cluster,
    )
    return 0


# What each role of launch.ROLES does on this path.
_LIVES: dict[str, Callable[..., int]] = {
    launch.SERVE: _serve,
    launch.TRAIN: _train,
    launch.EVALUATE: _evaluate,
}


def run(
    cluster: Cluster,
    config: TrainConfig,
    logdir: str,
    on_built: Callable[[], None] | None = None,
) -> int:
    """The whole life of one task; returns its exit code (errors raise DisttrainError)."""
    config.validate()
    preemption.PROCESS.install(Deadlines.of(config).preempted_secs)
    launch.set_process_threads(config.intra_op_threads, config.inter_op_threads)
    if launch.ROLES[cluster.task_type] == launch.SERVE:
        launch.refuse_what_replicas_refuse(config.strategy, cluster, config)
    life = _LIVES[launch.ROLES[cluster.task_type]]
    return life(cluster, config, logdir, on_built)


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
    with tf.Graph().as_default():
        built = build_zoo(view, config, strategy)
    if strategy.plan is not None:
        lines.append(placement.report(built.graph, view.num_ps, "placement plan (variables per PS)"))
        for name, (axis, parts) in sorted(strategy.plan.parts.items()):
            lines.append(f"  split {name} into {parts} parts along axis {axis}")
        for task in range(view.num_ps):
            names = sorted(n for n, t in strategy.plan.devices.items() if t == task)
            more = f" (+{len(names) - 6} more)" if len(names) > 6 else ""
            lines.append(f"  /job:ps/task:{task}: {', '.join(names[:6])}{more}")
    return "\n".join(lines)
