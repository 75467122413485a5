"""The zoo's recipes as published: each gin file's learning rate by its formula; decay on kernels only."""

from __future__ import annotations

import math
import re

import gin
import numpy as np
import pytest
import tensorflow as tf

from disttrain.edges import cli
from disttrain.graph import schedules
from model_zoo import layers
from model_zoo.base import Regularization

v1 = tf.compat.v1
IMAGENET = 1281167


@pytest.fixture(autouse=True)
def fresh_gin():
    gin.clear_config()  # cli.train_config locks the config it parsed; clearing unlocks it
    yield
    gin.clear_config()


def recipe(gin_file: str, batch: int):
    """The config of `gin_file`, and its optimizer's learning rate at a global batch of `batch`."""
    config = cli.train_config([gin_file], [])
    with tf.Graph().as_default():
        optimizer = config.optimizer()
    rate = optimizer._learning_rate  # noqa: SLF001 (the optimizer keeps what it was given)

    def at(step: int) -> float:
        if not callable(rate):
            return rate
        with schedules.global_batch(batch):
            return rate.value(step)

    return config, optimizer, at


def epoch_step(epochs: float, batch: int, per_epoch: int = IMAGENET) -> int:
    """The first global step past `epochs` epochs."""
    return math.ceil(epochs * per_epoch / batch)


@pytest.mark.parametrize("gin_file", ["gin/resnet50_sync.gin", "gin/resnet152_sync.gin"])
@pytest.mark.parametrize("batch", [256, 1024, 8192])
def test_resnet_is_goyal_et_al(gin_file, batch):
    config, optimizer, rate = recipe(gin_file, batch)
    assert isinstance(optimizer, v1.train.MomentumOptimizer) and optimizer._momentum == 0.9  # noqa: SLF001
    peak = 0.1 * batch / 256
    warmup = 5 * IMAGENET / batch
    for epochs, expected in [
        (1, peak * epoch_step(1, batch) / warmup),
        (5.5, peak),
        (29.9, peak),
        (30.1, peak / 10),
        (60.1, peak / 100),
        (80.1, peak / 1000),
    ]:
        assert rate(epoch_step(epochs, batch)) == pytest.approx(expected, rel=1e-5), epochs
    assert rate(0) == 0.0
    assert config.regularization == Regularization(weight_decay=1e-4)


def test_inception_v3_is_szegedy_et_al():
    config, optimizer, rate = recipe("gin/inception_v3_sync.gin", 1600)
    assert isinstance(optimizer, v1.train.RMSPropOptimizer)
    assert (optimizer._decay, optimizer._epsilon) == (0.9, 1.0)  # noqa: SLF001
    for epochs in (0, 1.9, 2.1, 10, 51):
        expected = 0.045 * 0.94 ** math.floor(epochs / 2)
        assert rate(epoch_step(epochs, 1600)) == pytest.approx(expected, rel=1e-5), epochs
    assert config.clip_norm == 2.0
    assert config.regularization == Regularization(weight_decay=4e-5, label_smoothing=0.1)


@pytest.mark.parametrize(
    "gin_file, base, reference, boundaries",
    [("gin/alexnet_sync.gin", 0.01, 128, (30, 60, 80)), ("gin/vgg16_sync.gin", 0.01, 256, (20, 40, 60))],
)
def test_alexnet_and_vgg16_are_their_papers(gin_file, base, reference, boundaries):
    config, optimizer, rate = recipe(gin_file, 512)
    assert optimizer._momentum == 0.9  # noqa: SLF001
    peak = base * 512 / reference
    for k, epochs in enumerate((0, *boundaries)):
        assert rate(epoch_step(epochs + 0.1, 512)) == pytest.approx(peak * 0.1**k, rel=1e-5)
    assert config.regularization == Regularization(weight_decay=5e-4)


def test_cifar10_is_the_tutorial():
    config, optimizer, rate = recipe("gin/cifar10_sync.gin", 128)
    assert type(optimizer) is v1.train.GradientDescentOptimizer
    for epochs, expected in [(0, 0.1), (349, 0.1), (351, 0.01), (701, 0.001)]:
        assert rate(epoch_step(epochs, 128, 50000)) == pytest.approx(expected, rel=1e-5)
    assert config.regularization.weight_decay == 0.004


def test_dlrm_is_the_reference():
    _, optimizer, rate = recipe("gin/dlrm_sync.gin", 1024)
    assert type(optimizer) is v1.train.GradientDescentOptimizer and rate(0) == 0.1


@pytest.mark.parametrize(
    "gin_file, decayed",
    [
        ("gin/resnet50_sync.gin", r"/weights$"),
        ("gin/alexnet_sync.gin", r"/weights$"),
        ("gin/cifar10_sync.gin", r"^(local3|local4)/weights$"),  # the tutorial's two layers only
    ],
)
def test_decay_reaches_the_kernels_and_never_batch_norm_or_biases(gin_file, decayed):
    config = cli.train_config([gin_file, "gin/testing/tiny.gin"], [])
    model = config.model
    with tf.Graph().as_default():
        features = tf.zeros((2, *model.input_shape))
        with layers.kernels() as kernels:
            model(features, training=True)
        term = config.regularization.decay(kernels)
        variables = v1.trainable_variables()
        grads = dict(zip([v.op.name for v in variables], tf.gradients(term, variables), strict=True))
    touched = {name for name, g in grads.items() if g is not None}
    assert touched and touched == {name for name in grads if re.search(decayed, name)}
    assert not {n for n in touched if re.search(r"beta|gamma|biases|table", n)}
    if "resnet" in gin_file:  # batch norm is there, and untouched
        assert any("gamma" in n for n in grads)


def test_label_smoothing_is_cross_entropy_against_smoothed_one_hot():
    from model_zoo.mlp import MLP

    logits = np.array([[2.0, 0.5, -1.0], [0.0, 1.0, 3.0]], np.float32)
    labels = np.array([0, 2], np.int32)
    with tf.Graph().as_default(), v1.Session() as session:
        got = session.run(MLP().loss(tf.constant(logits), tf.constant(labels), label_smoothing=0.1))
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    targets = np.eye(3)[labels] * 0.9 + 0.1 / 3
    assert got == pytest.approx(float(-(targets * log_p).sum(1).mean()), rel=1e-5)
