"""Optimizers for embedding tables: sparse gradients updated where the rows are, and only those rows."""

from __future__ import annotations

import tensorflow as tf

v1 = tf.compat.v1


class LazyAdamOptimizer(v1.train.AdamOptimizer):
    """Adam that updates only the rows a sparse gradient names, in the variable and in both moments.

    `tf.compat.v1.train.AdamOptimizer` applies a sparse gradient densely: it
    decays the whole first and second moment slots and writes every row of
    the variable each step, three passes over the table's bytes on its PS
    however few rows the step looked up. This one reads the named rows of m
    and v, updates them, and writes those rows of m, v and the variable (as
    TF Addons' LazyAdam did). Rows not looked up in a step keep their moments
    instead of decaying them, which is the usual trade for embedding tables.
    Dense gradients get plain Adam.
    """

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, name="LazyAdam"):
        super().__init__(learning_rate, beta1, beta2, epsilon, use_locking=False, name=name)

    def _resource_apply_sparse(self, grad, var, indices):
        dtype = var.dtype.base_dtype
        beta1_power, beta2_power = (tf.cast(p, dtype) for p in self._get_beta_accumulators())
        lr, beta1, beta2, epsilon = (
            tf.cast(t, dtype) for t in (self._lr_t, self._beta1_t, self._beta2_t, self._epsilon_t)
        )
        lr = lr * tf.sqrt(1 - beta2_power) / (1 - beta1_power)
        m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
        m_rows = beta1 * m.sparse_read(indices) + (1 - beta1) * grad
        v_rows = beta2 * v.sparse_read(indices) + (1 - beta2) * tf.square(grad)
        step = lr * m_rows / (tf.sqrt(v_rows) + epsilon)
        return tf.group(
            m.scatter_update(tf.IndexedSlices(m_rows, indices)),
            v.scatter_update(tf.IndexedSlices(v_rows, indices)),
            var.scatter_sub(tf.IndexedSlices(step, indices)),
        )
