"""A test-only SyncParameterServer whose listed replicas are stragglers, for cluster runs.

A gin file imports this module in every process of a run (tests/cluster/straggler.gin):
the listed replicas sleep `step_delay_secs` between computing their gradients and
sending them. Fault injection stays out of the library's public constructors.
"""

import time

import gin
import numpy as np
import tensorflow as tf

from disttrain.strategies import SyncParameterServer, sparse


class StragglerSyncParameterServer(SyncParameterServer):
    """SyncParameterServer, with `delay_replicas` sleeping `step_delay_secs` before each send."""

    def __init__(self, cluster, step_delay_secs: float = 0.0, delay_replicas: tuple[int, ...] = (), **kwargs):
        super().__init__(cluster, **kwargs)
        self.step_delay_secs = float(step_delay_secs)
        self.delay_replicas = tuple(delay_replicas)

    def _before_sending(self, grads_and_vars):
        if self.step_delay_secs > 0 and self._me in self.delay_replicas:
            return delayed(grads_and_vars, self.step_delay_secs)
        return grads_and_vars


def delayed(grads_and_vars, seconds: float):
    """The same gradients, available `seconds` after they were computed (a straggler)."""

    def sleep():
        time.sleep(seconds)
        return np.int64(0)

    with tf.control_dependencies([g.values if sparse.is_sparse(g) else g for g, _ in grads_and_vars]):
        done = tf.numpy_function(sleep, [], tf.int64, name="straggler_delay")
    with tf.control_dependencies([done]):
        return [
            (
                tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape)
                if sparse.is_sparse(g)
                else tf.identity(g),
                v,
            )
            for g, v in grads_and_vars
        ]


gin.external_configurable(StragglerSyncParameterServer, "StragglerSyncParameterServer")
