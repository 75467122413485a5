"""Embedding tables on real clusters: sync PS equals one process on the tiny DLRM; a Keras table.

The DLRM run is a LocalCluster of bin/train.py processes on loopback, on the
shipped experiment file shrunk by the tiny overlay. The tiny DLRM's training
under every strategy (async with overlap on 2 PS, sync PS on 2 PS,
all-reduce exchanging its tables as rows) is a row of
tests/cluster/test_zoo_matrix.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from disttrain.edges.local import free_port, task_env
from disttrain.launch import read_results
from model_zoo.dlrm import DLRM
from tests.cluster.helpers import TINY, run_timed, train_py, variables

pytestmark = pytest.mark.cluster

v1 = tf.compat.v1

SYNC = "gin/dlrm_sync.gin"
START, STEPS, BATCH = 3, 8, 16
EQUIVALENCE = [
    "TrainConfig.optimizer = @SGD",
    "SGD.learning_rate = 0.5",
    "criteo_synthetic_input.split_cluster_batch = True",
    f"TrainConfig.train_steps = {START + STEPS}",
    "TrainConfig.save_checkpoint_steps = 1000",
    "TrainConfig.log_every_steps = 4",
]


def initial_checkpoint(logdir: str, seed: int = 11) -> None:
    """The tiny DLRM at step START from a fixed seed: the common start of every run."""
    os.makedirs(logdir, exist_ok=True)
    with tf.Graph().as_default():
        v1.set_random_seed(seed)
        DLRM(vocab_sizes=(100, 50, 20), embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(16,)).build_variables()
        step = v1.train.get_or_create_global_step()
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            session.run(step.assign(START))
            v1.train.Saver().save(session, os.path.join(logdir, "model.ckpt"), global_step=START)


def test_sync_ps_with_tables_equals_one_process_with_the_summed_batch(tmp_path):
    """Sparse accumulation on the PS: the mean of the two replicas' row gradients, as one process."""
    reference = tmp_path / "one_process"
    initial_checkpoint(str(reference))
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    args = [f"--logdir={reference}", f"--gin_file={SYNC}", f"--gin_file={TINY}"]
    params = [*EQUIVALENCE, f"TrainConfig.batch_size = {2 * BATCH}"]
    r = train_py(args + [f"--gin_param={p}" for p in params], env=env, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    initial_checkpoint(str(tmp_path))
    params = [*EQUIVALENCE, f"TrainConfig.batch_size = {BATCH}"]
    cluster, _ = run_timed(tmp_path, [SYNC, TINY], num_ps=2, num_workers=2, gin_params=params)
    assert "in embedding tables" in open(cluster.chief_task.log_path).read()  # the placement report
    got, want = variables(cluster.logdir), variables(str(reference))
    assert set(got) == set(want)
    assert int(got["global_step"]) == int(want["global_step"]) == START + STEPS
    tables = [name for name in want if name.endswith("/table")]
    assert len(tables) == 3
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    for name in tables:  # and training moved the rows it looked up (the comparison is not vacuous)
        start = tf.train.load_checkpoint(os.path.join(tmp_path, f"model.ckpt-{START}")).get_tensor(name)
        assert not np.allclose(start, want[name])


KERAS_TABLE = """
import sys

import keras
import tensorflow as tf

import disttrain

table = keras.layers.Embedding(50_000, 16, embeddings_initializer="zeros")  # 3.2 MB


def loss_fn():
    ids = tf.random.uniform([32, 4], maxval=100, dtype=tf.int64)  # ids repeat within and across steps
    prediction = tf.reduce_sum(table(ids), axis=[1, 2])
    return tf.reduce_mean(tf.square(prediction - 1.0))  # 1.0 at the start


disttrain.fit(
    loss_fn,
    lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    strategy=disttrain.AsyncParameterServer,
    steps=30,
    logdir=sys.argv[1],
    batch_size=32,
)
"""


def test_a_keras_embedding_trains_on_a_ps_and_is_looked_up_there(tmp_path):
    """Keras 3 gathers from a read of its whole table; disttrain moves the gather onto the table."""
    script, logdir = tmp_path / "keras_table.py", tmp_path / "logdir"
    script.write_text(KERAS_TABLE)
    cluster = {job: [f"127.0.0.1:{free_port()}"] for job in ("ps", "worker")}
    procs = {}
    for job in cluster:
        env = task_env({k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": 0}})
        log = open(tmp_path / f"{job}.log", "w")
        procs[job] = subprocess.Popen(
            [sys.executable, str(script), str(logdir)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        codes = {job: p.wait(timeout=150) for job, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    text = "\n".join(f"--- {job}\n{(tmp_path / f'{job}.log').read_text()[-3000:]}" for job in procs)
    assert codes == {"ps": 0, "worker": 0}, text
    # The placement report counts the table as one: the graph reads it by rows (a ResourceGather).
    assert "in embedding tables" in text, text
    (result,) = read_results(str(logdir)).values()
    assert result["global_step"] == 30 and result["final_loss"] < 0.5, result
