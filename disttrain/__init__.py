"""disttrain: data-parallel distributed training on TensorFlow that scales.

The public API:
- `fit(loss_fn, optimizer_fn, steps=..., logdir=...)`: the whole life of one
  task of any role, for any graph-mode model (get_variable, Keras layers).
- `session(strategy, steps=..., logdir=...)`: the same, for a loop of your own
  after `strategy.minimize(...)`.
- Replica strategies `AsyncParameterServer`, `SyncParameterServer`,
  `SyncAllReduce`, `SyncHybrid` (base `Strategy`): `scope()`, `minimize()`,
  `hooks(last_step)`, `session_config()`.
- `Cluster`: the whole cluster from one task's point of view (TF_CONFIG, flags, local).
- `RunSettings`: how a run goes (checkpoints, logging, waits, guards);
  `TrainConfig`: a model_zoo run as gin binds it (bin/train.py).
- `DisttrainError`: what ends a task, with its exit code.
- `InputContext`: what a loss function that takes one argument is given: its
  replica and tower, batch sizes, `shard()` and `get_next()`.
- `export(logdir, serve_fn, export_dir, inputs=...)`: the newest (or a named)
  checkpoint of any layout as a SavedModel in TF Serving's versioned layout,
  loadable in plain TF 2; `BestExport`: what an evaluator task exports when
  a checkpoint's metric is the best so far (`fit(..., export_best=...)`).
"""

import os as _os

from disttrain import _moved
from disttrain.base import quiet as _quiet

# The module paths of 0.1.0 (`disttrain.placement`, `disttrain.errors`, ...) as deprecated aliases.
_moved.install()

# TensorFlow's C++ logging below warnings is noise to a user; DISTTRAIN_TF_LOGS=1
# keeps it, and an explicit TF_CPP_MIN_LOG_LEVEL wins. Only effective before
# TensorFlow is imported. What TensorFlow writes before its logging exists
# (oneDNN, CPU features) ignores this level: the import is filtered instead.
if not _quiet.tf_logs_wanted():
    _os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

with _quiet.tf_start_up():
    import tensorflow as _tf

# Graph mode for the whole process, before any op exists.
_tf.compat.v1.disable_eager_execution()

from disttrain.base.cluster import Cluster  # noqa: E402
from disttrain.base.config import RunSettings, TrainConfig  # noqa: E402
from disttrain.base.errors import DisttrainError  # noqa: E402
from disttrain.graph.input_context import InputContext  # noqa: E402
from disttrain.graph.optimizers import LazyAdamOptimizer  # noqa: E402
from disttrain.launch import fit, session  # noqa: E402
from disttrain.runtime.exporting import BestExport, export  # noqa: E402
from disttrain.strategies import (  # noqa: E402
    AsyncParameterServer,
    Strategy,
    SyncAllReduce,
    SyncHybrid,
    SyncParameterServer,
)

__all__ = [
    "AsyncParameterServer",
    "BestExport",
    "Cluster",
    "DisttrainError",
    "InputContext",
    "LazyAdamOptimizer",
    "RunSettings",
    "Strategy",
    "SyncAllReduce",
    "SyncHybrid",
    "SyncParameterServer",
    "TrainConfig",
    "export",
    "fit",
    "session",
]


def __getattr__(name: str):
    """`disttrain.placement` and the other module paths of 0.1.0, read as attributes (deprecated)."""
    return _moved.attribute(name)
