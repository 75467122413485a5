"""Models the strategies did not build themselves, on built graphs: planned from loss_fn, Keras placed whole.

A get_variable model needs no `plan_placement` call: `minimize` plans from
the loss function (large variables split). Keras 3 layers cannot be built in
a scratch graph, so their variables are placed whole after the build,
largest first, with their slots, reads and updates, and their state updates
(batch norm statistics) run with every step.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from disttrain.base.cluster import Cluster
from disttrain.base.errors import ConfigError
from disttrain.graph import placement
from disttrain.strategies import AsyncParameterServer, SyncParameterServer

v1 = tf.compat.v1


def ps_cluster(num_ps=2):
    return Cluster.from_hosts("worker", 0, [f"p{i}:1" for i in range(num_ps)], ["w0:1"])


def variable_devices(graph):
    return {op.name: op.device for op in graph.get_operations() if op.type == "VarHandleOp"}


def task_of(device):
    return tf.DeviceSpec.from_string(device).task


def ps_loads_of_trainables(graph, num_ps):
    return placement.ps_loads(graph, num_ps, include_slots=False)


def test_get_variable_model_is_planned_from_its_loss_fn_and_split():
    strategy = AsyncParameterServer(ps_cluster(2))
    with tf.Graph().as_default() as graph:
        with strategy.scope():

            def loss_fn():
                x = tf.random.uniform([4, 64])
                big = v1.get_variable("big", [64, 1000])  # 94% of the bytes: must be split to balance
                small = v1.get_variable("small", [1000, 4])
                return tf.reduce_mean(tf.matmul(tf.matmul(x, big), small))

            strategy.minimize(v1.train.GradientDescentOptimizer(0.1), loss_fn)
    assert strategy.plan is not None and "big" in strategy.plan.parts
    loads = ps_loads_of_trainables(graph, 2)
    assert placement.max_over_mean(loads) < 1.06, loads
    assert all(d.startswith("/job:ps/") for d in variable_devices(graph).values())


def keras_model():
    return keras.Sequential(
        [
            keras.layers.Dense(512, activation="relu"),  # 64 x 512: the largest
            keras.layers.BatchNormalization(),
            keras.layers.Dense(256, activation="relu"),  # 512 x 256
            keras.layers.Dense(4),
        ]
    )


def build_keras(strategy, model):
    with strategy.scope():

        def loss_fn():
            x = tf.random.stateless_normal([16, 64], seed=[1, 2])
            y = tf.random.stateless_normal([16, 4], seed=[3, 4])
            return tf.reduce_mean(tf.square(model(x, training=True) - y))

        return strategy.minimize(v1.train.AdamOptimizer(0.01), loss_fn)


def test_keras_variables_are_placed_whole_largest_first_with_their_slots_and_reads():
    strategy = SyncParameterServer(ps_cluster(2))
    model = keras_model()
    with tf.Graph().as_default() as graph:
        build_keras(strategy, model)
    assert strategy.plan is None  # Keras cannot be replayed in a scratch graph
    devices = variable_devices(graph)
    assert all(d.startswith("/job:ps/") for d in devices.values()), devices
    kernels = sorted((w for w in model.weights if "kernel" in w.path), key=lambda w: -np.prod(w.shape))
    tasks = [task_of(devices[w.value.op.name]) for w in kernels[:2]]
    assert tasks[0] != tasks[1], tasks  # the two largest on different PS
    # Whatever touches a variable's handle sits with it (reads, Adam's updates, slots), or names no
    # task at all, which TF's placer resolves to the handle's device.
    for op in graph.get_operations():
        for t in op.inputs:
            if t.op.type == "VarHandleOp" and op.device:
                assert task_of(op.device) == task_of(t.op.device), (op.name, op.device, t.op.device)
    assert [u.name for u in strategy.placed_whole] == [kernels[0].value.op.name]  # 32K of 43K floats


def test_keras_batch_norm_statistics_move_with_training():
    strategy = AsyncParameterServer(Cluster.local())
    model = keras_model()
    with tf.Graph().as_default():
        train_op = build_keras(strategy, model)
        moving_mean = next(w for w in model.weights if "moving_mean" in w.path)
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            for _ in range(5):
                session.run(train_op)
            value = session.run(moving_mean.value)
    assert np.abs(value).max() > 1e-3, value  # Keras 3 alone would leave it exactly 0 in a v1 graph


def test_keras_variables_get_gradients_with_towers_and_with_overlap():
    """Keras variables have no worker-side copy, but they must still train in both modes."""
    for strategy in (
        AsyncParameterServer(ps_cluster(2), overlap=True),
        SyncParameterServer(ps_cluster(2), num_towers=2),
    ):
        model = keras_model()
        with tf.Graph().as_default() as graph:
            build_keras(strategy, model)
        variables = variable_devices(graph)
        for weight in model.trainable_weights:
            # Adam makes its slots only for the variables it is given a gradient for.
            assert f"{weight.value.op.name}/Adam" in variables, (type(strategy).__name__, weight.path)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden, self.out = keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)

    def call(self, x, training=False):
        return self.out(self.hidden(x))


def test_a_subclassed_keras_model_trains_once_built_and_is_refused_in_one_line_before():
    """Keras builds a subclassed model while it traces its first call, and keeps going when the
    planning replay stops it: first called in the loss function, it holds the replay's variables."""
    with tf.Graph().as_default():
        refused = r"no trainable variable .* calling it once on a batch"
        with pytest.raises(ConfigError, match=refused) as error:
            build_keras(AsyncParameterServer(ps_cluster(2)), Subclassed())
    assert "\n" not in str(error.value)
    with tf.Graph().as_default() as graph:
        model = Subclassed()
        model(tf.zeros([1, 64]))
        build_keras(AsyncParameterServer(ps_cluster(2)), model)
    variables = variable_devices(graph)
    assert len(model.trainable_weights) == 4
    for weight in model.trainable_weights:
        assert weight.value.graph is graph and f"{weight.value.op.name}/Adam" in variables, weight.path


@pytest.mark.parametrize("accumulate, towers", [(2, 1), (1, 2)], ids=["micro_batches", "towers"])
def test_a_keras_model_built_in_the_loss_function_takes_no_tower_in_its_variable_names(accumulate, towers):
    """Keras names its variables by the name scope: built inside a tower's, the checkpoint's names would
    differ from what one tower's build, an evaluator or an export make (`tower_0/dense/kernel`)."""
    model = keras_model()  # built at its first call, inside the loss function
    with tf.Graph().as_default():
        strategy = AsyncParameterServer(ps_cluster(2), num_towers=towers)
        with strategy.scope():

            def loss_fn():
                x = tf.random.stateless_normal([16, 64], seed=[1, 2])
                return tf.reduce_mean(tf.square(model(x, training=True)))

            strategy.minimize(v1.train.AdamOptimizer(0.01), loss_fn, accumulate_steps=accumulate)
    names = [w.value.op.name for w in model.weights]
    assert len(names) == 10 and not [n for n in names if n.startswith("tower_")], names
