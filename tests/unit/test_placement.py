"""Placement, checked on built graphs with no servers: each op's `.device` is asserted."""

import pytest
import tensorflow as tf

from disttrain.base.cluster import Cluster
from disttrain.graph import placement
from disttrain.strategies import AsyncParameterServer, base

v1 = tf.compat.v1

# AlexNet's variable shapes (tf_cnn_benchmarks): fc6 is 61% of the bytes.
ALEXNET = {
    "conv1": [11, 11, 3, 64],
    "conv2": [5, 5, 64, 192],
    "conv3": [3, 3, 192, 384],
    "conv4": [3, 3, 384, 256],
    "conv5": [3, 3, 256, 256],
    "fc6": [9216, 4096],
    "fc7": [4096, 4096],
    "fc8": [4096, 1000],
}


def alexnet_like_variables():
    weights = {}
    for name, shape in ALEXNET.items():
        with v1.variable_scope(name):
            weights[name] = v1.get_variable("weights", shape)
            v1.get_variable("biases", shape[-1:])
    return weights


def cluster(num_ps, task=0):
    return Cluster.from_hosts("worker", task, [f"p{i}:1" for i in range(num_ps)], ["w0:1", "w1:1"])


def variable_ops(graph):
    return [op for op in graph.get_operations() if op.type == "VarHandleOp"]


def test_load_comes_from_attributes_not_the_size_0_handle():
    with tf.Graph().as_default() as g:
        v1.get_variable("w", [1000, 10])
    (op,) = variable_ops(g)
    assert op.outputs[0].shape == []  # a resource handle: output-shape load functions see 0 bytes
    assert placement.variable_specs(g)[0].nbytes == 40_000


def test_fc6_is_61_percent():
    specs = placement.collect_variables(alexnet_like_variables)
    total = sum(s.nbytes for s in specs)
    fc6 = next(s for s in specs if s.name == "fc6/weights")
    assert fc6.nbytes / total == pytest.approx(0.61, abs=0.01)


def build_under(setter, getter=None):
    with tf.Graph().as_default() as g, g.device(setter), v1.variable_scope("", custom_getter=getter):
        alexnet_like_variables()
    return g


@pytest.mark.parametrize("num_ps", [2, 4, 8])
def test_round_robin_vs_greedy_vs_partitioned(num_ps, capsys):
    worker = "/job:worker/task:0/device:CPU:0"
    rr = placement.ps_loads(build_under(placement.round_robin_setter(num_ps, worker)), num_ps)
    greedy = placement.ps_loads(
        build_under(placement.DeviceSetter(cluster(num_ps).ps_devices, worker, worker)), num_ps
    )
    plan = placement.make_plan(placement.collect_variables(alexnet_like_variables), num_ps)
    setter = placement.DeviceSetter(cluster(num_ps).ps_devices, worker, worker, plan)
    parted = placement.ps_loads(build_under(setter, placement.partitioning_getter(plan)), num_ps)
    with capsys.disabled():
        print(
            f"\nAlexNet-like, {num_ps} PS, busiest/mean: round robin {placement.max_over_mean(rr):.2f}, "
            f"greedy unsplit {placement.max_over_mean(greedy):.2f}, "
            f"partitioned {placement.max_over_mean(parted):.3f}"
        )
    # fc6 alone is 0.61 of the bytes: unsplit, its PS carries 0.61 * P times the mean.
    assert placement.max_over_mean(greedy) >= 0.6 * num_ps
    assert placement.max_over_mean(rr) >= placement.max_over_mean(greedy) - 1e-9
    assert placement.max_over_mean(parted) <= 1.05
    assert list(parted) == list(plan.loads)  # the built graph is what the plan says


@pytest.mark.parametrize("num_ps", range(1, 17))
def test_plan_within_5_percent_for_every_ps_count(num_ps):
    plan = placement.make_plan(placement.collect_variables(alexnet_like_variables), num_ps)
    assert plan.max_over_mean <= 1.05
    if num_ps == 1:
        assert not plan.parts  # nothing to balance, nothing split


def build_training_graph(strategy, optimizer=v1.train.AdamOptimizer):
    with tf.Graph().as_default() as g:
        strategy.plan_placement(alexnet_like_variables)
        with strategy.scope():
            dataset = tf.data.Dataset.from_tensors((tf.zeros([2, 9216]), tf.zeros([2], tf.int32))).repeat()
            x, y = v1.data.make_one_shot_iterator(dataset).get_next()

            def loss_fn():
                w = alexnet_like_variables()
                logits = tf.matmul(tf.matmul(tf.matmul(x, w["fc6"]), w["fc7"]), w["fc8"])
                return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))

            strategy.minimize(optimizer(1e-3), loss_fn)
    return g


def test_every_op_on_the_right_device():
    strategy = AsyncParameterServer(cluster(4, task=1))
    g = build_training_graph(strategy)
    worker_cpu = "/job:worker/task:1/device:CPU:0"
    for op in g.get_operations():
        if op.type == "VarHandleOp":
            assert op.device.startswith("/job:ps/task:"), op.name
        elif op.type in ("IteratorGetNext", "TensorDataset", "RepeatDataset", "OneShotIterator"):
            assert op.device == worker_cpu, (op.name, op.device)
        elif op.type in ("MatMul", "SparseSoftmaxCrossEntropyWithLogits"):
            assert op.device == worker_cpu, (op.name, op.device)
        elif op.type.startswith("ResourceApply"):
            assert op.device.startswith("/job:ps/"), (op.name, op.device)
    # fc6 is split across PS tasks, and optimizer slots sit with their variable.
    devices = {op.name: op.device for op in variable_ops(g)}
    fc6_parts = sorted(n for n in devices if n.startswith("fc6/weights/part_"))
    assert len({devices[n] for n in fc6_parts}) > 1
    for name, device in devices.items():
        if name.endswith("/Adam") or name.endswith("/Adam_1"):
            primary = name.rsplit("/", 1)[0]
            assert device == devices[primary], name
    # Slots and pinned ops are not counted in the load table: it holds each variable once.
    loads = placement.ps_loads(g, 4, include_slots=False)
    assert placement.max_over_mean(loads) <= 1.05


def test_pinned_variable_is_kept_and_not_counted():
    setter = placement.DeviceSetter(
        ["/job:ps/task:0", "/job:ps/task:1"], "/job:worker/task:0", "/job:worker/task:0"
    )
    with tf.Graph().as_default() as g, g.device(setter):
        with tf.device("/job:ps/task:1"):
            v1.get_variable("pinned", [1000])
        v1.get_variable("free", [10])
    devices = {op.name: op.device for op in variable_ops(g)}
    assert devices["pinned"] == "/job:ps/task:1"
    assert devices["free"] == "/job:ps/task:0"  # task 1 holds 4000 bytes, but not by our choice
    assert setter.loads == [40, 0]


def test_gpu_worker_puts_compute_on_gpu_and_input_on_cpu(monkeypatch):
    monkeypatch.setattr(base, "visible_gpus", lambda: 2)
    strategy = AsyncParameterServer(cluster(2, task=1))
    assert strategy.num_towers == 2  # one tower per GPU by default
    g = build_training_graph(strategy)
    kinds = {}
    for op in g.get_operations():
        kinds.setdefault(op.type, set()).add(op.device)
    assert kinds["MatMul"] >= {"/job:worker/task:1/device:GPU:0", "/job:worker/task:1/device:GPU:1"}
    assert kinds["IteratorGetNext"] == {"/job:worker/task:1/device:CPU:0"}
    assert all(d.startswith("/job:ps/") for d in kinds["VarHandleOp"])
    config = strategy.session_config()
    assert list(config.device_filters) == ["/job:ps", "/job:worker/task:1"]
    assert config.gpu_options.allow_growth


def test_towers_read_each_variable_once_per_host():
    strategy = AsyncParameterServer(cluster(2), num_towers=2)
    g = build_training_graph(strategy, v1.train.GradientDescentOptimizer)
    # Every read of a PS variable feeds one cached copy on the worker, shared by the towers.
    reads = [op for op in g.get_operations() if op.type == "ReadVariableOp" and "cached_read" in op.name]
    towers = {op.name.split("/")[0] for op in g.get_operations() if op.type == "MatMul"}
    assert towers == {"tower_0", "tower_1"}
    assert len(reads) == len(
        [op for op in variable_ops(g) if "/Adam" not in op.name and op.name != "global_step"]
    )
    assert strategy.session_config().device_count["CPU"] == 2
