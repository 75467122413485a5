"""clip_norm: the update is one process's clipped update in every strategy, with towers and overlap,
for dense and sparse gradients, wherever the norm is taken; and 'aggregate' only where there is one.

One process (towers on virtual CPUs), where a replica's gradient is the
aggregate, so both places give the one-process update; 2-worker clusters
take the norm in both places in tests/cluster/test_every_value.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from disttrain import AsyncParameterServer, Cluster, RunSettings
from disttrain.base.errors import ConfigError
from disttrain.graph.clipping import Clip, clip_by_global_norm
from tests.unit.test_optimizer_contract import CLIP, LR, MODES, STEPS, loss_fn, one_process_clipped

v1 = tf.compat.v1


def train(strategy, clip: Clip) -> dict[str, np.ndarray]:
    with tf.Graph().as_default():
        with strategy.scope():
            train_op = strategy.minimize(v1.train.GradientDescentOptimizer(LR), loss_fn, clip=clip)
        with v1.Session(config=strategy.session_config()) as session:
            session.run(v1.global_variables_initializer())
            session.run(v1.local_variables_initializer())
            for _ in range(STEPS):
                session.run(train_op)
                if getattr(strategy, "overlap", False):
                    session.run(strategy.transfer_op)
            return {v.op.name: session.run(v) for v in v1.global_variables() if v.op.name in ("w", "table")}


# Async never aggregates: clipping an aggregate is refused there (test_async_refuses_to_clip_an_aggregate).
CASES = [(m, w) for m in MODES for w in ("replica", "aggregate") if w == "replica" or "async" not in m]


@pytest.mark.parametrize("mode, where", CASES)
@pytest.mark.parametrize("towers", [1, 2])
def test_clip_norm_gives_one_process_clipped_update(mode, towers, where):
    reference = one_process_clipped(densify=True)
    values = train(MODES[mode](towers), Clip(CLIP, where))
    for name in ("w", "table"):
        np.testing.assert_allclose(values[name], reference[name], rtol=1e-5, atol=1e-7)
    assert not np.allclose(reference["w"], 0.1)


def test_async_refuses_to_clip_an_aggregate():
    with pytest.raises(ConfigError, match="never aggregates"):
        train(AsyncParameterServer(Cluster.local()), Clip(1.0, "aggregate"))


def test_sparse_rows_named_twice_count_once_in_the_norm():
    with tf.Graph().as_default():
        var = v1.get_variable("t", [4, 2])
        rows = tf.IndexedSlices(
            tf.constant([[3.0, 0.0], [1.0, 0.0], [0.0, 4.0]]), tf.constant([1, 1, 2]), tf.constant([4, 2])
        )
        ((clipped, _),) = clip_by_global_norm([(rows, var)], 2.5)  # dense rows: [4, 0] and [0, 4]
        with v1.Session() as session:
            dense = session.run(tf.convert_to_tensor(clipped))
    np.testing.assert_allclose(dense[1], [4 * 2.5 / np.sqrt(32), 0], rtol=1e-6)
    np.testing.assert_allclose(dense[2], [0, 4 * 2.5 / np.sqrt(32)], rtol=1e-6)


def test_settings_refuse_an_impossible_clip():
    with pytest.raises(ConfigError, match="clip_norm must be > 0"):
        RunSettings.of(clip_norm=0.0)
    with pytest.raises(ConfigError, match="clip_where must be 'replica' or 'aggregate', got 'everywhere'"):
        RunSettings.of(clip_norm=1.0, clip_where="everywhere")
