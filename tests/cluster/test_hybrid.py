"""SyncHybrid on real clusters: one process's training with N times the batch, tables and dense layers alike.

A small recommendation model (two embedding tables read by id, a dense
tower) with seeded initial values trains with Adam (whose step powers the
two halves must each keep once) in one process at 2 x BATCH, and under
SyncHybrid on 2 PS + 2 workers at BATCH, each replica reading its half of
every window of rows (as tests/cluster/test_correctness.py does). The
larger table lives on the PS tasks; the smaller (640 bytes, under the run's
`densify_below_bytes`) stays on the workers and is summed densely over the
ring with the dense weights. The tables, the dense weights and their Adam
slots must agree. The hybrid's checkpoint then restores on 1 PS and in one
process, which train on. Every run caps a replica's memory
(`replica_memory_bytes`) below what all-reduce would hold, which is refused
at start.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from disttrain.base.errors import EXIT_CONFIG
from disttrain.edges.local import free_port
from tests.cluster.test_correctness import SYNC_ATOL, SYNC_RTOL
from tests.cluster.test_own_model import logs, run_all, start, start_all

pytestmark = pytest.mark.cluster

STEPS, BATCH = 60, 8

SCRIPT = """
import functools

import disttrain

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
BATCH = {batch}
ROWS, VOCAB_A, VOCAB_B, DIM = 512, 300, 40, 4


def data():
    rng = np.random.RandomState(0)
    ids = np.stack([rng.randint(0, VOCAB_A, ROWS), rng.randint(0, VOCAB_B, ROWS)], 1).astype(np.int64)
    x = rng.randn(ROWS, 6).astype(np.float32)
    y = (rng.rand(ROWS) < 0.5).astype(np.float32)
    return ids, x, y


def initial():
    rng = np.random.RandomState(1)
    return {{
        "emb_a": (rng.randn(VOCAB_A, DIM) * 0.1).astype(np.float32),
        "emb_b": (rng.randn(VOCAB_B, DIM) * 0.1).astype(np.float32),
        "w1": (rng.randn(2 * DIM + 6, 16) * 0.3).astype(np.float32),
        "b1": np.zeros(16, np.float32),
        "w2": (rng.randn(16, 1) * 0.3).astype(np.float32),
        "b2": np.zeros(1, np.float32),
    }}


IDS, X, Y = data()


def loss_fn(ctx):
    begin, window = ctx.input_pipeline_id * BATCH, ctx.num_input_pipelines * BATCH
    rows = tf.data.Dataset.from_tensor_slices((IDS, X, Y)).repeat().batch(window)
    ids, x, y = ctx.get_next(rows.map(lambda i, f, l: (i[begin:begin + BATCH], f[begin:begin + BATCH],
                                                       l[begin:begin + BATCH])))
    w = {{n: v1.get_variable(n, initializer=tf.constant(v)) for n, v in initial().items()}}
    h = tf.concat([tf.nn.embedding_lookup(w["emb_a"], ids[:, 0]),
                   tf.nn.embedding_lookup(w["emb_b"], ids[:, 1]), x], axis=1)
    h = tf.nn.relu(tf.matmul(h, w["w1"]) + w["b1"])
    logits = tf.squeeze(tf.matmul(h, w["w2"]) + w["b2"], 1)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))


disttrain.fit(
    loss_fn,
    lambda: v1.train.AdamOptimizer(0.01),
    steps={steps},
    logdir="{logdir}",
    strategy={strategy},
    batch_size=BATCH,
    log_every_steps=20,
    save_checkpoint_steps=100000,
    replica_memory_bytes={cap},
)
"""
# A replica's own variables with Adam's slots: about 5 KB under the hybrid (the dense half and the
# 40 x 4 table), 19 KB under all-reduce (the 300 x 4 table too): this cap admits the one and not the other.
CAP = 8000
# The 300 x 4 table (4,800 bytes) on the PS, the 40 x 4 (640 bytes) with the dense half.
HYBRID = "functools.partial(disttrain.SyncHybrid, densify_below_bytes=1000)"


def run(tmp_path, name, logdir, num_ps, num_workers, batch, steps, strategy=HYBRID):
    """Run the script as every task of the cluster (or alone); every task's exit code and its logs.

    Replicas of a cluster run under CAP; one process alone holds everything, with no cap.
    """
    directory = tmp_path / name
    directory.mkdir()
    path = directory / "hybrid_model.py"
    cap = CAP if num_workers else None
    path.write_text(SCRIPT.format(batch=batch, steps=steps, logdir=logdir, strategy=strategy, cap=cap))
    if num_workers == 0:
        return run_all({"local": start(str(path), directory, None, "local", 0)}, directory), logs(directory)
    cluster = {
        "ps": [f"127.0.0.1:{free_port()}" for _ in range(num_ps)],
        "worker": [f"127.0.0.1:{free_port()}" for _ in range(num_workers)],
    }
    return run_all(start_all(str(path), directory, cluster), directory), logs(directory)


def trains(tmp_path, name, logdir, num_ps, num_workers, batch, steps) -> None:
    codes, text = run(tmp_path, name, logdir, num_ps, num_workers, batch, steps)
    assert set(codes.values()) == {0}, (codes, text)
    assert f"to global step {steps}" in text, text


def weights(logdir) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(logdir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One process at 2 x BATCH, and the hybrid on 2 PS + 2 workers at BATCH: their checkpoints."""
    tmp = tmp_path_factory.mktemp("hybrid")
    trains(tmp, "one", tmp / "one_logdir", 0, 0, 2 * BATCH, STEPS)
    trains(tmp, "hybrid", tmp / "hybrid_logdir", 2, 2, BATCH, STEPS)
    return tmp


def test_hybrid_trains_as_one_process_with_n_times_the_batch(trained):
    one, hybrid = weights(trained / "one_logdir"), weights(trained / "hybrid_logdir")
    for name in ("emb_a", "emb_b", "w1", "b1", "w2", "b2", "emb_a/Adam", "emb_b/Adam_1", "w1/Adam"):
        np.testing.assert_allclose(hybrid[name], one[name], rtol=SYNC_RTOL, atol=SYNC_ATOL, err_msg=name)
    assert hybrid["global_step"] == one["global_step"] == STEPS
    assert hybrid["hybrid_table_step"] == STEPS  # one update of the tables per synchronous step
    # Both halves' Adam powers advanced once a step (two updates through one would square them).
    np.testing.assert_allclose(hybrid["beta1_power"], hybrid["beta1_power_1"], rtol=1e-6)
    np.testing.assert_allclose(hybrid["beta1_power"], one["beta1_power"], rtol=1e-6)


def test_the_hybrids_checkpoint_trains_on_with_one_ps_and_in_one_process(trained):
    logdir = trained / "hybrid_logdir"
    trains(trained, "one_ps", logdir, 1, 2, BATCH, STEPS + 10)
    trains(trained, "alone", logdir, 0, 0, 2 * BATCH, STEPS + 20)
    assert weights(logdir)["global_step"] == STEPS + 20


def test_all_reduce_is_refused_at_start_where_the_hybrid_fits_the_replicas_memory(trained):
    """The hybrid above trained under CAP; all-reduce, which holds every table on every replica, may not."""
    ring = "disttrain.SyncAllReduce"
    codes, text = run(trained, "ring", trained / "ring_logdir", 0, 2, BATCH, STEPS, strategy=ring)
    assert codes == {"worker_0": EXIT_CONFIG, "worker_1": EXIT_CONFIG}, (codes, text)
    errors = [line for line in text.splitlines() if line.startswith("disttrain: error:")]
    assert len(errors) == 2 and all(f"over replica_memory_bytes={CAP}" in e for e in errors), errors
    assert all("emb_a" in e and "SyncHybrid" in e for e in errors), errors
