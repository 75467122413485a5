"""How a run goes: `RunSettings` for any model, `TrainConfig` for a model_zoo run from gin.

Plain Python: gin binds TrainConfig at the edge (`disttrain.edges.configurables`);
`disttrain.fit` takes RunSettings' fields as keyword arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from disttrain.base.errors import ConfigError

# Where a gradient is clipped by its global norm (`disttrain.graph.clipping` builds it).
CLIP_WHERE = ("replica", "aggregate")


class _Accepts(NamedTuple):
    """The values one setting accepts: numbers of `kind` from `least` (excluded when `above`), or bool."""

    kind: type
    least: float = 0
    above: bool = False
    none: str = ""  # what None means, when None is a value of the setting
    unit: str = ""

    def problem(self, value) -> str:
        """What is wrong with `value` ('' when nothing is)."""
        if value is None and self.none:
            return ""
        if self.kind is bool:
            return "" if isinstance(value, bool) else "must be True or False"
        number = isinstance(value, int) if self.kind is int else isinstance(value, int | float)
        number = number and not isinstance(value, bool)
        bound = f"{'>' if self.above else '>='} {self.least:g}{self.unit}"
        none = f" (None: {self.none})" if self.none else ""
        if not number:
            return f"must be {'an integer' if self.kind is int else 'a number'} {bound}{none}"
        if value > self.least if self.above else value >= self.least:
            return ""
        return f"must be {bound}{none}"


# What each numeric or boolean RunSettings field accepts (RunSettings' docstring says what each value does).
_ACCEPTS = {
    "log_every_steps": _Accepts(int, 1),
    "save_checkpoint_steps": _Accepts(int, 1, none="no step-based checkpoints"),
    "save_checkpoint_secs": _Accepts(float, 0, above=True, none="no time-based checkpoints", unit=" seconds"),
    "keep_checkpoints": _Accepts(int, 1, none="all are kept"),
    "intra_op_threads": _Accepts(int, 0),
    "inter_op_threads": _Accepts(int, 0),
    "peer_wait_secs": _Accepts(float, 0, above=True, unit=" seconds"),
    "ps_linger_secs": _Accepts(float, 0, unit=" seconds"),
    "check_numerics": _Accepts(bool),
    "decay_threshold": _Accepts(float, 0),
    "decay_window": _Accepts(int, 1),
    "trace_steps": _Accepts(int, 0),
    "breakdown_budget": _Accepts(float, 0),
    "stall_steps": _Accepts(int, 0, none="three logging intervals"),
    "clip_norm": _Accepts(float, 0, above=True, none="no clipping"),
    "preempt_secs": _Accepts(float, 0, above=True, unit=" seconds"),
    "wait_log_secs": _Accepts(float, 0, above=True, unit=" seconds"),
    "replica_memory_bytes": _Accepts(int, 1, none="no limit"),
    "accumulate_steps": _Accepts(int, 1, none="1, no accumulation"),
    "steps_per_run": _Accepts(int, 1, none="1, one step per run"),
}


def plain(value):
    """A NumPy scalar as the Python number or bool it is (a count computed from an array's length)."""
    return value.item() if isinstance(value, np.generic) else value


def whole_count(value, name: str) -> int:
    """`value` as an int >= 1 (NumPy's integers and whole floats such as 1e6 too); else a ConfigError."""
    value = plain(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if problem := _Accepts(int, 1).problem(value):
        raise ConfigError(f"{name} {problem}, got {value!r}")
    return value


def steps_count(value, name: str) -> int:
    """The RunSettings field `name` (a count of steps) as an int, None as 1, checked by its rule."""
    problem = _ACCEPTS[name].problem(value)
    if problem:
        raise ConfigError(f"{name} {problem}, got {value!r}")
    return 1 if value is None else value


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How a run goes, whatever the model.

    Every value named below runs; anything else (a wrong type, a value out of
    range, None where None is not named) is refused by `validate` with one
    ConfigError line naming the setting.

    log_every_steps: console line and TensorBoard scalars every N local steps (>= 1).
    save_checkpoint_steps / save_checkpoint_secs: the chief's checkpoint
      interval, in steps (>= 1) or seconds (> 0); steps win when both are set.
      Both None: no checkpoints are written, and no input positions either
      (a restart starts from the latest checkpoint already in the log
      directory, if any, or from scratch; a position saved with that
      checkpoint is still restored).
    keep_checkpoints: how many checkpoints are kept (>= 1; None: all).
    intra_op_threads / inter_op_threads: TF's thread pools (0: TF's default).
    peer_wait_secs: how long a task waits for an unreachable peer before it
      exits with the transient code (> 0; 150, or 0 when training is over);
      also how long past its threshold a step may wait with every peer
      reachable before the task's watchdog takes it for hung (docs/faults.md).
    ps_linger_secs: how long a PS waits for the other replicas once the
      chief has finished (0: it leaves with the chief).
    check_numerics: a NaN or Inf loss or gradient fails the step before
      anything is applied (True or False).
    decay_threshold / decay_window: warn when a task's examples/sec stays
      this far below its recent best (a fraction; 0: never warn) for this
      many logging intervals (>= 1).
    trace_steps: write a Chrome trace of this many steps of every replica
      (after its first logging interval) to <logdir>/tasks/<job>_<index>/;
      0: none.
    breakdown_budget: the share of the run that measuring where each
      replica's step goes may cost (>= 0): a step is traced now and then,
      often enough to stay within it (`time/*` in TensorBoard, result.json,
      the closing lines; disttrain.runtime.breakdown). 0: never.
    stall_steps: a replica stops with exit code 4 when the global step has
      not moved in this many of its own steps (every strategy's step moves
      it: its own update, or the synchronous one it waited for); None: three
      logging intervals, at least 10 steps; 0: never.
    clip_norm: clip the gradient by its global norm to this (> 0; None: no
      clipping); clip_where: 'replica' (this replica's gradient, before
      aggregation: every strategy) or 'aggregate' (the averaged gradient the
      update applies: SyncAllReduce, SyncParameterServer). See disttrain.graph.clipping.
    preempt_secs: on SIGTERM (a preemption), a task ends within this many
      seconds (> 0): replicas stop at a step boundary, the chief checkpoints
      that step first; keep it below the orchestrator's grace period
      (Kubernetes: 30 s).
    replica_memory_bytes: the most bytes of variables (optimizer state
      included) one replica may hold in its own memory (>= 1); a model over
      it is refused at start in one line naming its largest table
      (SyncHybrid keeps tables on the PS tasks). None: no limit.
    wait_log_secs: a task waiting for a peer (or a step waiting far longer
      than the ones before it) says whom, since when and until when, every
      this many seconds (> 0).
    accumulate_steps: k micro-batches of `batch_size` per tower make one
      update: their gradients are averaged on the replica, in sequence (one
      micro-batch's activations in memory at a time), and cross the network
      once; the global batch and examples/sec count all k. None or 1: none.
    steps_per_run: k training steps in one `session.run` (Keras'
      `steps_per_execution`): hooks, logging, checkpoints, the stall guard,
      preemption and the saved input position act at run boundaries, every k
      steps. None or 1: one step per run.
    """

    log_every_steps: int = 100
    save_checkpoint_steps: int | None = None
    save_checkpoint_secs: float | None = 600.0
    keep_checkpoints: int | None = 5
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    peer_wait_secs: float = 120.0
    ps_linger_secs: float = 30.0
    check_numerics: bool = True
    decay_threshold: float = 0.3
    decay_window: int = 3
    trace_steps: int = 0
    breakdown_budget: float = 0.01
    stall_steps: int | None = None
    clip_norm: float | None = None
    clip_where: str = "replica"
    preempt_secs: float = 20.0
    wait_log_secs: float = 10.0
    replica_memory_bytes: int | None = None
    accumulate_steps: int | None = 1
    steps_per_run: int | None = 1

    @classmethod
    def of(cls, **settings) -> RunSettings:
        """RunSettings from keyword arguments; an unknown name is a ConfigError listing the known."""
        known = {f.name for f in dataclasses.fields(RunSettings)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ConfigError(
                f"unknown setting {unknown[0]!r}: known settings are {', '.join(sorted(known))}"
            )
        return RunSettings(**{k: plain(v) for k, v in settings.items()}).validate()

    def validate(self):
        """Raise ConfigError naming the first impossible setting; return self."""
        where = type(self).__name__
        for name, accepts in _ACCEPTS.items():
            problem = accepts.problem(getattr(self, name))
            if problem:
                raise ConfigError(f"{where}.{name} {problem}, got {getattr(self, name)!r}")
        if self.clip_where not in CLIP_WHERE:
            raise ConfigError(f"{where}.clip_where must be 'replica' or 'aggregate', got {self.clip_where!r}")
        return self

    @property
    def stall_window(self) -> int:
        """stall_steps, its default resolved (0: no check)."""
        if self.stall_steps is not None:
            return self.stall_steps
        return max(3 * self.log_every_steps, 10)


@dataclasses.dataclass(frozen=True)
class TrainConfig(RunSettings):
    """A model_zoo training run, as gin binds it (all of RunSettings, and the model's parts).

    model: a model_zoo model instance (input_shape, num_classes, __call__, loss).
    strategy: a callable cluster -> Strategy (a strategy class, or a gin-bound one).
    optimizer: a callable () -> tf.compat.v1 optimizer, called inside the graph.
    input_fn: (model, batch_size, replica_index, num_replicas) -> tf.data.Dataset.
    batch_size: examples per tower (device) per step.
    train_steps: training stops when the global step reaches this.
    eval_steps: batches per checkpoint for an evaluator task.
    regularization: the recipe's terms of the training loss
      (`model_zoo.base.Regularization`: weight decay, label smoothing); None: none.
    eval_input_fn: what an evaluator task reads, with input_fn's signature: a
      held-out split (e.g. `@eval/imagenet_input` with its own file_pattern and
      training=False). Each checkpoint is evaluated on the same first
      eval_steps batches. None: input_fn, and the evaluator says that it
      measures training data.
    """

    model: object = None
    strategy: Callable = None
    optimizer: Callable = None
    input_fn: Callable = None
    batch_size: int = 32
    train_steps: int = 1000
    eval_steps: int = 10
    eval_input_fn: Callable | None = None
    regularization: object = None

    def validate(self) -> TrainConfig:
        """Raise ConfigError naming the first missing or impossible setting."""
        for name in ("model", "strategy", "optimizer", "input_fn"):
            if getattr(self, name) is None:
                raise ConfigError(f"TrainConfig.{name} is not set: bind it in a gin file")
        for name in ("batch_size", "train_steps", "eval_steps"):
            if problem := _Accepts(int, 1).problem(getattr(self, name)):
                raise ConfigError(f"TrainConfig.{name} {problem}, got {getattr(self, name)!r}")
        return super().validate()
