"""The optimizer's compute_gradients is honoured on real clusters: towers, overlap and pieces on a PS.

The same wrappers as tests/unit/test_optimizer_contract.py (a zeroing one,
and one clipping by the global norm), run by `disttrain.fit` in real
processes: PS strategies with variables cut into pieces (`piece_bytes`) on
1 PS, and all-reduce between 2 workers, each with 2 towers. The checkpoint
written at the last step is compared with the initial values (zeroing) or
with one process clipped by hand (clipping; modes whose update is the one
process's: not overlap, whose gradients are up to two updates old).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests import extended_beyond
from tests.cluster.test_own_model import cluster_of, logs, run_all, start_all
from tests.unit.test_optimizer_contract import CLIP, LR, one_process_clipped

pytestmark = pytest.mark.cluster

STEPS = 6
SCRIPT = """
import numpy as np
import tensorflow as tf

import disttrain

v1 = tf.compat.v1


def loss_fn():
    x = tf.constant(np.linspace(-1, 1, 8 * 64, dtype=np.float32).reshape(8, 64))
    w = v1.get_variable("w", [64, 32], initializer=v1.constant_initializer(0.1))
    table = v1.get_variable("table", [40, 32], initializer=v1.constant_initializer(0.2))
    rows = tf.nn.embedding_lookup(table, [1, 3, 3, 7])
    return tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0)) + tf.reduce_mean(tf.square(rows - 1.0))


class Zeroing(v1.train.GradientDescentOptimizer):
    def compute_gradients(self, *args, **kwargs):
        out = []
        for g, v in super().compute_gradients(*args, **kwargs):
            if isinstance(g, tf.IndexedSlices):
                g = tf.IndexedSlices(tf.zeros_like(g.values), g.indices, g.dense_shape)
            elif g is not None:
                g = tf.zeros_like(g)
            out.append((g, v))
        return out


class Clipping(v1.train.GradientDescentOptimizer):
    def compute_gradients(self, *args, **kwargs):
        pairs = [(g, v) for g, v in super().compute_gradients(*args, **kwargs) if g is not None]
        clipped, _ = tf.clip_by_global_norm([g for g, _ in pairs], {clip})
        return [(c, v) for c, (_, v) in zip(clipped, pairs)]


disttrain.fit(
    loss_fn,
    lambda: {optimizer}({lr}),
    steps={steps},
    logdir="{logdir}",
    strategy=lambda cluster: {strategy},
    log_every_steps=2,
    save_checkpoint_steps=1000,
)
"""
# 2 KiB pieces: w (8 KiB) and the table (5 KiB) each cross in several.
MODES = {
    "async_overlap_pieces": (
        "disttrain.AsyncParameterServer(cluster, num_towers=2, overlap=True, piece_bytes=2048)"
    ),
    "async_pieces": "disttrain.AsyncParameterServer(cluster, num_towers=2, piece_bytes=2048)",
    "sync_pieces": "disttrain.SyncParameterServer(cluster, num_towers=2, piece_bytes=2048)",
    "allreduce": "disttrain.SyncAllReduce(cluster, num_towers=2)",
}


def run(tmp_path, mode: str, optimizer: str) -> dict[str, np.ndarray]:
    path = tmp_path / "model.py"
    logdir = tmp_path / "logdir"
    path.write_text(
        SCRIPT.format(clip=CLIP, optimizer=optimizer, lr=LR, steps=STEPS, logdir=logdir, strategy=MODES[mode])
    )
    cluster = cluster_of("allreduce" if mode == "allreduce" else "async")
    procs = start_all(str(path), tmp_path, cluster)
    codes = run_all(procs, tmp_path)
    assert set(codes.values()) == {0}, (codes, logs(tmp_path))
    reader = tf.train.load_checkpoint(str(logdir))
    # Split variables are saved whole under their own name.
    return {name: reader.get_tensor(name) for name in ("w", "table")}


def model_loss():
    """SCRIPT's loss_fn, in this process."""
    v1 = tf.compat.v1
    x = tf.constant(np.linspace(-1, 1, 8 * 64, dtype=np.float32).reshape(8, 64))
    w = v1.get_variable("w", [64, 32], initializer=v1.constant_initializer(0.1))
    table = v1.get_variable("table", [40, 32], initializer=v1.constant_initializer(0.2))
    rows = tf.nn.embedding_lookup(table, [1, 3, 3, 7])
    return tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0)) + tf.reduce_mean(tf.square(rows - 1.0))


# CI: each wrapper under a PS strategy and under all-reduce; the rest in the extended tier (CI's time).
@pytest.mark.parametrize("mode", extended_beyond(MODES, {"sync_pieces", "allreduce"}))
def test_a_zeroing_wrapper_leaves_every_variable_as_it_was(tmp_path, mode):
    values = run(tmp_path, mode, "Zeroing")
    np.testing.assert_array_equal(values["w"], np.full([64, 32], 0.1, np.float32))
    np.testing.assert_array_equal(values["table"], np.full([40, 32], 0.2, np.float32))


@pytest.mark.parametrize(
    "mode", extended_beyond(["async_pieces", "sync_pieces", "allreduce"], {"async_pieces", "allreduce"})
)
def test_a_clipping_wrapper_gives_one_process_clipped_update(tmp_path, mode):
    reference = one_process_clipped(model_loss, steps=STEPS)
    values = run(tmp_path, mode, "Clipping")
    for name in ("w", "table"):
        np.testing.assert_allclose(values[name], reference[name], rtol=1e-5, atol=1e-6)
