"""TF 2's MultiWorkerMirroredStrategy (ring all-reduce) as a benchmark system.

    TF_CONFIG=... python disttrain/bench/peers/tf2_mwms.py --spec=SPEC.json

Run by file path, never as `python -m disttrain...` (the disttrain package
switches a process to graph mode; TF 2's strategies need eager mode). The
benchmark (disttrain/bench/tf2.py) writes the spec and starts one process per
worker; worker 0 is the chief.

Every worker runs the same custom loop: a tf.function of `steps_per_function`
steps, each computing its gradients, averaging them with the replica
context's `all_reduce` (CommunicationImplementation.RING, `bytes_per_pack` as
disttrain's SyncAllReduce buckets) and applying them to its own mirrored copy
of the variables. Each worker prints the benchmark's throughput line every
`log_every_steps` steps, timed by its own clock; the chief's lines carry the
cluster's rate. It runs until the benchmark stops it.

Accuracy mode (a spec with `heldout`, written by disttrain/bench/accuracy.py):
every worker trains the spec's task for its number of global steps, worker 0
evaluating the held-out set (tf2_heldout.py), and exits.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import tf2_common as common  # noqa: E402
import tf2_heldout as heldout  # noqa: E402


def build(spec: dict, dataset_fn):
    """(strategy, model, steps, iterator): this worker's strategy, model and input.

    `steps` is common.replica_steps' `run(iterator[, n])` with the all-reduce,
    for the body of a tf.function; `dataset_fn(pipeline id, pipelines)` gives
    one replica's batches.
    """
    cluster, job, index = common.tf_config()
    if job != common.WORKER:
        sys.exit(f"task type {job!r}: MultiWorkerMirroredStrategy runs workers only")
    common.set_threads(spec)
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=spec["bytes_per_pack"],
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    with strategy.scope():
        model = common.build_model(spec)
    # Synchronous: every replica counts the same steps, so each keeps its own count (not mirrored).
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    with strategy.scope():
        optimizer = common.Optimizer(spec, model.trainable, strategy.extended.colocate_vars_with, step)
    dataset = strategy.distribute_datasets_from_function(
        lambda context: dataset_fn(context.input_pipeline_id, context.num_input_pipelines)
    )
    steps = common.replica_steps(
        strategy,
        model,
        optimizer,
        spec["steps_per_function"],
        lambda grads: tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.MEAN, grads, options=options
        ),
    )
    pack = spec["bytes_per_pack"]
    task, workers = common.task_name(job, index), len(cluster[job])
    print(f"{task}: {workers} worker(s), ring all-reduce in packs of {pack} bytes", flush=True)
    return strategy, model, steps, iter(dataset)


def main() -> None:
    spec = common.load_spec(sys.argv)
    if "heldout" in spec:
        return train_to_accuracy(spec)
    strategy, _, steps, iterator = build(spec, lambda pipeline, _: common.synthetic(spec, pipeline))

    @tf.function
    def train_steps(iterator):
        return steps(iterator)

    cluster, _, index = common.tf_config()
    task = common.task_name(common.WORKER, index)
    batch, num_workers = spec["batch_size"], len(cluster[common.WORKER])
    interval = common.Interval(
        spec, task, common.line_logger(spec), batch * num_workers if index == 0 else None
    )
    steps_per_function = spec["steps_per_function"]
    while True:
        loss, global_step = train_steps(iterator)
        loss = float(strategy.experimental_local_results(loss)[0])  # waits for the steps
        global_step = int(strategy.experimental_local_results(global_step)[0])
        interval.add(steps_per_function, global_step, loss, time.perf_counter())


def train_to_accuracy(spec: dict) -> None:
    """The accuracy tool's run: train the task; worker 0 evaluates the held-out set (tf2_heldout.py).

    The other workers wait in the next step's all-reduce while it evaluates.
    """
    tf.random.set_seed(spec["heldout"].get("seed", 0))  # the initial weights and shuffles: the tool's seed
    data = heldout.load_task(spec)
    strategy, model, steps, iterator = build(
        spec, lambda pipeline, pipelines: heldout.train_dataset(spec, data, pipeline, pipelines)
    )
    train_steps = tf.function(steps)
    _, _, index = common.tf_config()
    curve = heldout.peer_curve(spec, data) if index == 0 else None
    correct = heldout.correct_fn(model)
    h = spec["heldout"]
    for n, evaluate in heldout.chunks(h["steps"], h["eval_every_steps"], spec["steps_per_function"]):
        _, global_step = train_steps(iterator, tf.constant(n))
        global_step = int(strategy.experimental_local_results(global_step)[0])  # waits for the steps
        if curve is not None:
            curve.start()
            if evaluate:
                curve.evaluate(global_step, correct)


if __name__ == "__main__":
    main()
