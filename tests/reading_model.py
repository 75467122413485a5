"""A tiny model that reads its input through the input context: the settings and promise tests' model.

`tests/unit/test_every_value.py` runs it in one process, and the cluster
tests as every task of a cluster (`python -m tests.reading_model RUN.json`),
so all run the same graph. Its input is the ids 0..IDS-1, repeated, each
pipeline taking every N-th (`ctx.shard`) through `ctx.get_next`, so input
positions are saved. A run may record the ids each pipeline reads (`record`:
a directory, one file per process and pipeline; each step then takes a
little time, so that a test can stop a task mid-run) and may turn the input
of one replica to NaN from an id on (`nan`: [replica, id]).
"""

# ruff: noqa: I001  (disttrain before TensorFlow: its start-up lines stay out of the task logs)
from __future__ import annotations

import functools
import json
import os
import sys
import time

import disttrain
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
BATCH = 2
IDS = 1000


def make_loss_fn(record: str | None = None, nan: tuple[int, int] | None = None):
    """loss_fn(ctx) over this pipeline's ids; see the module docstring for `record` and `nan`."""

    def write(ids, replica, tower):
        time.sleep(0.05)
        with open(os.path.join(record, f"ids_{os.getpid()}_{replica}_{tower}.txt"), "a") as f:
            f.write("".join(f"{i}\n" for i in ids))
        return ids

    def loss_fn(ctx):
        ids = ctx.get_next(ctx.shard(tf.data.Dataset.range(IDS)).repeat().batch(ctx.batch_size))
        if record:
            ids = tf.numpy_function(write, [ids, ctx.replica_index, ctx.tower_index], tf.int64)
        x = tf.cast(ids % 7, tf.float32)
        if nan is not None and ctx.replica_index == nan[0]:
            x = tf.where(ids >= nan[1], np.float32("nan"), x)
        w = v1.get_variable("w", [1, 4])
        b = v1.get_variable("b", [4], initializer=v1.zeros_initializer())
        return tf.reduce_mean(tf.square(tf.matmul(tf.reshape(x, [-1, 1]), w) + b - 1.0))

    return loss_fn


loss_fn = make_loss_fn()


def optimizer():
    return v1.train.GradientDescentOptimizer(0.05)


def main(path: str) -> None:
    """Train as this task of TF_CONFIG's cluster, as the JSON file at `path` says.

    Keys: strategy (a class name of disttrain), knobs (its arguments), steps,
    logdir, settings (RunSettings fields); optional record and nan.
    """
    with open(path) as f:
        run = json.load(f)
    strategy = functools.partial(getattr(disttrain, run["strategy"]), **run["knobs"])
    disttrain.fit(
        make_loss_fn(run.get("record"), run.get("nan")),
        optimizer,
        steps=run["steps"],
        logdir=run["logdir"],
        strategy=strategy,
        batch_size=BATCH,
        **run["settings"],
    )


if __name__ == "__main__":
    main(sys.argv[1])
