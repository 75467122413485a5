"""TF 2's ParameterServerStrategy as a benchmark system: a ClusterCoordinator on the chief.

    TF_CONFIG=... python disttrain/bench/peers/tf2_pss.py --spec=SPEC.json

Run by file path, never as `python -m disttrain...` (the disttrain package
switches a process to graph mode; TF 2's strategies need eager mode). The
benchmark (disttrain/bench/tf2.py) writes the spec and starts one process per
task of a cluster with a chief, PS tasks and workers.

PS and worker tasks only serve (tf.distribute.Server). The chief is the
coordinator, as in TF's parameter server training guide: it creates the
model's variables under the strategy (round robin by count over the PS, or
split along axis 0 by `MinSizePartitioner` when the spec asks for it), one
dataset per worker (`create_per_worker_dataset`), and schedules a tf.function
of `steps_per_function` steps at a time, keeping enough scheduled that no
worker waits for work, until the benchmark stops the cluster. Updates are
asynchronous: each step applies its own gradients on the PS.

Per-worker throughput: each scheduled function returns the index of the
worker that ran it (`experimental_get_current_worker_index`), the global step
after its last update and the worker's clock (`tf.timestamp`, taken on the
worker after its last step). The coordinator writes, for each worker, the
benchmark's throughput line every `log_every_steps` of that worker's steps to
`lines_paths[i]`, timed by that worker's own clock, so the figures do not
depend on when the coordinator fetched them. Worker 0's lines carry the
cluster's rate (from the global step), as disttrain's chief's do.

Accuracy mode (a spec with `heldout`, written by disttrain/bench/accuracy.py):
the chief trains the spec's task for its number of global steps and evaluates
the held-out set (tf2_heldout.py); when it is done, it writes `done_path`
and every task exits 0.
"""

import collections
import json
import os
import socket
import sys
import time

os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")  # TF's guide: every task of a PSS cluster
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import tf2_common as common  # noqa: E402
import tf2_heldout as heldout  # noqa: E402


def serve(spec: dict, cluster: dict, job: str, index: int) -> None:
    """A PS or worker task: serve until the benchmark ends it, or until the accuracy tool's chief is done."""
    common.set_threads(spec)
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=job,
        task_index=index,
        protocol="grpc",
        config=common.server_config(spec, job),
        start=True,
    )
    print(f"{common.task_name(job, index)} serving at {cluster[job][index]}", flush=True)
    if "heldout" not in spec:
        server.join()  # never returns
    while not os.path.exists(spec["heldout"]["done_path"]):  # the accuracy tool's run ends
        time.sleep(0.2)
    print(f"{common.task_name(job, index)}: the chief is done", flush=True)
    os._exit(0)  # a running server does not shut down cleanly


def wait_for_tasks(addresses: list[str], timeout: float) -> None:
    """Until every task's port accepts connections (the strategy fails on a task not up yet)."""
    deadline = time.monotonic() + timeout
    for address in addresses:
        host, port = address.rsplit(":", 1)
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit(f"task at {address} not reachable after {timeout:.0f} s")
                time.sleep(0.2)


def build(spec: dict, cluster: dict):
    """The chief's strategy, coordinator, model, global step and optimizer, the variables on the PS."""
    common.set_threads(spec)
    wait_for_tasks(cluster[common.PS] + cluster[common.WORKER], spec["peer_wait_secs"])
    num_ps, num_workers = len(cluster[common.PS]), len(cluster[common.WORKER])
    partitioner = None
    if spec["variable_partitioner"] == "min_size":
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=spec["min_shard_bytes"], max_shards=num_ps
        )
    elif spec["variable_partitioner"] is not None:
        sys.exit(f"variable_partitioner {spec['variable_partitioner']!r}: expected null or 'min_size'")
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = common.build_model(spec)
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        optimizer = common.Optimizer(spec, model.trainable, strategy.extended.colocate_vars_with, step)
    loads = common.ps_bytes(model.trainable, num_ps)
    placed = [{"name": v.name, "shape": v.shape.as_list(), "device": v.device} for v in model.trainable]
    with open(spec["placement_path"], "w") as f:
        json.dump({"ps_bytes": loads, "variables": placed}, f, indent=1)
    print(f"chief: {num_workers} worker(s), {num_ps} PS; model bytes per PS {loads}", flush=True)
    return strategy, coordinator, model, step, optimizer


def per_worker_iterator(strategy, coordinator, dataset_fn):
    """An iterator over each worker's own dataset, `dataset_fn(worker index tensor)`."""

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(
            # One pipeline per worker (the context's id is not the worker's): the worker's index.
            lambda _: dataset_fn(tf.distribute.coordinator.experimental_get_current_worker_index())
        )

    return iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))


def coordinate(spec: dict, cluster: dict) -> None:
    """The chief: build, then schedule steps for ever, writing each worker's throughput lines."""
    strategy, coordinator, model, _, optimizer = build(spec, cluster)
    num_workers = len(cluster[common.WORKER])
    iterator = per_worker_iterator(strategy, coordinator, lambda worker: common.synthetic(spec, worker))
    steps_per_function = spec["steps_per_function"]
    steps = common.replica_steps(strategy, model, optimizer, steps_per_function)

    @tf.function
    def train_steps(iterator):
        loss, global_step = steps(iterator)
        with tf.control_dependencies([loss, global_step]):
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            return worker, global_step, tf.timestamp(), loss

    intervals = [
        common.Interval(
            spec,
            common.task_name(common.WORKER, i),
            common.line_logger(spec, spec["lines_paths"][i]),
            spec["batch_size"] if i == 0 else None,
        )
        for i in range(num_workers)
    ]
    scheduled = collections.deque()
    ahead = spec["functions_ahead_per_worker"] * num_workers
    print(f"chief: scheduling {steps_per_function} steps per function, {ahead} functions ahead", flush=True)
    while True:
        while len(scheduled) < ahead:
            scheduled.append(coordinator.schedule(train_steps, args=(iterator,)))
        worker, global_step, seconds, loss = scheduled.popleft().fetch()
        intervals[int(worker)].add(steps_per_function, int(global_step), float(loss), float(seconds))


def coordinate_accuracy(spec: dict, cluster: dict) -> None:
    """The chief in the accuracy tool: train the task, evaluating the held-out set (tf2_heldout.py).

    Before each evaluation it waits for every scheduled function
    (`coordinator.join()`), so the evaluation sees the variables at exactly
    its global step and no worker trains on the excluded time.
    """
    tf.random.set_seed(spec["heldout"].get("seed", 0))  # the initial weights and shuffles: the tool's seed
    strategy, coordinator, model, step, optimizer = build(spec, cluster)
    data = heldout.load_task(spec)
    num_workers = len(cluster[common.WORKER])
    iterator = per_worker_iterator(
        strategy, coordinator, lambda worker: heldout.train_dataset(spec, data, worker, num_workers)
    )
    steps = common.replica_steps(strategy, model, optimizer, spec["steps_per_function"])
    train_steps = tf.function(steps)
    curve, correct = heldout.peer_curve(spec, data), heldout.correct_fn(model)
    h = spec["heldout"]
    for n, evaluate in heldout.chunks(h["steps"], h["eval_every_steps"], spec["steps_per_function"]):
        done = coordinator.schedule(train_steps, args=(iterator, tf.constant(n)))
        if curve.t0 is None:
            done.fetch()
            curve.start()
        if evaluate:
            coordinator.join()
            curve.evaluate(int(step.read_value()), correct)


def main() -> None:
    spec = common.load_spec(sys.argv)
    cluster, job, index = common.tf_config()
    if job == common.CHIEF and "heldout" in spec:
        try:
            coordinate_accuracy(spec, cluster)
        finally:
            open(spec["heldout"]["done_path"], "w").close()  # the PS and workers exit
        sys.stdout.flush()
        os._exit(0)  # now: a normal exit would reach for the tasks that just left, to release functions
    elif job == common.CHIEF:
        coordinate(spec, cluster)
    elif job in (common.PS, common.WORKER):
        serve(spec, cluster, job, index)
    else:
        sys.exit(f"task type {job!r}: expected chief, ps or worker")


if __name__ == "__main__":
    main()
