"""A test-only optimizer whose train op applies no update, for benchmark runs that train nothing.

A gin file imports this module in every process of a run (tests/bench/no_update.gin):
the steps compute gradients and run as fast as such a broken step does, the
variables and the global step stay where they are, as in issue 20's SyncAllReduce.
"""

import gin
import tensorflow as tf

v1 = tf.compat.v1


class NoUpdateOptimizer(v1.train.GradientDescentOptimizer):
    """Computes the gradients and applies none of them; the global step never moves."""

    def __init__(self, learning_rate: float = 0.1, use_locking: bool = False, name: str = "NoUpdate"):
        super().__init__(learning_rate, use_locking=use_locking, name=name)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        del global_step  # not incremented: that is the point
        return tf.group(*[g for g, _ in grads_and_vars if g is not None], name=name or "no_update")


gin.external_configurable(NoUpdateOptimizer, "NoUpdate")
