"""disttrain: data-parallel distributed training on TensorFlow that scales.

The public API:
- `Cluster`: the whole cluster from one task's point of view.
- `TrainConfig`: a training run (model, strategy, optimizer, input, steps).
- Replica strategies: `AsyncParameterServer`, `SyncParameterServer`,
  `SyncAllReduce` (and the base `Strategy`).
- `train(cluster, config, logdir)`: the whole life of one task, any role.
- `DisttrainError`: what ends a task, with its exit code.
"""

import tensorflow as _tf

# Graph mode for the whole process, before any op exists (see FACTS.md).
_tf.compat.v1.disable_eager_execution()

from disttrain.cluster import Cluster  # noqa: E402
from disttrain.config import TrainConfig  # noqa: E402
from disttrain.errors import DisttrainError  # noqa: E402
from disttrain.launch import run as train  # noqa: E402
from disttrain.strategies import (  # noqa: E402
    AsyncParameterServer,
    Strategy,
    SyncAllReduce,
    SyncParameterServer,
)

__all__ = [
    "AsyncParameterServer",
    "Cluster",
    "DisttrainError",
    "Strategy",
    "SyncAllReduce",
    "SyncParameterServer",
    "TrainConfig",
    "train",
]
