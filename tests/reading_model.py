"""A tiny model that reads its input through the input context: the settings tests' model.

`tests/unit/test_every_value.py` runs it in one process, and
`tests/cluster/test_every_value.py` as every task of a cluster (`python -m
tests.reading_model RUN.json`), so both run the same graph: input positions
are saved because the input is read through `ctx.get_next`.
"""

# ruff: noqa: I001  (disttrain before TensorFlow: its start-up lines stay out of the task logs)
from __future__ import annotations

import functools
import json
import sys

import disttrain
import tensorflow as tf

v1 = tf.compat.v1
BATCH = 2


def loss_fn(ctx):
    values = tf.data.Dataset.range(10**6).map(lambda i: tf.cast(i % 7, tf.float32)).batch(ctx.batch_size)
    x = tf.reshape(ctx.get_next(values), [-1, 1])
    w = v1.get_variable("w", [1, 4])
    b = v1.get_variable("b", [4], initializer=v1.zeros_initializer())
    return tf.reduce_mean(tf.square(tf.matmul(x, w) + b - 1.0))


def optimizer():
    return v1.train.GradientDescentOptimizer(0.05)


def main(path: str) -> None:
    """Train as this task of TF_CONFIG's cluster: {"strategy", "knobs", "steps", "logdir", "settings"}."""
    with open(path) as f:
        run = json.load(f)
    strategy = functools.partial(getattr(disttrain, run["strategy"]), **run["knobs"])
    disttrain.fit(
        loss_fn,
        optimizer,
        steps=run["steps"],
        logdir=run["logdir"],
        strategy=strategy,
        batch_size=BATCH,
        **run["settings"],
    )


if __name__ == "__main__":
    main(sys.argv[1])
