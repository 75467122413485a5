"""One real training step of every full-size model on CPU (batch 2 at the model's image size).

Checks what the unit tests cannot afford: the full graphs differentiate,
the step runs, the loss is finite, the weights move and batch norm's moving
statistics are updated by the step. About three minutes on a 2-core machine.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf

import model_zoo

tf.compat.v1.disable_eager_execution()
v1 = tf.compat.v1

pytestmark = pytest.mark.slow

MODELS = {
    "resnet50": ("resnet", {"depth": 50}),
    "resnet101": ("resnet", {"depth": 101}),
    "resnet152": ("resnet", {"depth": 152}),
    "inception_v3": ("inception_v3", {}),
    "alexnet": ("alexnet", {}),
    "vgg16": ("vgg16", {}),
}
HAS_BATCH_NORM = {"resnet50", "resnet101", "resnet152", "inception_v3"}


# ResNet-101 and -152 are ResNet-50's blocks, more of them (96 s of CI's time on a slow CPU): extended.
@pytest.mark.parametrize(
    "model_id",
    [
        pytest.param(m, marks=[pytest.mark.extended] if m in ("resnet101", "resnet152") else [])
        for m in MODELS
    ],
)
def test_one_training_step_at_full_size(model_id):
    name, params = MODELS[model_id]
    model = model_zoo.get(name)(**params)
    start = time.perf_counter()
    with tf.Graph().as_default():
        features = tf.random.uniform((2,) + tuple(model.input_shape), seed=1)
        labels = tf.constant([3, model.num_classes - 1])
        logits = model(features, training=True)
        loss = model.loss(logits, labels)
        updates = v1.get_collection(v1.GraphKeys.UPDATE_OPS)
        with tf.control_dependencies(updates):
            train_op = v1.train.GradientDescentOptimizer(0.01).minimize(loss)
        moving = v1.get_collection(v1.GraphKeys.MOVING_AVERAGE_VARIABLES)
        last = v1.trainable_variables()[-2]  # the classifier's weights
        built = time.perf_counter()
        config = v1.ConfigProto()
        # Grappler takes longer to optimise these 10k-30k op graphs than the one step takes to run.
        config.graph_options.rewrite_options.disable_meta_optimizer = True
        with v1.Session(config=config) as sess:
            sess.run(v1.global_variables_initializer())
            before, last_before = sess.run([moving, last])
            ran = time.perf_counter()
            _, value = sess.run([train_op, loss])
            stepped = time.perf_counter()
            after, last_after = sess.run([moving, last])
    print(
        f"{model_id}: build {built - start:.1f}s, init {ran - built:.1f}s, "
        f"step {stepped - ran:.1f}s, loss {value:.3f}"
    )
    assert np.isfinite(value)
    assert logits.shape.as_list() == [2, model.num_classes]
    assert not np.array_equal(last_before, last_after), "the step did not change the classifier's weights"
    assert len(updates) == len(moving)
    if model_id in HAS_BATCH_NORM:
        assert moving, f"{model_id} should have batch norm moving statistics"
        unchanged = [v.op.name for v, b, a in zip(moving, before, after, strict=True) if np.array_equal(b, a)]
        assert not unchanged, f"moving statistics not updated by the step: {unchanged[:5]}"
    else:
        assert not moving
