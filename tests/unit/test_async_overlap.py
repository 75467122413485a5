"""AsyncParameterServer(overlap=True): worker-side copies, gradients pushed one step later."""

import numpy as np
import pytest
import tensorflow as tf

from disttrain import AsyncParameterServer, Cluster
from disttrain.errors import ConfigError

v1 = tf.compat.v1


def quadratic_run(strategy, steps, lr=0.5, target=1.0):
    """Train w on 0.5 * (w - target)^2 from w = 0; return w after `steps` train ops and the end hooks."""
    with tf.Graph().as_default():
        with strategy.scope():

            def loss_fn():
                w = v1.get_variable("w", [], initializer=v1.zeros_initializer())
                return 0.5 * tf.square(w - target)

            train_op = strategy.minimize(v1.train.GradientDescentOptimizer(lr), loss_fn)
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            session.run(v1.local_variables_initializer())  # copies start from the PS values
            for _ in range(steps):
                session.run(train_op)
            for hook in strategy.hooks():
                hook.end(session)  # what MonitoredSession does when training ends
            return session.run(v1.global_variables("w")[0])


def simulate(steps, lr=0.5, target=1.0, flush=True):
    """The overlap schedule: step k computes from the copy pulled after pushing step k-2's gradient."""
    w, copy, parked = 0.0, 0.0, 0.0
    for _ in range(steps):
        grad = copy - target
        w -= lr * parked  # push the parked gradient
        copy = w  # pull
        parked = grad
    if flush:
        w -= lr * parked
    return w


def test_overlap_pushes_each_gradient_one_step_late_and_flushes_at_the_end():
    w = quadratic_run(AsyncParameterServer(Cluster.local(), overlap=True), steps=5)
    assert w == pytest.approx(simulate(5))  # 5 steps + the flush of the last gradient
    assert simulate(5) != pytest.approx(simulate(5, flush=False))
    plain = quadratic_run(AsyncParameterServer(Cluster.local()), steps=5)
    assert plain == pytest.approx(1 - 0.5**5)  # plain SGD, for contrast
    assert w != pytest.approx(plain)


def test_bfloat16_transfer_rounds_only_the_wire():
    w = quadratic_run(AsyncParameterServer(Cluster.local(), overlap=True, transfer_dtype="bfloat16"), steps=6)
    assert w == pytest.approx(simulate(6), rel=1e-2)


def test_copies_live_on_the_worker_and_casts_on_the_ps():
    cluster = Cluster.from_hosts("worker", 1, ["p0:1", "p1:1"], ["w0:1", "w1:1"])
    strategy = AsyncParameterServer(cluster, overlap=True, transfer_dtype="bfloat16")
    with tf.Graph().as_default() as g:
        strategy.plan_placement(lambda: v1.get_variable("w", [64, 32]))
        with strategy.scope():
            x = tf.ones([4, 64])

            def loss_fn():
                return tf.reduce_sum(tf.matmul(x, v1.get_variable("w", [64, 32])))

            strategy.minimize(v1.train.AdamOptimizer(0.1), loss_fn)
        local = {v.op.name: v.op.device for v in v1.local_variables()}
        global_names = {v.op.name for v in v1.global_variables()}
    worker = "/job:worker/task:1/device:CPU:0"
    assert local and all(d == worker for d in local.values()), local
    assert not set(local) & global_names  # never checkpointed
    casts = [op for op in g.get_operations() if op.type == "Cast"]
    to_wire = [op for op in casts if op.get_attr("DstT") == tf.bfloat16]
    assert any(op.device.startswith("/job:ps/") for op in to_wire)  # pulled values leave the PS as bfloat16
    assert any(op.device == worker for op in to_wire)  # gradients leave the worker as bfloat16
    applies = [op for op in g.get_operations() if op.type.startswith("ResourceApply")]
    assert applies and all(op.device.startswith("/job:ps/") for op in applies)


def test_transfer_dtype_needs_overlap():
    with pytest.raises(ConfigError, match="needs overlap=True"):
        AsyncParameterServer(Cluster.local(), transfer_dtype="bfloat16")
    with pytest.raises(ConfigError, match="expected None, 'float16' or 'bfloat16'"):
        AsyncParameterServer(Cluster.local(), overlap=True, transfer_dtype="int8")


def test_simulation_is_the_schedule_we_claim():
    # step 1 pushes nothing; steps 2, 3, 4 push g1 = -1, g2 = -1, g3 = -0.5; the flush pushes g4 = 0.
    assert simulate(4) == pytest.approx(1.25)
    assert np.isclose(simulate(4, flush=False), 1.25)
    assert simulate(5) == pytest.approx(
        1.125
    )  # step 5 computes g5 = 0.25 from w = 1.25; the flush applies it
