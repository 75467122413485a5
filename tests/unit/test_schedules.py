"""Learning-rate schedules: their values against the formulas, the linear scaling rule per strategy,
gin, and which global step a schedule sees in every strategy (overlap's transfer loop included)."""

from __future__ import annotations

import math

import gin
import numpy as np
import pytest
import tensorflow as tf

from disttrain import AsyncParameterServer, Cluster, SyncAllReduce, SyncParameterServer
from disttrain.base.errors import ConfigError
from disttrain.edges import configurables
from disttrain.graph import schedules as s
from tests.unit.test_optimizer_contract import MODES, loss_fn

v1 = tf.compat.v1


def test_constant_with_warmup_ramps_linearly_then_holds():
    schedule = s.Constant(0.4, warmup=10)
    for step in (0, 3, 9):
        assert schedule.value(step) == pytest.approx(0.4 * step / 10)
    assert schedule.value(10) == pytest.approx(0.4)
    assert schedule.value(10_000) == pytest.approx(0.4)
    assert s.Constant(0.4, warmup=10, warmup_from=0.25).value(0) == pytest.approx(0.1)


def test_piecewise_steps_down_at_each_boundary():
    schedule = s.Piecewise(1.0, warmup=2, boundaries=(5, 8), multipliers=(1.0, 0.1, 0.01))
    expected = {0: 0.0, 1: 0.5, 2: 1.0, 4: 1.0, 5: 0.1, 7: 0.1, 8: 0.01, 100: 0.01}
    for step, lr in expected.items():
        assert schedule.value(step) == pytest.approx(lr), step


def test_cosine_decays_from_the_end_of_warmup_to_final_at_total():
    schedule = s.Cosine(2.0, warmup=10, total=110, final=0.1)
    for step in (10, 35, 60, 85, 110, 500):
        progress = min((step - 10) / 100, 1.0)
        expected = 2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        assert schedule.value(step) == pytest.approx(expected, rel=1e-5), step
    assert schedule.value(5) == pytest.approx(1.0)


def test_epochs_become_steps_from_the_global_batch():
    schedule = s.Piecewise(0.1, warmup=1, boundaries=(2,), multipliers=(1.0, 0.1), examples_per_epoch=1000)
    with s.global_batch(100):  # 10 steps per epoch
        assert schedule.value(5) == pytest.approx(0.05)
        assert schedule.value(19) == pytest.approx(0.1)
        assert schedule.value(20) == pytest.approx(0.01)
    with pytest.raises(ConfigError, match="global batch"):
        schedule.value(5)


def test_piecewise_needs_one_more_multiplier_than_boundaries():
    with pytest.raises(ConfigError, match="2 boundaries need 3 multipliers"):
        s.Piecewise(0.1, boundaries=(1, 2), multipliers=(1.0, 0.1))


def _ps(job="worker", task=0, workers=4):
    return Cluster.from_hosts(job, task, ["p0:1"], [f"w{i}:1" for i in range(workers)])


def test_linear_scaling_follows_each_strategy_s_examples_per_step():
    """Sync: every replica's towers x batch (less backup workers); async: one replica's."""
    allreduce = SyncAllReduce(Cluster.from_hosts("worker", 0, (), ["w0:1", "w1:1", "w2:1"]), num_towers=2)
    sync = SyncParameterServer(_ps(), backup_workers=1, num_towers=2)
    async_ = AsyncParameterServer(_ps(), num_towers=2)
    cases = {allreduce: 3 * 2 * 32, sync: (4 - 1) * 2 * 32, async_: 2 * 32}
    for strategy, batch in cases.items():
        assert strategy.examples_per_step(32) == batch
        with s.global_batch(strategy.examples_per_step(32)):
            assert s.linear_scaling(0.1).resolve() == pytest.approx(0.1 * batch / 256)
            assert s.Constant(s.linear_scaling(0.1)).value(0) == pytest.approx(0.1 * batch / 256)
    assert s.scaled_learning_rate(0.1, 1024) == pytest.approx(0.4)
    with pytest.raises(ConfigError, match="linear_scaling needs the global batch"):
        s.linear_scaling(0.1).resolve()


def test_gin_binds_a_scaled_schedule_as_the_optimizer_s_learning_rate():
    configurables.register_all()
    with gin.unlock_config():
        gin.clear_config()
        gin.parse_config(
            """
            TrainConfig.optimizer = @Momentum
            Momentum.momentum = 0.9
            Momentum.learning_rate = @piecewise_lr()
            piecewise_lr.learning_rate = @linear_scaling()
            linear_scaling.base_lr = 0.1
            piecewise_lr.warmup = 2
            piecewise_lr.boundaries = (4,)
            piecewise_lr.multipliers = (1.0, 0.1)
            """
        )
    try:
        make_optimizer = gin.query_parameter("TrainConfig.optimizer").scoped_configurable_fn
        with tf.Graph().as_default(), s.global_batch(512):
            optimizer = make_optimizer()
            step = v1.train.get_or_create_global_step()
            lr = optimizer._learning_rate()  # what MomentumOptimizer._prepare calls
            with v1.Session() as session:
                session.run(v1.global_variables_initializer())
                seen = []
                for _ in range(6):
                    seen.append(session.run(lr))
                    session.run(step.assign_add(1))
        np.testing.assert_allclose(seen, [0.0, 0.1, 0.2, 0.2, 0.02, 0.02], rtol=1e-6)
    finally:
        gin.clear_config()


# Rate 1.0 for the update from step 0, 0.5 from step 1, 0.25 from step 2 on.
SCHEDULE = s.Piecewise(0.5, boundaries=(1, 2), multipliers=(1.0, 0.5, 0.25))
STEPS = 4


def _train(strategy) -> dict[str, np.ndarray]:
    """STEPS steps of SGD on SCHEDULE; with overlap, each step's transfer round too, as the loop runs it."""
    with tf.Graph().as_default():
        with strategy.scope():
            train_op = strategy.minimize(v1.train.GradientDescentOptimizer(SCHEDULE), loss_fn)
        with v1.Session(config=strategy.session_config()) as session:
            session.run(v1.global_variables_initializer())
            session.run(v1.local_variables_initializer())  # overlap's copies start from the variables
            for _ in range(STEPS):
                session.run(train_op)
                if getattr(strategy, "overlap", False):
                    session.run(strategy.transfer_op)
            return {v.op.name: session.run(v) for v in v1.global_variables() if v.op.name in ("w", "table")}


def _one_process(schedule=SCHEDULE) -> dict[str, np.ndarray]:
    with tf.Graph().as_default():
        loss = loss_fn()
        train_op = v1.train.GradientDescentOptimizer(schedule).minimize(
            loss, global_step=v1.train.get_or_create_global_step()
        )
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            for _ in range(STEPS):
                session.run(train_op)
            return {v.op.name: session.run(v) for v in v1.global_variables() if v.op.name in ("w", "table")}


@pytest.mark.parametrize("towers", [1, 2])
@pytest.mark.parametrize("mode", list(MODES))
def test_every_strategy_applies_the_rate_of_the_step_it_increments(mode, towers):
    """The update from step t uses the rate at t, overlap included.

    With overlap the optimizer's update runs in the transfer loop, where the
    schedule reads the global step variable itself (not the worker's mirror of
    it that hooks read), as the update's own increment does.
    """
    reference = _one_process()
    values = _train(MODES[mode](towers))
    for name in ("w", "table"):
        np.testing.assert_allclose(values[name], reference[name], rtol=1e-5, atol=1e-7)
    assert not np.allclose(reference["w"], _one_process(s.Constant(0.5))["w"])  # the schedule mattered


def test_minimize_told_the_batch_resolves_linear_scaling_from_the_strategy():
    """What fit and bin/train.py do: minimize(batch_size=...) builds the update in that global batch."""
    schedule = s.Constant(s.linear_scaling(0.1, reference_batch=8))
    strategy = SyncAllReduce(Cluster.local(), num_towers=2)  # 2 towers x 4 = 8 examples per step
    with tf.Graph().as_default():
        with strategy.scope():
            optimizer = v1.train.GradientDescentOptimizer(schedule)
            strategy.minimize(optimizer, loss_fn, batch_size=4)
        with v1.Session(config=strategy.session_config()) as session:
            assert session.run(optimizer._learning_rate_tensor) == pytest.approx(0.1)


# ---- staleness --------------------------------------------------------------------------------


def test_async_staleness_counts_the_updates_in_between():
    assert [s.async_staleness(n) for n in (1, 2, 4)] == [1, 2, 4]
    assert [s.async_staleness(n, overlap=True) for n in (1, 2, 4)] == [2, 4, 8]
    with pytest.raises(ConfigError, match="num_replicas"):
        s.async_staleness(0)


@pytest.mark.parametrize("staleness", [1, 2, 4, 8, 10, 16])
def test_async_momentum_keeps_the_effective_step_with_the_implicit_momentum(staleness):
    rate, momentum = s.async_momentum(0.02, 0.9, staleness)
    assert 0 <= momentum <= 0.9
    # Explicit and implicit (1 - 1/S) momentum together: the recipe's effective step, 0.02 / 0.1.
    assert rate / ((1 - momentum) / staleness) == pytest.approx(0.2)
    if staleness == 1:
        assert (rate, momentum) == (0.02, 0.9)
    if staleness <= 10:  # the explicit momentum absorbs it: the rate is the recipe's
        assert rate == pytest.approx(0.02) and momentum == pytest.approx(1 - staleness * 0.1)
    else:  # none left to lower: the rate carries the rest (a staleness-aware rate)
        assert momentum == 0 and rate == pytest.approx(0.02 * 10 / staleness)


def test_async_momentum_refuses_what_it_cannot_compensate():
    for bad in [dict(momentum=1.0, staleness=2), dict(momentum=0.9, staleness=0.5)]:
        with pytest.raises(ConfigError, match="async_momentum"):
            s.async_momentum(0.1, **bad)
