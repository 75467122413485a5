"""An input pipeline that holds one replica's session close open until the test says so.

Imported into task processes by a gin file (`import tests.cluster.slow_close`).
The gated replica's first `open_batches` batches are prefetched at once, so it
trains at full speed; the prefetching thread then waits at the gate. Closing
a session destroys the iterator, which joins that thread: the replica's close
lasts until `gate_file` exists, as the incident's did while tf.data's
autotuning thread slept (see disttrain.runtime.trainer.without_autotune_thread).

The other replicas take their first batch only once the gated replica has
made its own (`<gate_file>.started`): on a loaded machine the chief could
otherwise finish a short run before the gated replica began, which would then
have no iterator to hold its close open.
"""

from __future__ import annotations

import os
import time

import gin
import tensorflow as tf

from model_zoo import inputs


@gin.configurable("gated_input")
def gated_input(
    model,
    batch_size: int,
    replica_index: int = 0,
    num_replicas: int = 1,
    gated_replica: int = 1,
    open_batches: int = 200,
    gate_file: str = "",
):
    dataset = inputs.synthetic(model, batch_size, replica_index, num_replicas)
    started = gate_file + ".started"

    def wait(index):
        if replica_index != gated_replica:
            deadline = time.monotonic() + 120
            while not os.path.exists(started) and time.monotonic() < deadline:
                time.sleep(0.1)
            return index
        if index == 0:
            open(started, "w").close()
        while index >= open_batches and not os.path.exists(gate_file):
            time.sleep(0.1)
        return index

    def gate(index, batch):
        passed = tf.numpy_function(wait, [index], tf.int64)
        with tf.control_dependencies([passed]):
            return tuple(tf.identity(t) for t in batch)

    gated = dataset.enumerate().map(gate)
    return gated.prefetch(open_batches) if replica_index == gated_replica else gated
