"""Learning-rate schedules of the global step, and the linear scaling rule from the global batch.

A schedule is a callable with no arguments that builds the learning rate as
a tensor of the global step. tf.compat.v1 optimizers call a callable
learning rate when they build their update, so a schedule is given where a
number would be:

    optimizer_fn = lambda: tf.compat.v1.train.MomentumOptimizer(
        schedules.Cosine(schedules.linear_scaling(0.1), total=90, warmup=5,
                         examples_per_epoch=1281167), momentum=0.9)

or in gin (`disttrain.edges.configurables` registers `@constant_lr()`,
`@piecewise_lr()`, `@cosine_lr()` and `@linear_scaling()`):

    Momentum.learning_rate = @cosine_lr()
    cosine_lr.learning_rate = @linear_scaling()
    linear_scaling.base_lr = 0.1

Which global step a schedule reads is the one the update increments, read
where the update runs: in the step (async, all-reduce), in the chief's
aggregator when it closes a step (sync PS), and in the transfer loop on the
worker with `AsyncParameterServer(overlap=True)`, which reads the global
step variable on its PS when it applies a queued gradient, not the
worker-side mirror the hooks print (the mirror may be a round behind).
The update that moves the global step from t to t+1 uses the rate at t.

The linear scaling rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD",
arXiv:1706.02677): lr = base_lr x B / reference_batch, B the examples one
update of the global step consumes: `Strategy.examples_per_step(batch)`,
workers x towers x batch for SyncAllReduce, (workers - backup workers) x
towers x batch for SyncParameterServer. For AsyncParameterServer each update
is one replica's gradient (towers x batch): async SGD is SGD at that batch
applied to stale parameters, so that is what is scaled, not N x batch
(Dean et al. 2012, "Large Scale Distributed Deep Networks", ran Downpour SGD
at the rate of one replica's batch). For the staleness async brings,
`async_momentum` gives the momentum and rate that keep a recipe's
effective step (below).

Durations (warmup, boundaries, total) are in global steps, or in epochs when
`examples_per_epoch` is set; epochs become steps from the same global batch.
`linear_scaling` and epochs need the global batch, known when `disttrain.fit`
or bin/train.py builds the graph (`global_batch`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math

import tensorflow as tf

from disttrain.base.errors import ConfigError

v1 = tf.compat.v1

_GLOBAL_BATCH: contextvars.ContextVar[int | None] = contextvars.ContextVar("global_batch", default=None)


@contextlib.contextmanager
def global_batch(examples_per_step: int):
    """Within: schedules and `linear_scaling` resolve against this many examples per global step."""
    if examples_per_step < 1:
        raise ConfigError(f"global batch must be >= 1, got {examples_per_step}")
    token = _GLOBAL_BATCH.set(int(examples_per_step))
    try:
        yield
    finally:
        _GLOBAL_BATCH.reset(token)


def current_global_batch(what: str) -> int:
    """The global batch of the graph being built; ConfigError naming `what` needs it when unknown."""
    batch = _GLOBAL_BATCH.get()
    if batch is None:
        raise ConfigError(
            f"{what} needs the global batch, known only while disttrain.fit or bin/train.py builds "
            "the graph (or inside `disttrain.graph.schedules.global_batch(n)`)"
        )
    return batch


def scaled_learning_rate(base_lr: float, examples_per_step: int, reference_batch: int = 256) -> float:
    """The linear scaling rule: base_lr x examples_per_step / reference_batch (Goyal et al. 2017).

    examples_per_step: `strategy.examples_per_step(batch_size)` (see the module docstring for
    what that is in each strategy).
    """
    if examples_per_step < 1 or reference_batch < 1:
        raise ConfigError(
            f"examples_per_step and reference_batch must be >= 1, got {examples_per_step}, {reference_batch}"
        )
    return base_lr * examples_per_step / reference_batch


def async_staleness(num_replicas: int, overlap: bool = False) -> int:
    """Updates, on average, between a gradient's read of the parameters and its own update.

    AsyncParameterServer: the other replicas' updates land in between, one
    each (N in all, counting its own); with overlap=True a gradient is also
    computed while the replica's previous one is in flight (2N).
    """
    if num_replicas < 1:
        raise ConfigError(f"num_replicas must be >= 1, got {num_replicas}")
    return num_replicas * (2 if overlap else 1)


def async_momentum(learning_rate: float, momentum: float, staleness: float) -> tuple[float, float]:
    """(rate, momentum) for async SGD with `staleness` that keep a one-process recipe's effective step.

    Asynchrony begets momentum (Mitliagkas et al. 2016, "Asynchrony begets
    momentum", arXiv:1605.09774): S-stale SGD behaves like momentum SGD with
    an implicit momentum of 1 - 1/S, so a tuned explicit momentum on top of
    it overshoots (AsyncParameterServer(overlap=True) at 4 workers diverged
    on the digits task with momentum 0.9, docs/accuracy.md). The explicit
    momentum m' is lowered so that (1 - m') / S = 1 - m, the rate kept; once
    m' would fall below 0 it is 0 and the rate is divided by what staleness
    is left, S (1 - m), which is the staleness-aware rate of Zhang et al.
    2016 (arXiv:1511.05950) for plain SGD. staleness=1 returns the recipe.
    """
    if not 0 <= momentum < 1 or staleness < 1 or learning_rate <= 0:
        raise ConfigError(
            "async_momentum needs 0 <= momentum < 1, staleness >= 1 and a positive rate, got "
            f"momentum={momentum}, staleness={staleness}, learning_rate={learning_rate}"
        )
    explicit = max(0.0, 1.0 - staleness * (1.0 - momentum))
    return learning_rate * (1.0 - explicit) / (staleness * (1.0 - momentum)), explicit


@dataclasses.dataclass(frozen=True)
class LinearScaling:
    """A learning rate scaled from the global batch when the graph is built (`linear_scaling`)."""

    base_lr: float
    reference_batch: int = 256

    def resolve(self) -> float:
        return scaled_learning_rate(
            self.base_lr, current_global_batch("linear_scaling"), self.reference_batch
        )


def linear_scaling(base_lr: float, reference_batch: int = 256) -> LinearScaling:
    """base_lr for a global batch of reference_batch, scaled linearly to the run's global batch."""
    return LinearScaling(base_lr, reference_batch)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Base: linear warmup from warmup_from x peak to the peak, then `_decayed`.

    learning_rate: the peak rate, a number or `linear_scaling(...)`.
    warmup: how long the warmup lasts (steps, or epochs with examples_per_epoch); 0: none.
    warmup_from: the rate at step 0, as a fraction of the peak.
    examples_per_epoch: None: durations are global steps; else they are epochs of this many examples.
    """

    learning_rate: float | LinearScaling = 0.1
    warmup: float = 0
    warmup_from: float = 0.0
    examples_per_epoch: int | None = None

    def __call__(self) -> tf.Tensor:
        """The rate at the global step (what an optimizer calls when it builds its update)."""
        return self.at(v1.train.get_or_create_global_step())

    def at(self, step) -> tf.Tensor:
        """The rate at `step` (a tensor or number), as a float32 tensor."""
        step = tf.cast(step, tf.float32)
        peak = self.peak()
        warmup = self.steps(self.warmup)
        rate = self._decayed(step, peak)
        if warmup <= 0:
            return rate
        ramp = peak * (self.warmup_from + (1.0 - self.warmup_from) * step / warmup)
        return tf.where(step < warmup, ramp, rate)

    def peak(self) -> float:
        lr = self.learning_rate
        return lr.resolve() if isinstance(lr, LinearScaling) else float(lr)

    def steps(self, duration: float) -> float:
        """A duration in global steps (from epochs when examples_per_epoch is set)."""
        if self.examples_per_epoch is None:
            return float(duration)
        return duration * self.examples_per_epoch / current_global_batch(f"{type(self).__name__} in epochs")

    def value(self, step: int) -> float:
        """The rate at `step`, computed by the same graph in a scratch session (tests, logs)."""
        with tf.Graph().as_default(), v1.Session() as session:
            return float(session.run(self.at(tf.constant(step, tf.int64))))

    def _decayed(self, step: tf.Tensor, peak: float) -> tf.Tensor:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Constant(Schedule):
    """The peak rate after warmup."""

    def _decayed(self, step, peak):
        return tf.constant(peak, tf.float32)


@dataclasses.dataclass(frozen=True)
class Piecewise(Schedule):
    """peak x multipliers[i] from boundaries[i-1] on (multipliers has one more entry than boundaries)."""

    boundaries: tuple[float, ...] = ()
    multipliers: tuple[float, ...] = (1.0,)

    def __post_init__(self):
        if len(self.multipliers) != len(self.boundaries) + 1:
            raise ConfigError(
                f"Piecewise: {len(self.boundaries)} boundaries need {len(self.boundaries) + 1} multipliers, "
                f"got {len(self.multipliers)}"
            )
        if list(self.boundaries) != sorted(self.boundaries):
            raise ConfigError(f"Piecewise: boundaries must increase, got {self.boundaries}")

    def _decayed(self, step, peak):
        rate = tf.constant(peak * self.multipliers[0], tf.float32)
        for boundary, multiplier in zip(self.boundaries, self.multipliers[1:], strict=True):
            rate = tf.where(step >= self.steps(boundary), peak * multiplier, rate)
        return rate


@dataclasses.dataclass(frozen=True)
class Cosine(Schedule):
    """Cosine decay from the peak at the end of warmup to final x peak at `total`, then flat.

    Loshchilov and Hutter 2017, "SGDR" (arXiv:1608.03983), without restarts.
    """

    total: float = 0
    final: float = 0.0

    def _decayed(self, step, peak):
        warmup, total = self.steps(self.warmup), self.steps(self.total)
        if total <= warmup:
            raise ConfigError(f"Cosine: total ({self.total}) must be beyond warmup ({self.warmup})")
        progress = tf.clip_by_value((step - warmup) / (total - warmup), 0.0, 1.0)
        return peak * (self.final + (1.0 - self.final) * 0.5 * (1.0 + tf.cos(math.pi * progress)))


@dataclasses.dataclass(frozen=True)
class Exponential(Schedule):
    """peak x rate^(step / every), in whole periods when `staircase`: e.g. x0.94 every 2 epochs."""

    rate: float = 0.94
    every: float = 1
    staircase: bool = True

    def _decayed(self, step, peak):
        periods = step / self.steps(self.every)
        if self.staircase:
            periods = tf.floor(periods)
        return peak * tf.pow(tf.constant(self.rate, tf.float32), periods)
