"""Synchronous strategies on built graphs, no servers: devices, buckets, casts, towers, keys.

Collectives between two virtual CPU devices of this process run for real
(DirectSession's local collective executor), so the all-reduce math is
checked without a cluster.
"""

import itertools
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from disttrain.base.cluster import Cluster
from disttrain.base.errors import ConfigError
from disttrain.edges.local import free_port
from disttrain.strategies import SyncAllReduce, SyncParameterServer, allreduce, autotune
from model_zoo.mlp import MLP

v1 = tf.compat.v1


def ps_cluster(task=1, num_workers=2, num_ps=2, job="worker"):
    return Cluster.from_hosts(
        job, task, [f"p{i}:1" for i in range(num_ps)], [f"w{i}:1" for i in range(num_workers)]
    )


def chief_cluster(job="worker", task=1):
    return Cluster.from_hosts(job, task, (), ["w0:1", "w1:1"], chief_host="c:1")


def build(strategy, batch=4, optimizer=lambda: v1.train.GradientDescentOptimizer(0.1)):
    """The MLP's training graph under `strategy`, as trainer.build makes it (input from constants)."""
    model = MLP(8, (16,), 4)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(3)
        strategy.plan_placement(model.build_variables)
        with strategy.scope():
            global_step = v1.train.get_or_create_global_step()

            def loss_fn():
                features = tf.random.stateless_uniform([batch, 8], seed=[1, 2])
                labels = tf.zeros([batch], tf.int32)
                return model.loss(model(features, training=True), labels)

            train_op = strategy.minimize(optimizer(), loss_fn, global_step)
    return graph, train_op


def task_of(device):
    spec = tf.DeviceSpec.from_string(device)
    return (spec.job, spec.task)


def ops_of(graph, op_type):
    return [op for op in graph.get_operations() if op.type == op_type]


# ---- buckets and the all-reduce math ---------------------------------------------


def test_buckets_are_consecutive_and_about_the_size():
    assert allreduce.make_buckets([4, 4, 4, 4], 8) == [[0, 1], [2, 3]]
    assert allreduce.make_buckets([4, 100, 4], 8) == [[0], [1], [2]]  # a big tensor gets its own bucket
    assert allreduce.make_buckets([3, 3, 3], 100) == [[0, 1, 2]]
    assert allreduce.make_buckets([], 8) == []


def two_replica_mean(grads_per_replica, bucket_bytes, transfer_dtype=None):
    """Build all_reduce_mean for two replicas on CPU:0 and CPU:1 of this process and run it."""
    with tf.Graph().as_default() as graph:
        outs = []
        for device, grads in enumerate(grads_per_replica):
            with tf.device(f"/device:CPU:{device}"):
                tensors = [tf.constant(g) for g in grads]
                outs.append(
                    allreduce.all_reduce_mean(tensors, 2, bucket_bytes, transfer_dtype, itertools.count(1))
                )
        with v1.Session(graph=graph, config=v1.ConfigProto(device_count={"CPU": 2})) as session:
            return graph, session.run(outs)


def test_all_reduce_mean_of_fused_buckets_is_exact_in_float32():
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (4,), (5, 2, 2), (7,)]
    a = [rng.normal(size=s).astype(np.float32) for s in shapes]
    b = [rng.normal(size=s).astype(np.float32) for s in shapes]
    graph, (out0, out1) = two_replica_mean([a, b], bucket_bytes=64)
    for x, y, r0, r1 in zip(a, b, out0, out1, strict=True):
        np.testing.assert_allclose(r0, (x + y) / 2, rtol=1e-6)
        np.testing.assert_array_equal(r0, r1)  # every replica gets the same bits
        assert r0.shape == x.shape and r0.dtype == np.float32
    # 64-byte buckets over 48, 16, 80, 28 bytes, last tensor first: [(7,)], [(5,2,2)], [(4,), (3,4)]
    assert len(ops_of(graph, "CollectiveReduceV2")) == 2 * 3


def test_one_bucket_when_it_fits():
    a = [np.ones((3,), np.float32), np.ones((2, 2), np.float32)]
    graph, _ = two_replica_mean([a, a], bucket_bytes=1 << 20)
    assert len(ops_of(graph, "CollectiveReduceV2")) == 2  # one per replica


@pytest.mark.parametrize(
    "dtype,tf_dtype,tol", [("float16", tf.float16, 1e-3), ("bfloat16", tf.bfloat16, 1e-2)]
)
def test_16_bit_transfer_casts_before_and_accumulates_mean_in_float32(dtype, tf_dtype, tol):
    rng = np.random.default_rng(1)
    a = [rng.normal(size=(64,)).astype(np.float32)]
    b = [rng.normal(size=(64,)).astype(np.float32)]
    graph, (out0, _) = two_replica_mean([a, b], 1 << 20, tf_dtype)
    (reduce_op, _) = ops_of(graph, "CollectiveReduceV2")
    assert reduce_op.inputs[0].dtype == tf_dtype
    assert out0[0].dtype == np.float32
    np.testing.assert_allclose(out0[0], (a[0] + b[0]) / 2, rtol=tol, atol=tol)


@pytest.mark.parametrize("tf_dtype", [tf.float16, tf.bfloat16])
def test_16_bit_rows_are_gathered_and_averaged_as_rows(tf_dtype):
    """all_gather_mean in 16 bits on two virtual CPUs (bfloat16 travels as float16's bits: no kernel)."""
    rng = np.random.default_rng(2)
    rows = [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(2, 4)).astype(np.float32)]
    ids = [np.array([0, 5, 9]), np.array([5, 7])]
    with tf.Graph().as_default() as graph:
        outs = []
        for device in range(2):
            with tf.device(f"/device:CPU:{device}"):
                grad = tf.IndexedSlices(tf.constant(rows[device]), tf.constant(ids[device]), [10, 4])
                (mean,) = allreduce.all_gather_mean([grad], 2, tf_dtype, itertools.count(1))
                outs.append(tf.math.unsorted_segment_sum(mean.values, mean.indices, 10))
        with v1.Session(graph=graph, config=v1.ConfigProto(device_count={"CPU": 2})) as session:
            out0, out1 = session.run(outs)
    want = np.zeros((10, 4), np.float32)
    for r, i in zip(rows, ids, strict=True):
        np.add.at(want, i, r / 2)
    np.testing.assert_allclose(out0, want, rtol=1e-2, atol=1e-2)
    np.testing.assert_array_equal(out0, out1)
    gathered = [op for op in ops_of(graph, "CollectiveGather") if op.inputs[0].shape.rank == 2]
    assert gathered and all(op.inputs[0].dtype.size == 2 for op in gathered)


def gradient_collectives(graph):
    """The all-reduces of gradients (not a vote in an all-reduce of its own, where one is made)."""
    return [op for op in ops_of(graph, "CollectiveReduceV2") if "preemption_vote" not in op.name]


def collective_input_bytes(graph) -> int:
    return sum(
        op.inputs[0].shape.num_elements() * op.inputs[0].dtype.size for op in gradient_collectives(graph)
    )


def test_16_bit_transfer_halves_the_bytes_given_to_the_collectives():
    sizes = {}
    for transfer in (None, "float16", "bfloat16"):
        graph, _ = build(SyncAllReduce(chief_cluster(), bucket_bytes=256, transfer_dtype=transfer))
        sizes[transfer] = collective_input_bytes(graph)
    # The model's gradients and the step's vote (a preemption flag and a count), riding in a bucket.
    model_bytes = 4 * (8 * 16 + 16 + 16 * 4 + 4 + 2)
    assert sizes[None] == model_bytes
    assert sizes["float16"] == sizes["bfloat16"] == model_bytes // 2


def test_the_vote_rides_in_the_first_gradient_bucket_not_a_collective_of_its_own():
    graph, _ = build(SyncAllReduce(chief_cluster(), bucket_bytes=256))
    reduces = ops_of(graph, "CollectiveReduceV2")
    assert reduces and not [op for op in reduces if "preemption_vote" in op.name]
    (flag,) = [op for op in graph.get_operations() if op.name.endswith("preempted_here")]
    first = min(reduces, key=lambda op: int(tf.get_static_value(op.inputs[3])))  # the first instance key
    # The flag reaches the first bucket's collective (through the stacked ballot and the bucket's concat).
    seen, frontier = set(), [first]
    while frontier:
        op = frontier.pop()
        seen.add(op)
        frontier += [t.op for t in op.inputs if t.op not in seen]
    assert flag in seen


def test_a_vote_whose_counts_16_bits_cannot_hold_is_an_all_reduce_of_its_own_in_float32():
    # 300 replicas: a sum of flags or of towers up to 300, past the integers 16-bit floats hold exactly.
    many = Cluster.from_hosts("worker", 1, (), [f"w{i}:1" for i in range(299)], chief_host="c:1")
    graph, _ = build(SyncAllReduce(many, bucket_bytes=256, transfer_dtype="bfloat16"))
    (vote,) = [op for op in ops_of(graph, "CollectiveReduceV2") if "preemption_vote" in op.name]
    assert vote.inputs[0].shape.num_elements() == 2 and vote.inputs[0].dtype == tf.float32


# ---- SyncAllReduce graphs ---------------------------------------------------------------


def test_all_reduce_variables_live_on_the_replica_and_keys_match_across_replicas():
    keys = {}
    for job, task in (("chief", 0), ("worker", 0), ("worker", 1)):
        strategy = SyncAllReduce(chief_cluster(job, task), bucket_bytes=256)
        graph, _ = build(strategy)
        devices = {op.device for op in ops_of(graph, "VarHandleOp")}
        assert devices == {f"/job:{job}/task:{task}/device:CPU:0"}
        with graph.as_default():
            scaffold = strategy.scaffold()
        reduces = ops_of(graph, "CollectiveReduceV2")
        assert {op.device for op in reduces} == {f"/job:{job}/task:{task}/device:CPU:0"}
        sends, recvs = ops_of(graph, "CollectiveBcastSendV2"), ops_of(graph, "CollectiveBcastRecvV2")
        if job == "chief":
            assert sends and not recvs
        else:
            assert recvs and not sends
            assert scaffold.ready_for_local_init_op is not None  # does not wait for the chief's variables
        keys[(job, task)] = [int(tf.get_static_value(op.inputs[3])) for op in reduces] + sorted(
            int(tf.get_static_value(op.inputs[3 if op in sends else 2])) for op in sends + recvs
        )
    assert len(set(map(tuple, keys.values()))) == 1  # the same instance keys, in the same order, everywhere


def test_all_reduce_server_config_names_the_leader_and_every_replica():
    strategy = SyncAllReduce(chief_cluster("worker", 1))
    config = strategy.session_config()
    assert config.experimental.collective_group_leader == "/job:chief/replica:0/task:0"
    assert list(config.device_filters) == ["/job:chief/task:0", "/job:worker/task:0", "/job:worker/task:1"]
    no_chief = SyncAllReduce(ps_cluster(task=1, num_ps=0))
    assert no_chief.session_config().experimental.collective_group_leader == "/job:worker/replica:0/task:0"
    assert strategy.examples_per_step(8) == 3 * 8
    assert not SyncAllReduce.uses_ps


def test_all_reduce_bad_settings_are_clear_errors():
    with pytest.raises(ConfigError, match="transfer_dtype='int8'"):
        SyncAllReduce(chief_cluster(), transfer_dtype="int8")
    with pytest.raises(ConfigError, match="bucket_bytes"):
        SyncAllReduce(chief_cluster(), bucket_bytes=0)
    with pytest.raises(ConfigError, match="communication_hint='mpi'"):
        SyncAllReduce(chief_cluster(), communication_hint="mpi")
    with pytest.raises(ConfigError, match="max_subdivs must be >= 1"):
        SyncAllReduce(chief_cluster(), max_subdivs=0)


def test_all_reduce_bad_autotune_settings_are_clear_errors():
    with pytest.raises(ConfigError, match="autotune_runs must be >= 1, got 0"):
        SyncAllReduce(chief_cluster(), autotune=True, autotune_runs=0)
    with pytest.raises(ConfigError, match="autotune_grid is empty"):
        SyncAllReduce(chief_cluster(), autotune=True, autotune_grid=())
    with pytest.raises(ConfigError, match=r"autotune setting \(0, 8\): bucket_bytes must be an int >= 1"):
        SyncAllReduce(chief_cluster(), autotune=True, autotune_grid=((0, 8),))
    with pytest.raises(ConfigError, match=r"autotune setting \(1024, 0\): max_subdivs must be"):
        SyncAllReduce(chief_cluster(), autotune=True, autotune_grid=((1024, 0),))
    with pytest.raises(ConfigError, match="autotune setting 1024: expected a"):
        SyncAllReduce(chief_cluster(), autotune=True, autotune_grid=(1024,))


def test_autotune_candidates_start_with_the_configured_setting_once():
    strategy = SyncAllReduce(
        chief_cluster(),
        bucket_bytes=1024,
        autotune=True,
        autotune_grid=((2048, None), (1024, None), (1024, 4)),
    )
    assert [(s.bucket_bytes, s.max_subdivs) for s in strategy.tuner.settings] == [
        (1024, -1),
        (2048, -1),
        (1024, 4),
    ]
    # The default setting (4 MiB, TF's pieces) is in the default grid: first, and not twice.
    assert SyncAllReduce(chief_cluster(), autotune=True).tuner.settings == list(autotune.DEFAULT_GRID)
    assert SyncAllReduce(chief_cluster()).tuner is None and SyncAllReduce(chief_cluster()).hooks() == []


def test_autotuned_all_reduce_is_exact_whichever_candidate_is_chosen():
    """Two replicas on two virtual CPUs, each with its own tuner; both switched to each candidate in turn."""
    rng = np.random.default_rng(2)
    shapes = [(3, 4), (4,), (5, 2, 2), (7,)]
    grads = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(2)]
    settings = [autotune.Setting(64), autotune.Setting(1 << 20, 4), autotune.Setting(16, 1)]

    def reduce_fn(tensors, setting, keys):
        return allreduce.all_reduce_mean(
            tensors, 2, setting.bucket_bytes, None, keys, max_subdivs=setting.max_subdivs
        )

    with tf.Graph().as_default() as graph:
        tuners, outs = [], []
        for device in range(2):
            with tf.device(f"/device:CPU:{device}"), v1.variable_scope(f"replica_{device}"):
                tuner = autotune.Autotuner(settings, group_size=2, group_key=1)
                outs.append(
                    tuner.reduce([tf.constant(g) for g in grads[device]], reduce_fn, itertools.count(1))
                )
                tuners.append(tuner)
        # In the graph itself only the probes and the agreement: the candidates' sit in the switch's branches.
        assert {op.name.split("/")[1] for op in ops_of(graph, "CollectiveReduceV2")} == {"autotune"}
        with v1.Session(graph=graph, config=v1.ConfigProto(device_count={"CPU": 2})) as session:
            session.run(v1.local_variables_initializer())
            for k in [0, 1, 2, 1, 0]:
                for tuner in tuners:
                    session.run(tuner._set_index, {tuner._chosen_ph: k})
                out0, out1 = session.run(outs)
                for x, y, r0, r1 in zip(*grads, out0, out1, strict=True):
                    np.testing.assert_allclose(r0, (x + y) / 2, rtol=1e-6)
                    np.testing.assert_array_equal(r0, r1)
            # Both replicas' probes of one candidate run together, as tune() runs them on every task.
            session.run([tuners[0]._probes[1], tuners[1]._probes[1]])


def test_all_reduce_leaves_backprop_as_tf_built_it():
    """Ungated gradients, and no control edge added between backprop's ops.

    Ordering backprop with added control edges stopped CIFAR-10, AlexNet and
    VGG16 from training on CPUs where TF turns oneDNN on: Grappler fused a
    conv's filter and bias gradients into one kernel, the added edges became
    a cycle through it, and TF's executor ended the step without running the
    update, without an error (decision 0027, issue 20).
    """
    graph, _ = build(SyncAllReduce(chief_cluster(), bucket_bytes=256))
    backprop = [op for op in graph.get_operations() if op.name.startswith("gradients/")]
    assert backprop and not [op.name for op in backprop if op.control_inputs]
    assert not [op for op in graph.get_operations() if "tuple/group_deps" in op.name]  # GATE_NONE


def test_all_reduce_passes_the_subdivision_cap_to_every_collective():
    for cap, expected in ((None, -1), (8, 8)):
        graph, _ = build(SyncAllReduce(chief_cluster(), bucket_bytes=256, max_subdivs=cap))
        reduces = gradient_collectives(graph)
        assert len(reduces) > 1 and {op.get_attr("max_subdivs_per_device") for op in reduces} == {expected}


def test_all_reduce_towers_on_virtual_cpus_reduce_once_per_bucket():
    strategy = SyncAllReduce(chief_cluster("worker", 0), num_towers=2, bucket_bytes=1 << 20)
    graph, _ = build(strategy)
    matmuls = {op.device for op in ops_of(graph, "MatMul") if op.name.startswith("tower_")}
    assert matmuls == {"/job:worker/task:0/device:CPU:0", "/job:worker/task:0/device:CPU:1"}
    assert len(gradient_collectives(graph)) == 1  # towers are averaged first, on the host
    assert strategy.session_config().device_count["CPU"] == 2
    assert strategy.examples_per_step(8) == 3 * 8 * 2


def run_local(strategy, steps=3, batch=4):
    """Train the MLP in this process under `strategy` (no cluster); return the final variables."""
    graph, train_op = build(strategy, batch)
    with graph.as_default():
        init = v1.global_variables_initializer()
        scaffold = strategy.scaffold()
        scaffold.finalize()
        variables = v1.trainable_variables()
    with v1.Session(graph=graph, config=strategy.session_config()) as session:
        session.run(init)
        session.run(scaffold.local_init_op)
        for _ in range(steps):
            session.run(train_op)
        return graph, session.run({v.op.name: v for v in variables})


def test_one_replica_needs_no_collectives_and_trains():
    graph, values = run_local(SyncAllReduce(Cluster.local()))
    assert not ops_of(graph, "CollectiveReduceV2") and not ops_of(graph, "CollectiveBcastSendV2")
    _, reference = run_local(SyncParameterServer(Cluster.local()))
    for name, value in values.items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-6)


def test_local_towers_equal_one_tower_with_the_summed_batch():
    # The same rows in both towers: their mean gradient is the one tower's.
    _, two = run_local(SyncAllReduce(Cluster.local(), num_towers=2), batch=4)
    _, one = run_local(SyncAllReduce(Cluster.local(), num_towers=1), batch=4)
    for name, value in two.items():
        np.testing.assert_allclose(value, one[name], rtol=1e-5, atol=1e-7)


# ---- SyncParameterServer graphs --------------------------------------------------------------


def test_sync_ps_accumulators_sit_with_their_variables_on_the_ps():
    strategy = SyncParameterServer(ps_cluster(task=1))
    graph, _ = build(strategy, optimizer=lambda: v1.train.AdamOptimizer(0.01))
    variables = {op.name: op.device for op in ops_of(graph, "VarHandleOp")}
    assert all(d.startswith("/job:ps/") for d in variables.values())
    accumulators = ops_of(graph, "ResourceConditionalAccumulator")
    trainable = [name for name in variables if name.startswith(("fc1/", "logits/")) and "Adam" not in name]
    assert len(trainable) > 4  # the plan split some variables over the 2 PS: one accumulator per part
    assert len(accumulators) == len(trainable)
    for acc in accumulators:
        var = acc.get_attr("shared_name").decode().removesuffix("/grad_accum")
        assert task_of(acc.device) == task_of(variables[var])
    for op_type in ("ResourceAccumulatorApplyGradient", "ResourceAccumulatorTakeGradient"):
        for op in ops_of(graph, op_type):
            assert task_of(op.device) == task_of(op.inputs[0].op.device)
    queues = ops_of(graph, "FIFOQueueV2")
    assert {task_of(op.device) for op in queues} == {task_of(variables["global_step"])}
    # The replica works on the worker; only variables, their updates and the queues are on a PS.
    assert {op.device for op in ops_of(graph, "MatMul")} == {"/job:worker/task:1/device:CPU:0"}


def test_sync_ps_pieces_have_an_accumulator_each_and_cross_in_waves():
    # MLP(8, (16,), 4): fc1 512 bytes, logits 256: pieces of 128 bytes cut each into several.
    strategy = SyncParameterServer(ps_cluster(task=1, num_ps=1), piece_bytes=128)
    graph, _ = build(strategy)
    assert strategy.plan.parts["fc1/weights"][1] == 4 and strategy.plan.parts["logits/weights"][1] == 2
    pieces = [op.name for op in ops_of(graph, "VarHandleOp") if "/part_" in op.name]
    accumulators = {
        op.get_attr("shared_name").decode().removesuffix("/grad_accum")
        for op in ops_of(graph, "ResourceConditionalAccumulator")
    }
    assert set(pieces) <= accumulators  # each piece's gradient is accumulated on its own
    # The step reads pieces in waves, after the global step: the first two pieces at once, and
    # each later one once the piece two before it has arrived.
    reads = [op for op in ops_of(graph, "ReadVariableOp") if op.name.startswith("cached_read")]
    waits = [sorted(c.name for c in op.control_inputs if c.name != "sync_step/local_step") for op in reads]
    assert len(reads) == 8 and all(op.control_inputs for op in reads)  # 6 pieces, 2 biases
    assert waits[:2] == [[], []] and all(len(w) == 1 for w in waits[2:]), waits


def test_sync_ps_reads_the_global_step_before_any_variable():
    strategy = SyncParameterServer(ps_cluster(task=0, num_ps=1))
    graph, _ = build(strategy)
    step = graph.get_operation_by_name("sync_step/local_step")
    forward = [op for op in ops_of(graph, "MatMul") if not op.name.startswith(("gradients", "sync_update"))]
    reads = [t.op for op in forward for t in op.inputs if t.op.type == "ReadVariableOp"]
    assert len(reads) == 2  # fc1/weights, logits/weights
    for op in reads:
        assert step in op.control_inputs, op.name


def test_sync_ps_leaves_initial_values_built_in_the_loss_function_free_of_the_step_read():
    """`get_variable(initializer=tf.constant(...))` in loss_fn: the chief initialises it before any step."""
    strategy = SyncParameterServer(ps_cluster(task=0, num_ps=1))
    graph = tf.Graph()
    with graph.as_default(), strategy.scope():

        def loss_fn():
            w = v1.get_variable("w", initializer=tf.constant(np.ones((4, 2), np.float32)))
            return tf.reduce_sum(tf.matmul(tf.ones((3, 4)), w))

        strategy.minimize(v1.train.GradientDescentOptimizer(0.1), loss_fn)
        (w,) = [v for v in v1.global_variables() if v.op.name == "w"]
    step = graph.get_operation_by_name("sync_step/local_step")

    def upstream(op):
        seen, stack = set(), [op]
        while stack:
            op = stack.pop()
            if op not in seen:
                seen.add(op)
                stack += [t.op for t in op.inputs] + list(op.control_inputs)
        return seen

    assert step not in upstream(w.initializer)
    (matmul,) = [op for op in ops_of(graph, "MatMul") if not op.name.startswith("gradients")]
    assert step in upstream(matmul)  # the step's read of w still waits for the step read


def test_sync_ps_steps_count_the_aggregated_replicas():
    assert SyncParameterServer(ps_cluster(num_workers=3)).examples_per_step(8) == 3 * 8
    assert SyncParameterServer(ps_cluster(num_workers=3), backup_workers=1).examples_per_step(8) == 2 * 8
    assert (
        SyncParameterServer(ps_cluster(num_workers=3), backup_workers=1, num_towers=2).examples_per_step(8)
        == 32
    )
    with pytest.raises(ConfigError, match="backup_workers=3 out of range: the cluster has 3 replica"):
        SyncParameterServer(ps_cluster(num_workers=3), backup_workers=3)
    with pytest.raises(ConfigError, match="needs at least one 'ps' task"):
        SyncParameterServer(ps_cluster(num_ps=0))


def test_sync_ps_hooks_aggregator_only_on_the_chief():
    for task, has_aggregator in ((0, True), (1, False)):
        strategy = SyncParameterServer(ps_cluster(task=task))
        build(strategy)
        names = [type(h).__name__ for h in strategy.hooks()]
        assert ("_Aggregator" in names) == has_aggregator
        assert "_DrainOwnTokens" in names


def test_sync_ps_local_applies_directly():
    graph, _ = run_local(SyncParameterServer(Cluster.local()))
    assert not ops_of(graph, "ResourceConditionalAccumulator")


def test_all_reduce_steps_carry_a_preemption_vote_and_a_flag_stops_every_replica():
    strategy = SyncAllReduce(chief_cluster("worker", 0))
    graph, _ = build(strategy)
    assert [op for op in graph.get_operations() if op.name.endswith("preempted_here")]
    assert strategy.votes_on_preemption
    assert "_PreemptionVote" in [type(h).__name__ for h in strategy.hooks()]
    alone = SyncAllReduce(Cluster.local())
    build(alone)
    assert not alone.votes_on_preemption and not alone.hooks()  # nobody to tell


def test_an_aggregator_that_stops_mid_run_lets_the_chiefs_run_of_several_steps_end():
    """In-process PS and chief servers, the other replica absent, three steps per run.

    The chief's first step waits for a step that can never close (worker 1
    never reports). Its aggregator is then stopped as an error stops it; it
    must release the chief through every step left in its run, so that the run
    returns and the session sees the stop (an error of the aggregator's own
    stops it the same way). With one token each step after the
    first waited for ever (the watchdog ended such runs after 120 s).
    """
    hosts = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    spec = tf.train.ClusterSpec({"ps": hosts[:1], "worker": hosts[1:]})
    chief = [tf.distribute.Server(spec, job_name=job, task_index=0) for job in ("ps", "worker")][1]
    strategy = SyncParameterServer(Cluster.from_hosts("worker", 0, hosts[:1], hosts[1:]))
    with tf.Graph().as_default():

        def loss_fn():
            w = v1.get_variable("w", [4], initializer=v1.ones_initializer())
            return tf.reduce_sum(tf.square(w))

        with strategy.scope():
            train_op = strategy.minimize(v1.train.GradientDescentOptimizer(0.1), loss_fn, steps_per_run=3)
        creator = v1.train.ChiefSessionCreator(master=chief.target, config=strategy.session_config())
        with v1.train.MonitoredSession(creator, hooks=strategy.hooks()) as session:
            ran = {}

            def run():
                try:
                    ran["result"] = session.run(train_op, options=v1.RunOptions(timeout_in_ms=30_000))
                except tf.errors.OpError as e:
                    ran["error"] = type(e).__name__

            thread = threading.Thread(target=run)
            thread.start()
            time.sleep(2)  # the first step has reported and waits for its token
            assert thread.is_alive()
            # As a lost PS or the aggregator's own error stops it: the watcher wakes the aggregator.
            session._coordinated_creator.coord.request_stop()
            thread.join(60)
            assert "error" not in ran, f"the chief's run of 3 steps did not end: {ran['error']}"
            assert "result" in ran and session.should_stop()
            assert session.run(v1.train.get_global_step()) == 0  # released, not applied
