"""How a run goes: `RunSettings` for any model, `TrainConfig` for a model_zoo run from gin.

Plain Python: gin binds TrainConfig at the edge (`disttrain.configurables`);
`disttrain.fit` takes RunSettings' fields as keyword arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from disttrain.clipping import Clip
from disttrain.errors import ConfigError


def steps_count(value, name: str) -> int:
    """`value` as a count of steps (None: 1); ConfigError naming `name` unless an int >= 1."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1 (1 or None: off), got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How a run goes, whatever the model.

    log_every_steps: console line and TensorBoard scalars every N local steps.
    save_checkpoint_steps / save_checkpoint_secs: the chief's checkpoint
      interval (steps win when set; both None: no checkpoints are written);
      keep_checkpoints: how many are kept.
    intra_op_threads / inter_op_threads: TF's thread pools (0: TF's default).
    peer_wait_secs: how long a task waits for an unreachable peer before it
      exits with the transient code (150; 0 when training is over); also
      how long past its threshold a step may wait with every peer reachable
      before the task's watchdog takes it for hung (docs/faults.md).
    ps_linger_secs: how long a PS waits for the other replicas once the
      chief has finished.
    check_numerics: a NaN or Inf loss or gradient fails the step before
      anything is applied.
    decay_threshold / decay_window: warn when a task's examples/sec stays
      this far below its recent best for this many logging intervals.
    trace_steps: write a Chrome trace of this many steps of every replica
      (after its first logging interval) to <logdir>/tasks/<job>_<index>/;
      0: none.
    stall_steps: a replica stops with exit code 4 when the global step has
      not moved in this many of its own steps (every strategy's step moves
      it: its own update, or the synchronous one it waited for); None: three
      logging intervals, at least 10 steps; 0: never.
    clip_norm: clip the gradient by its global norm to this (None: no
      clipping); clip_where: 'replica' (this replica's gradient, before
      aggregation: every strategy) or 'aggregate' (the averaged gradient the
      update applies: SyncAllReduce, SyncParameterServer). See disttrain.clipping.
    preempt_secs: on SIGTERM (a preemption), a task ends within this many
      seconds: replicas stop at a step boundary, the chief checkpoints that
      step first; keep it below the orchestrator's grace period (Kubernetes:
      30 s).
    replica_memory_bytes: the most bytes of variables (optimizer state
      included) one replica may hold in its own memory; a model over it is
      refused at start in one line naming its largest table (SyncHybrid
      keeps tables on the PS tasks). None: no limit.
    wait_log_secs: a task waiting for a peer (or a step waiting far longer
      than the ones before it) says whom, since when and until when, every
      this many seconds.
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
    keep_checkpoints: int = 5
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    peer_wait_secs: float = 120.0
    ps_linger_secs: float = 30.0
    check_numerics: bool = True
    decay_threshold: float = 0.3
    decay_window: int = 3
    trace_steps: int = 0
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
        return RunSettings(**settings).validate()

    def validate(self):
        """Raise ConfigError naming the first impossible setting; return self."""
        where = type(self).__name__
        if self.log_every_steps < 1:
            raise ConfigError(f"{where}.log_every_steps must be >= 1, got {self.log_every_steps}")
        if self.stall_steps is not None and self.stall_steps < 0:
            raise ConfigError(f"{where}.stall_steps must be >= 0 (0: never), got {self.stall_steps}")
        if self.save_checkpoint_steps is not None and self.save_checkpoint_steps < 1:
            raise ConfigError(f"{where}.save_checkpoint_steps must be >= 1, got {self.save_checkpoint_steps}")
        if self.replica_memory_bytes is not None and self.replica_memory_bytes < 1:
            raise ConfigError(
                f"{where}.replica_memory_bytes must be >= 1 (None: no limit), got {self.replica_memory_bytes}"
            )
        Clip.of(self)  # ConfigError on an impossible clip_norm or clip_where
        for name in ("preempt_secs", "wait_log_secs"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{where}.{name} must be > 0 seconds, got {getattr(self, name)}")
        for name in ("accumulate_steps", "steps_per_run"):
            steps_count(getattr(self, name), f"{where}.{name}")
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
        for name in ("batch_size", "train_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        return super().validate()
