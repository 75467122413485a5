"""minimize() takes gradients through the optimizer's own compute_gradients, in every strategy and mode.

A wrapper that overrides compute_gradients (clipping as tf.contrib's
clip_gradients_by_norm did, Horovod's DistributedOptimizer) must be honoured
with towers and overlap as much as without: towers once took their gradients
with tf.gradients directly and dropped it. In one process (towers on virtual
CPUs); tests/cluster/test_optimizer_contract.py runs the same on real clusters
with pieces on the PS.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from disttrain import AsyncParameterServer, Cluster, SyncAllReduce, SyncParameterServer

v1 = tf.compat.v1
LR, CLIP, STEPS = 0.5, 0.05, 3
IDS = [1, 3, 3, 7]


def loss_fn():
    """A dense layer and a table looked up by rows (a sparse gradient), on fixed input."""
    x = tf.constant(np.linspace(-1, 1, 8 * 4, dtype=np.float32).reshape(8, 4))
    w = v1.get_variable("w", [4, 3], initializer=v1.constant_initializer(0.1))
    table = v1.get_variable("table", [10, 3], initializer=v1.constant_initializer(0.2))
    rows = tf.nn.embedding_lookup(table, IDS)
    return tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0)) + tf.reduce_mean(tf.square(rows - 1.0))


def _map_grads(pairs, fn):
    out = []
    for g, v in pairs:
        if isinstance(g, tf.IndexedSlices):
            g = tf.IndexedSlices(fn(g.values), g.indices, g.dense_shape)
        elif g is not None:
            g = fn(g)
        out.append((g, v))
    return out


class ZeroingSGD(v1.train.GradientDescentOptimizer):
    """Every gradient becomes zero: if this optimizer's compute_gradients runs, nothing moves."""

    def compute_gradients(self, *args, **kwargs):
        return _map_grads(super().compute_gradients(*args, **kwargs), tf.zeros_like)


class ClippingSGD(v1.train.GradientDescentOptimizer):
    """Clips the gradients by their global norm, in compute_gradients (the TF1 wrapper way)."""

    def compute_gradients(self, *args, **kwargs):
        pairs = [(g, v) for g, v in super().compute_gradients(*args, **kwargs) if g is not None]
        clipped, _ = tf.clip_by_global_norm([g for g, _ in pairs], CLIP)
        return [(c, v) for c, (_, v) in zip(clipped, pairs, strict=True)]


def train(strategy, optimizer_cls) -> dict[str, np.ndarray]:
    """STEPS steps under `strategy` in one process; the variables' values after them."""
    with tf.Graph().as_default():
        with strategy.scope():
            train_op = strategy.minimize(optimizer_cls(LR), loss_fn)
        overlap = getattr(strategy, "overlap", False)
        with v1.Session(config=strategy.session_config()) as session:
            session.run(v1.global_variables_initializer())
            session.run(v1.local_variables_initializer())
            for _ in range(STEPS):
                session.run(train_op)
                if overlap:
                    session.run(strategy.transfer_op)
            return {v.op.name: session.run(v) for v in v1.global_variables() if v.op.name in ("w", "table")}


def one_process_clipped(
    build_loss=loss_fn, densify: bool = False, steps: int = STEPS
) -> dict[str, np.ndarray]:
    """The reference: plain TF, gradients clipped by hand by their global norm, no strategy.

    densify: the norm of the dense gradient (a row looked up twice counts once), as `clip_norm`
    takes it; otherwise that of the gradients as compute_gradients returns them, as a wrapper sees.
    """
    with tf.Graph().as_default():
        loss = build_loss()
        optimizer = v1.train.GradientDescentOptimizer(LR)
        pairs = [(g, v) for g, v in optimizer.compute_gradients(loss) if g is not None]
        grads = [tf.convert_to_tensor(g) if densify else g for g, _ in pairs]
        clipped, _ = tf.clip_by_global_norm(grads, CLIP)
        train_op = optimizer.apply_gradients(list(zip(clipped, [v for _, v in pairs], strict=True)))
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            for _ in range(steps):
                session.run(train_op)
            return {v.op.name: session.run(v) for v in v1.global_variables()}


MODES = {
    "async": lambda towers: AsyncParameterServer(Cluster.local(), num_towers=towers),
    "async_overlap": lambda towers: AsyncParameterServer(Cluster.local(), num_towers=towers, overlap=True),
    "sync_ps": lambda towers: SyncParameterServer(Cluster.local(), num_towers=towers),
    "allreduce": lambda towers: SyncAllReduce(Cluster.local(), num_towers=towers),
}


@pytest.mark.parametrize("towers", [1, 2])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_zeroing_wrapper_leaves_every_variable_as_it_was(mode, towers):
    values = train(MODES[mode](towers), ZeroingSGD)
    np.testing.assert_array_equal(values["w"], np.full([4, 3], 0.1, np.float32))
    np.testing.assert_array_equal(values["table"], np.full([10, 3], 0.2, np.float32))


@pytest.mark.parametrize("towers", [1, 2])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_clipping_wrapper_gives_one_process_clipped_update(mode, towers):
    reference = one_process_clipped()
    values = train(MODES[mode](towers), ClippingSGD)
    for name in ("w", "table"):
        np.testing.assert_allclose(values[name], reference[name], rtol=1e-5, atol=1e-7)
    assert not np.allclose(reference["w"], 0.1)  # the clipped update is not nothing
