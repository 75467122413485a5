"""Resized clusters: a checkpoint written on any PS count restores on any other and in one process.

Each model trains a few steps on 2 PS, then goes on from that log directory
on 3 PS, then (after an all-reduce leg for the MLP) on 1 PS, then in one
process (no TF_CONFIG), each leg under another strategy. What a leg started
from is observed, not assumed: the chief saves the state it restored before
its first step (TF's saver hook, at session creation) under the same step,
so `model.ckpt-N` is rewritten by the new layout (its meta graph shows the
new PS count and parts) and must equal, exactly and whole, what the old
layout saved at N. A leg that restored nothing would start at step 0 and
never rewrite it. The legs after the first train on with one replica (or in
lockstep), so nothing can update the variables before that save.

Variables are split at these tiny sizes: the MLP's by `piece_bytes` (4 KiB
pieces on 2 PS and on 1 PS, 6 KiB on 3 PS, so that parts straddle parts);
the DLRM's tables by rows over every PS (vocabularies of 300 and 200 rows
reach the 64 rows per PS that spreading needs). The Keras model's variables
are placed whole (they cannot be split), so only their PS changes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from disttrain.edges.local import free_port, task_env
from model_zoo.dlrm import DLRM
from tests.cluster.helpers import TINY, describe_failure, run_timed, train_py, variables

pytestmark = pytest.mark.cluster

v1 = tf.compat.v1

STEPS = 3  # each leg trains this many more steps
PIECES = "AsyncParameterServer.piece_bytes = 4096"
DLRM_VOCABS = (300, 200, 20)


def checkpoint(logdir, step: int) -> str:
    return os.path.join(str(logdir), f"model.ckpt-{step}")


def layout(prefix: str) -> dict[str, str]:
    """Variable op -> device in the graph that wrote the checkpoint `prefix` (its .meta)."""
    meta = v1.MetaGraphDef()
    with open(prefix + ".meta", "rb") as f:
        meta.ParseFromString(f.read())
    return {n.name: n.device for n in meta.graph_def.node if n.op in ("VarHandleOp", "VariableV2")}


def ps_tasks(devices: dict[str, str]) -> set[int]:
    specs = [tf.DeviceSpec.from_string(d) for d in devices.values()]
    return {s.task for s in specs if s.job == "ps"}


def parts(devices: dict[str, str]) -> dict[str, int]:
    """Split variable -> number of parts (its optimizer slots not counted)."""
    found: dict[str, int] = {}
    for name in devices:
        match = re.fullmatch(r"(.+)/part_(\d+)", name)
        if match:
            found[match[1]] = found.get(match[1], 0) + 1
    return found


def assert_started_from(logdir, saved: dict[str, np.ndarray], step: int, num_ps: int) -> dict[str, str]:
    """The leg just run on `num_ps` PS (0: none) restored exactly `saved`, the checkpoint at `step`.

    Returns the leg's layout (variable op -> device).
    """
    prefix = checkpoint(logdir, step)
    devices = layout(prefix)  # rewritten at the leg's start: the new layout's graph
    if num_ps:
        assert ps_tasks(devices) == set(range(num_ps)), sorted(set(devices.values()))
    else:
        assert not ps_tasks(devices), sorted(set(devices.values()))
    restored = variables(prefix)
    assert sorted(restored) == sorted(saved)
    for name, value in saved.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=f"{name} at step {step}")
    return devices


def assert_trained_on(logdir, saved: dict[str, np.ndarray], step: int) -> tuple[dict[str, np.ndarray], int]:
    """The leg went on to `step` from `saved` and moved the variables.

    Or up to two past it: with async overlap, one worker's stop check reads a
    global step that does not yet count the gradient in its queue (capacity
    one) nor the one in flight, and both are applied before it leaves.
    Returns its last checkpoint's values and step.
    """
    now = variables(str(logdir))
    last = int(now["global_step"])
    assert step <= last <= step + 2, last
    assert tf.train.latest_checkpoint(str(logdir)) == checkpoint(logdir, last)
    moved = [n for n in saved if n != "global_step" and not np.array_equal(now[n], saved[n])]
    assert moved, "training moved nothing: the comparison above proves nothing"
    return now, last


def one_process(logdir, gin_files, params, timeout=120) -> None:
    """bin/train.py with no TF_CONFIG: one process, no PS."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    args = [f"--logdir={logdir}", *(f"--gin_file={f}" for f in gin_files)]
    r = train_py(args + [f"--gin_param={p}" for p in params], env=env, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def leg(logdir, gin_files, num_ps, num_workers, step, params=(), **kwargs):
    """One leg on a LocalCluster (num_ps 0: all-reduce), trained to `step`."""
    return run_timed(
        logdir,
        gin_files,
        num_ps=num_ps,
        num_workers=num_workers,
        gin_params=[f"TrainConfig.train_steps = {step}", *params],
        **kwargs,
    )


def test_zoo_mlp_split_across_ps_resizes_2_3_allreduce_1_and_one_process(tmp_path):
    logdir = tmp_path / "logdir"
    zoo = lambda name: [f"gin/mlp_{name}.gin", TINY]  # noqa: E731
    # 2 PS, async, 2 workers, 4 KiB pieces.
    leg(logdir, zoo("async"), 2, 2, STEPS, [PIECES])
    saved = variables(str(logdir))
    step = int(saved["global_step"])  # async with 2 workers may pass STEPS by one
    two = layout(checkpoint(logdir, step))
    assert ps_tasks(two) == {0, 1} and max(parts(two).values()) >= 4, parts(two)

    # 3 PS, sync, 2 workers, 6 KiB pieces: parts that straddle the 2-PS ones (fc2 in 3, not 8).
    leg(logdir, zoo("sync"), 3, 2, step + STEPS, ["SyncParameterServer.piece_bytes = 6144"])
    three = assert_started_from(logdir, saved, step, 3)
    assert parts(three) and parts(three) != parts(two), (parts(two), parts(three))
    saved, step = assert_trained_on(logdir, saved, step + STEPS)

    # All-reduce, no PS, 2 workers: every variable whole on each worker.
    leg(logdir, zoo("allreduce"), 0, 2, step + STEPS)
    assert not parts(assert_started_from(logdir, saved, step, 0))
    saved, step = assert_trained_on(logdir, saved, step + STEPS)

    # 1 PS, async, 1 worker: split into pieces on the one PS, back from all-reduce.
    leg(logdir, zoo("async"), 1, 1, step + STEPS, [PIECES])
    assert parts(assert_started_from(logdir, saved, step, 1))
    saved, step = assert_trained_on(logdir, saved, step + STEPS)

    # One process, no TF_CONFIG.
    one_process(logdir, zoo("async"), [f"TrainConfig.train_steps = {step + STEPS}"])
    assert not parts(assert_started_from(logdir, saved, step, 0))
    assert_trained_on(logdir, saved, step + STEPS)


def test_dlrm_tables_split_by_rows_resize_and_row_i_stays_id_i(tmp_path):
    logdir = tmp_path / "logdir"
    # Adagrad in every leg (dlrm_sync.gin's recipe is SGD): the same slots to restore in each.
    vocabs = [f"dlrm.vocab_sizes = {DLRM_VOCABS}", "TrainConfig.optimizer = @Adagrad"]
    dlrm = lambda name: [f"gin/dlrm_{name}.gin", TINY]  # noqa: E731
    # 2 PS, async with overlap (tables gathered on their PS), 2 workers.
    leg(logdir, dlrm("async"), 2, 2, STEPS, vocabs)
    saved = variables(str(logdir))
    step = int(saved["global_step"])  # async with 2 workers may pass STEPS by one
    tables = sorted(n for n in saved if n.endswith("/table"))
    assert len(tables) == 3, sorted(saved)
    spread = sorted(n for n in tables if saved[n].shape[0] >= 64 * 3)  # the 300- and 200-row tables
    # The latest file, not one named by the saved step: overlap may move the step during the save.
    two = parts(layout(tf.train.latest_checkpoint(str(logdir))))
    assert len(spread) == 2 and {n: two.get(n) for n in spread} == dict.fromkeys(spread, 2), two

    # 3 PS, sync, 1 worker: those tables in 3 parts by rows, a share on each PS.
    leg(logdir, dlrm("sync"), 3, 1, step + STEPS, vocabs)
    three = parts(assert_started_from(logdir, saved, step, 3))  # whole tables equal: row i is row i
    assert {n: three.get(n) for n in spread} == dict.fromkeys(spread, 3), three
    saved, step = assert_trained_on(logdir, saved, step + STEPS)
    after_three, three_step = saved, step

    # 1 PS, async, 1 worker, and an evaluator (one graph, tables whole) reading the same checkpoints.
    cluster, _ = leg(logdir, dlrm("async"), 1, 1, step + STEPS, vocabs, evaluator=True)
    assert not parts(assert_started_from(logdir, saved, step, 1))
    saved, step = assert_trained_on(logdir, saved, step + STEPS)
    evaluated = re.findall(r"evaluator: step (\d+)  eval", open(cluster.tasks[-1].log_path).read())
    assert evaluated and int(evaluated[-1]) == step, describe_failure(cluster)

    # One process, no TF_CONFIG.
    one_process(logdir, dlrm("sync"), [f"TrainConfig.train_steps = {step + STEPS}", *vocabs])
    assert_started_from(logdir, saved, step, 0)
    assert_trained_on(logdir, saved, step + STEPS)

    # What an export builds: the model alone in one graph, tables whole, restored from the
    # checkpoint the 3-PS layout wrote (its 300-row table in 3 parts): row i of each table is row i.
    with tf.Graph().as_default():
        DLRM(vocab_sizes=DLRM_VOCABS, embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(16,)).build_variables()
        model = {v.op.name: v for v in v1.global_variables()}
        with v1.Session() as session:
            v1.train.Saver(list(model.values())).restore(session, checkpoint(logdir, three_step))
            values = session.run(model)
    assert set(tables) <= set(values)
    for name, value in values.items():
        np.testing.assert_array_equal(value, after_three[name], err_msg=name)


KERAS_MODEL = """
import sys

import keras
import tensorflow as tf

import disttrain

logdir, steps, strategy = sys.argv[1], int(sys.argv[2]), getattr(disttrain, sys.argv[3])
model = keras.Sequential(
    [
        keras.layers.Embedding(300, 8),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(1),
    ]
)


def loss_fn():
    ids = tf.random.uniform([16, 4], maxval=300, dtype=tf.int64)
    target = tf.cast(tf.reduce_sum(ids, axis=1, keepdims=True), tf.float32) / 600.0
    return tf.reduce_mean(tf.square(model(ids, training=True) - target))


disttrain.fit(
    loss_fn,
    lambda: tf.compat.v1.train.AdamOptimizer(1e-2),
    strategy=strategy,
    steps=steps,
    logdir=logdir,
    batch_size=16,
    log_every_steps=10,
    save_checkpoint_steps=10,
    peer_wait_secs=60,
    ps_linger_secs=10,
)
"""


def keras_leg(tmp_path, name, num_ps, num_workers, step, strategy, timeout=150) -> None:
    """The Keras script as every task of a cluster (num_ps + num_workers; 0 and 0: one process)."""
    script, logdir = tmp_path / "keras_model.py", tmp_path / "logdir"
    script.write_text(KERAS_MODEL)
    jobs = {"ps": num_ps, "worker": num_workers}
    cluster = {job: [f"127.0.0.1:{free_port()}" for _ in range(n)] for job, n in jobs.items() if n}
    tasks = [(job, i) for job in cluster for i in range(len(cluster[job]))] or [("local", 0)]
    procs = {}
    for job, i in tasks:
        env = task_env({k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
        if cluster:
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": i}})
        log = open(tmp_path / f"{name}_{job}_{i}.log", "w")
        argv = [sys.executable, str(script), str(logdir), str(step), strategy]
        procs[f"{job}_{i}"] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    try:
        codes = {t: p.wait(timeout=max(1, deadline - time.monotonic())) for t, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in sorted(tmp_path.glob(f"{name}_*.log")))
    assert set(codes.values()) == {0}, (codes, logs)


@pytest.mark.extended  # the zoo MLP's resize takes the same path (CI's time)
def test_keras_model_resizes_2_3_1_and_one_process(tmp_path):
    logdir = tmp_path / "logdir"
    # 2 PS, sync with 2 replicas: Adam's beta powers are named as under every other strategy.
    keras_leg(tmp_path, "ps2", 2, 2, STEPS, "SyncParameterServer")
    saved = variables(str(logdir))
    step = int(saved["global_step"])  # async with 2 workers may pass STEPS by one
    assert ps_tasks(layout(checkpoint(logdir, step))) == {0, 1}
    assert any(n.endswith("moving_mean") for n in saved), sorted(saved)

    # One replica from here on: a second one would update batch norm's statistics (state a step
    # assigns, not a gradient) before the chief has saved what it restored.
    keras_leg(tmp_path, "ps3", 3, 1, step + STEPS, "AsyncParameterServer")
    assert_started_from(logdir, saved, step, 3)
    saved, step = assert_trained_on(logdir, saved, step + STEPS)

    keras_leg(tmp_path, "ps1", 1, 1, step + STEPS, "SyncParameterServer")
    assert_started_from(logdir, saved, step, 1)
    saved, step = assert_trained_on(logdir, saved, step + STEPS)

    keras_leg(tmp_path, "local", 0, 0, step + STEPS, "AsyncParameterServer")
    assert_started_from(logdir, saved, step, 0)
    assert_trained_on(logdir, saved, step + STEPS)
