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
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import tf2_common as common  # noqa: E402


def main() -> None:
    spec = common.load_spec(sys.argv)
    cluster, job, index = common.tf_config()
    if job != common.WORKER:
        sys.exit(f"task type {job!r}: MultiWorkerMirroredStrategy runs workers only")
    common.set_threads(spec)
    num_workers = len(cluster[common.WORKER])
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
        lambda context: common.synthetic(spec, context.input_pipeline_id)
    )
    iterator = iter(dataset)
    steps_per_function = spec["steps_per_function"]
    steps = common.replica_steps(
        strategy,
        model,
        optimizer,
        steps_per_function,
        lambda grads: tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.MEAN, grads, options=options
        ),
    )

    @tf.function
    def train_steps(iterator):
        return steps(iterator)

    task = common.task_name(common.WORKER, index)
    batch = spec["batch_size"]
    interval = common.Interval(
        spec, task, common.line_logger(spec), batch * num_workers if index == 0 else None
    )
    pack = spec["bytes_per_pack"]
    print(f"{task}: {num_workers} worker(s), ring all-reduce in packs of {pack} bytes", flush=True)
    while True:
        loss, global_step = train_steps(iterator)
        loss = float(strategy.experimental_local_results(loss)[0])  # waits for the steps
        global_step = int(strategy.experimental_local_results(global_step)[0])
        interval.add(steps_per_function, global_step, loss, time.perf_counter())


if __name__ == "__main__":
    main()
