"""AsyncParameterServer(overlap=True): worker-side copies, a queued gradient, a transfer loop."""

import time

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.training import training_util

from disttrain import AsyncParameterServer, Cluster
from disttrain.base import tf_internals
from disttrain.base.errors import ConfigError
from disttrain.edges.local import free_port
from disttrain.runtime import trainer

v1 = tf.compat.v1


def quadratic(strategy, lr=0.5, target=1.0):
    """Build training of w on 0.5 * (w - target)^2 from w = 0; return (train_op, w, global_step)."""
    with strategy.scope():

        def loss_fn():
            w = v1.get_variable("w", [], initializer=v1.zeros_initializer())
            return 0.5 * tf.square(w - target)

        global_step = v1.train.get_or_create_global_step()
        train_op = strategy.minimize(v1.train.GradientDescentOptimizer(lr), loss_fn, global_step)
    return train_op, v1.global_variables("w")[0], global_step


def alternating_run(strategy, steps):
    """One step, then one round of the transfer loop, `steps` times: no pipelining at all."""
    with tf.Graph().as_default():
        train_op, w, _ = quadratic(strategy)
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            session.run(v1.local_variables_initializer())  # copies start from the PS values
            for _ in range(steps):
                session.run(train_op)
                session.run(strategy.transfer_op)
            return session.run(w)


def test_step_then_transfer_is_plain_sgd():
    plain = 1 - 0.5**5
    overlapped = alternating_run(AsyncParameterServer(Cluster.local(), overlap=True), steps=5)
    assert overlapped == pytest.approx(plain)
    with tf.Graph().as_default():
        train_op, w, _ = quadratic(AsyncParameterServer(Cluster.local()))
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            for _ in range(5):
                session.run(train_op)
            assert session.run(w) == pytest.approx(plain)


def test_bfloat16_transfer_rounds_only_the_wire():
    strategy = AsyncParameterServer(Cluster.local(), overlap=True, transfer_dtype="bfloat16")
    assert alternating_run(strategy, steps=6) == pytest.approx(1 - 0.5**6, rel=1e-2)


def test_a_step_waits_when_the_transfer_loop_is_a_gradient_behind():
    strategy = AsyncParameterServer(Cluster.local(), overlap=True)
    with tf.Graph().as_default():
        train_op, _, _ = quadratic(strategy)
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            session.run(v1.local_variables_initializer())
            session.run(train_op)  # its gradient waits in the queue
            with pytest.raises(tf.errors.DeadlineExceededError):
                session.run(train_op, options=v1.RunOptions(timeout_in_ms=300))
            session.run(strategy.transfer_op)  # the loop takes it: room for the next
            session.run(train_op)


class _Final(v1.train.SessionRunHook):
    """Reads tensors in end(), after the hooks before it (the drain) have run."""

    def __init__(self, fetches):
        self.fetches, self.values = fetches, None

    def end(self, session):
        self.values = session.run(self.fetches)


def test_pipelined_training_applies_every_gradient_before_the_session_closes():
    strategy = AsyncParameterServer(Cluster.local(), overlap=True)
    with tf.Graph().as_default():
        train_op, w, global_step = quadratic(strategy, lr=0.1)
        final = _Final([global_step, w])
        with v1.train.MonitoredTrainingSession(hooks=[*strategy.hooks(), final]) as session:
            for _ in range(40):
                session.run(train_op)  # the queue runner applies while this loop computes
    steps, value = final.values
    assert steps == 40  # every queued gradient applied once, none dropped, none twice
    assert value == pytest.approx(1.0, abs=0.05)  # converges despite stale gradients


def test_the_step_the_loop_stops_by_counts_this_replicas_gradients_in_flight():
    strategy = AsyncParameterServer(Cluster.local(), overlap=True)
    with tf.Graph().as_default():
        train_op, _, global_step = quadratic(strategy)
        steps = [strategy.global_step_read, strategy.stop_step_read]
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            session.run(v1.local_variables_initializer())
            session.run(train_op)
            session.run(strategy.transfer_op)
            session.run(train_op)  # queued, not applied
            assert session.run(steps) == [1, 2]
            session.run(strategy.transfer_op)
            assert session.run(steps) == [2, 2]
            session.run(global_step.assign_add(5))  # other replicas' updates, seen at the next push
            session.run(train_op)
            assert session.run(steps) == [2, 3]
            session.run(strategy.transfer_op)
            assert session.run(steps) == [8, 8]


def slowed_transfer_loop(graph, secs):
    """Make each round of the graph's transfer loop wait `secs` between its dequeue and its push."""
    (dequeue,) = [op for op in graph.get_operations() if op.type.startswith("QueueDequeue")]
    pushes = [op for op in graph.get_operations() if op.type.startswith("ResourceApply")]
    held = tf.numpy_function(lambda _: (time.sleep(secs), np.int64(0))[1], [dequeue.outputs[0]], tf.int64)
    for push in pushes:
        tf_internals.add_control_input(push, held.op)


def test_one_process_stops_at_the_last_step_while_its_transfer_loop_lags():
    # The mirror of the global step lags the steps taken by the queue and the round in flight: stopping
    # by it, a replica alone trained 1-2 steps past the last (12 of 10 here).
    strategy = AsyncParameterServer(Cluster.local(), overlap=True)
    with tf.Graph().as_default() as graph:
        train_op, _, global_step = quadratic(strategy, lr=0.1)
        slowed_transfer_loop(graph, 0.05)
        stop = trainer._StopAtStep(last_step=10, step_read=strategy.stop_step_read)
        final = _Final(global_step)
        with v1.train.MonitoredTrainingSession(hooks=[*strategy.hooks(), stop, final]) as session:
            while not session.should_stop():
                session.run(train_op)
    assert stop.reached and final.values == 10


def test_the_drain_does_not_wait_for_a_transfer_loop_that_stopped():
    # A transfer loop that fails (its PS gone) stops the coordinator; what it left queued stays queued.
    strategy = AsyncParameterServer(Cluster.local(), overlap=True)
    with tf.Graph().as_default():
        train_op, _, _ = quadratic(strategy)
        (drain,) = strategy.hooks()
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            session.run(v1.local_variables_initializer())
            session.run(train_op)  # queued; no transfer loop runs in a plain session
            coord = v1.train.Coordinator()
            try:
                raise tf.errors.UnavailableError(None, None, "the PS is gone")
            except tf.errors.UnavailableError as e:
                coord.request_stop(e)  # as the loop's QueueRunner reports its failure
            drain.after_create_session(session, coord)
            started = time.monotonic()
            drain.end(session)
            assert time.monotonic() - started < 30  # not the 120 s drain timeout


def two_ps_model(strategy):
    """Build a [64, 32] matmul trained with Adam, its weight split over 2 PS; return (graph, train_op)."""
    with tf.Graph().as_default() as g:
        strategy.plan_placement(lambda: v1.get_variable("w", [64, 32]))
        with strategy.scope():
            x = tf.ones([4, 64])

            def loss_fn():
                return tf.reduce_sum(tf.matmul(x, v1.get_variable("w", [64, 32])))

            train_op = strategy.minimize(v1.train.AdamOptimizer(0.1), loss_fn)
    return g, train_op


def test_copies_live_on_the_worker_and_casts_on_the_ps():
    cluster = Cluster.from_hosts("worker", 1, ["p0:1", "p1:1"], ["w0:1", "w1:1"])
    strategy = AsyncParameterServer(cluster, overlap=True, transfer_dtype="bfloat16")
    g, _ = two_ps_model(strategy)
    with g.as_default():
        local = {v.op.name: v.op.device for v in v1.local_variables()}
        global_names = {v.op.name for v in v1.global_variables()}
        runners = v1.get_collection(v1.GraphKeys.QUEUE_RUNNERS)
    worker = "/job:worker/task:1/device:CPU:0"
    assert local and all(d == worker for d in local.values()), local
    assert not set(local) & global_names  # never checkpointed
    assert [r.enqueue_ops for r in runners] == [[strategy.transfer_op]]
    assert runners[0].queue.queue_ref.device == worker
    pulled = [op for op in g.get_operations() if op.type == "ReadVariableOp" and op.name.startswith("pull/")]
    reads = [op for op in pulled if "global_step" not in op.inputs[0].name]
    assert len(reads) == 2  # w is split in two, one per PS
    for read in reads:  # each pulled right after its own update, not after all of them
        assert [c.type for c in read.control_inputs] == ["ResourceApplyAdam"], read.control_inputs
        assert read.control_inputs[0].inputs[0] is read.inputs[0]
    casts = [op for op in g.get_operations() if op.type == "Cast"]
    to_wire = [op for op in casts if op.get_attr("DstT") == tf.bfloat16]
    assert any(op.device.startswith("/job:ps/") for op in to_wire)  # pulled values leave the PS as bfloat16
    assert any(op.device == worker for op in to_wire)  # gradients leave the worker as bfloat16
    applies = [op for op in g.get_operations() if op.type.startswith("ResourceApply")]
    assert applies and all(op.device.startswith("/job:ps/") for op in applies)


def test_16_bit_transfer_needs_no_overlap():
    strategy = AsyncParameterServer(Cluster.local(), transfer_dtype="bfloat16")
    with tf.Graph().as_default():
        train_op, w, _ = quadratic(strategy)
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            for _ in range(6):
                session.run(train_op)
            assert session.run(w) == pytest.approx(1 - 0.5**6, rel=1e-2)
    with pytest.raises(ConfigError, match="expected None, 'float32', 'float16' or 'bfloat16'"):
        AsyncParameterServer(Cluster.local(), overlap=True, transfer_dtype="int8")


def test_a_step_touches_no_ps_not_even_for_the_global_step():
    """All a step runs, and all TF's hooks fetch as the global step, lives on the worker."""
    cluster = Cluster.from_hosts("worker", 0, ["p0:1", "p1:1"], ["w0:1", "w1:1"])
    strategy = AsyncParameterServer(cluster, overlap=True)
    g, train_op = two_ps_model(strategy)
    with g.as_default():
        hooks_read = training_util._get_or_create_global_step_read()
        fetched = [train_op, strategy.loss, strategy.global_step_read, hooks_read]
        names = [t.op.name if hasattr(t, "op") else t.name for t in fetched]
        step = tf.compat.v1.graph_util.extract_sub_graph(g.as_graph_def(), names)
        ps = [n.name for n in step.node if n.device.startswith("/job:ps")]
        transfers = [n.name for n in g.as_graph_def().node if n.device.startswith("/job:ps")]
    assert hooks_read is strategy.global_step_read
    assert transfers  # the variables and their updates are on the PS, only not in the step
    assert ps == [], ps


def test_pieces_leave_the_worker_in_waves_each_after_the_one_two_before_arrived():
    cluster = Cluster.from_hosts("worker", 0, ["p0:1"], ["w0:1"])
    strategy = AsyncParameterServer(cluster, overlap=True, piece_bytes=2048)
    g, _ = two_ps_model(strategy)  # w is 8 KiB: four pieces on the one PS, one wave each
    assert strategy.plan.parts == {"w": (0, 4)}
    with g.as_default():
        applies = [op for op in g.get_operations() if op.type == "ResourceApplyAdam"]
    assert len(applies) == 4
    gated = []
    for apply in applies:
        arriving = apply.inputs[9].op  # the gradient, as it arrives on the PS
        assert arriving.type == "Identity" and arriving.device.startswith("/job:ps/")
        leaving = arriving.inputs[0].op
        if leaving.type == "Identity":  # held on the worker until an earlier wave is on the PS
            assert leaving.device.startswith("/job:worker/")
            gated.append({c.device.split("/")[1] for c in leaving.control_inputs})
    assert gated == [{"job:ps"}, {"job:ps"}]  # waves 2 and 3 wait; waves 0 and 1 leave at once


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "plain"])
def test_a_variable_in_pieces_trains_exactly_as_whole(overlap):
    """In-process PS and worker servers: Adam on 4 pieces gives the same values as on one."""
    hosts = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    spec = tf.train.ClusterSpec({"ps": hosts[:1], "worker": hosts[1:]})
    worker = [tf.distribute.Server(spec, job_name=job, task_index=0) for job in ("ps", "worker")][1]
    cluster = Cluster.from_hosts("worker", 0, hosts[:1], hosts[1:])

    def trained(piece_bytes):
        strategy = AsyncParameterServer(cluster, overlap=overlap, piece_bytes=piece_bytes)
        with tf.Graph().as_default():

            def loss_fn():
                x = tf.constant(np.random.default_rng(0).normal(size=(4, 64)), tf.float32)
                w = v1.get_variable("w", [64, 32], initializer=v1.ones_initializer())
                return tf.reduce_sum(tf.square(tf.matmul(x, w)))

            with strategy.scope():
                train_op = strategy.minimize(v1.train.AdamOptimizer(0.01), loss_fn)
            parts = [v for v in v1.trainable_variables() if v.op.name.split("/")[0] == "w"]
            with v1.Session(worker.target, config=strategy.session_config()) as session:
                session.run(v1.global_variables_initializer())
                session.run(v1.local_variables_initializer())
                for _ in range(3):
                    session.run(train_op)
                    if overlap:
                        session.run(strategy.transfer_op)
                return len(parts), session.run(tf.concat(parts, axis=0))

    (whole_parts, whole), (split_parts, split) = trained(None), trained(2048)
    assert (whole_parts, split_parts) == (1, 4)
    np.testing.assert_array_equal(whole, split)


def test_without_overlap_reads_cross_in_the_order_the_model_asks_for_them():
    cluster = Cluster.from_hosts("worker", 0, ["p0:1"], ["w0:1"])
    strategy = AsyncParameterServer(cluster, piece_bytes=4096)
    with tf.Graph().as_default() as g:

        def loss_fn():
            x = tf.ones([2, 32])
            for i in range(4):  # 4 KiB each: one wave per layer
                x = tf.matmul(x, v1.get_variable(f"layer{i}", [32, 32]))
            return tf.reduce_sum(x)

        with strategy.scope():
            strategy.minimize(v1.train.GradientDescentOptimizer(0.1), loss_fn)
    reads = {  # the step's reads, by variable; each in a name scope of its own
        op.inputs[0].op.name: op
        for op in g.get_operations()
        if op.type == "ReadVariableOp" and op.name.startswith("cached_read")
    }
    variable_of_scope = {read.name.split("/")[0]: name for name, read in reads.items()}
    gates = {
        name: [variable_of_scope[c.name.split("/")[0]] for c in read.control_inputs]
        for name, read in reads.items()
    }
    assert all(read.device.startswith("/job:ps/") for read in reads.values())
    # layer2 crosses once layer0 is on the worker, layer3 once layer1 is; 0 and 1 at once.
    assert gates == {"layer0": [], "layer1": [], "layer2": ["layer0"], "layer3": ["layer1"]}, gates
