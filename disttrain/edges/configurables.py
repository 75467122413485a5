"""Gin at the edge: registers the library's building blocks as gin configurables.

Only entry points (bin/, tests of gin files) import this module; the library
itself never reads gin. Names in .gin files:

- `TrainConfig.*`: the run (disttrain.base.config.TrainConfig)
- models by registry name: `@mlp()`, `@cifar10()`, ... (model_zoo)
- strategies by class name: `@AsyncParameterServer`, ... (uncalled: the
  launcher calls them with the cluster)
- optimizers: `@Adam`, `@LazyAdam`, `@Adagrad`, `@SGD`, `@Momentum`, `@RMSProp` (uncalled)
- learning-rate schedules, given as an optimizer's learning_rate: `@constant_lr()`,
  `@piecewise_lr()`, `@cosine_lr()` (called: the optimizer calls the schedule), and
  `@linear_scaling()` as a schedule's learning_rate (disttrain.graph.schedules)
- inputs: `@synthetic_input`, `@tfrecord_input`, `@sequence_input`, `@imagenet_input`,
  `@criteo_synthetic_input`, `@criteo_tfrecord_input` (uncalled)
"""

from __future__ import annotations

import gin
import tensorflow as tf

import model_zoo
from disttrain import strategies
from disttrain.base.config import TrainConfig
from disttrain.graph import schedules
from disttrain.graph.optimizers import LazyAdamOptimizer
from model_zoo import imagenet, inputs
from model_zoo.base import Regularization

v1 = tf.compat.v1

_REGISTERED: dict = {}


def register_all() -> None:
    """Register everything once (gin refuses a second registration)."""
    if _REGISTERED:
        return
    _REGISTERED["TrainConfig"] = gin.external_configurable(TrainConfig, "TrainConfig")
    for name in model_zoo.names():
        gin.external_configurable(model_zoo.get(name), name)
    for cls in strategies.concrete():  # TFDefault too: TF's default layout, for the benchmark
        gin.external_configurable(cls, cls.__name__)
    gin.external_configurable(v1.train.AdamOptimizer, "Adam")
    gin.external_configurable(LazyAdamOptimizer, "LazyAdam")
    gin.external_configurable(v1.train.AdagradOptimizer, "Adagrad")
    gin.external_configurable(v1.train.GradientDescentOptimizer, "SGD")
    gin.external_configurable(v1.train.MomentumOptimizer, "Momentum")
    gin.external_configurable(v1.train.RMSPropOptimizer, "RMSProp")
    gin.external_configurable(schedules.Constant, "constant_lr")
    gin.external_configurable(schedules.Piecewise, "piecewise_lr")
    gin.external_configurable(schedules.Cosine, "cosine_lr")
    gin.external_configurable(schedules.Exponential, "exponential_lr")
    gin.external_configurable(Regularization, "regularization")
    gin.external_configurable(schedules.linear_scaling, "linear_scaling")
    gin.external_configurable(inputs.synthetic, "synthetic_input")
    gin.external_configurable(inputs.tfrecord, "tfrecord_input")
    gin.external_configurable(inputs.sequence, "sequence_input")
    gin.external_configurable(imagenet.imagenet, "imagenet_input")
    gin.external_configurable(inputs.criteo_synthetic, "criteo_synthetic_input")
    gin.external_configurable(inputs.criteo_tfrecord, "criteo_tfrecord_input")


def train_config() -> TrainConfig:
    """A TrainConfig with the parsed gin bindings applied."""
    register_all()
    return _REGISTERED["TrainConfig"]()
