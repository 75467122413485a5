"""TrainConfig: everything a run needs besides the cluster, as one immutable value.

Plain Python: gin binds it at the edge (`disttrain.configurables`), tests
and user code build it directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from disttrain.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A training run.

    model: a model_zoo model instance (input_shape, num_classes, __call__, loss).
    strategy: a callable cluster -> Strategy (a strategy class, or a gin-bound one).
    optimizer: a callable () -> tf.compat.v1 optimizer, called inside the graph.
    input_fn: (model, batch_size, replica_index, num_replicas) -> tf.data.Dataset.
    batch_size: examples per tower (device) per step.
    train_steps: training stops when the global step reaches this.
    log_every_steps: console line and TensorBoard scalars every N local steps
      (the throughput hook writes both; there is no separate summary interval).
    """

    model: object = None
    strategy: Callable = None
    optimizer: Callable = None
    input_fn: Callable = None
    batch_size: int = 32
    train_steps: int = 1000
    log_every_steps: int = 100
    save_checkpoint_steps: int | None = None
    save_checkpoint_secs: float | None = 600.0
    keep_checkpoints: int = 5
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    peer_wait_secs: float = 120.0
    ps_linger_secs: float = 30.0
    eval_steps: int = 10
    check_numerics: bool = True  # a NaN/Inf gradient fails the step before it is applied
    decay_threshold: float = 0.3  # warn when examples/sec stays this far below its recent best
    decay_window: int = 3  # ... for this many logging intervals

    def validate(self) -> TrainConfig:
        """Raise ConfigError naming the first missing or impossible setting."""
        for name in ("model", "strategy", "optimizer", "input_fn"):
            if getattr(self, name) is None:
                raise ConfigError(f"TrainConfig.{name} is not set: bind it in a gin file")
        for name in ("batch_size", "train_steps", "log_every_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.save_checkpoint_steps is not None and self.save_checkpoint_steps < 1:
            raise ConfigError(
                f"TrainConfig.save_checkpoint_steps must be >= 1, got {self.save_checkpoint_steps}"
            )
        return self
