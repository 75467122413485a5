"""Every zoo model trains under every strategy on a real cluster: the step reaches the end, the model moves.

The guard for the class of issue 20, where SyncAllReduce ran steps that
applied nothing for CIFAR-10, AlexNet and VGG16 while every other model and
the one-process smoke test were fine. Each cell starts a real cluster (2
workers; plus 1 PS for the PS strategies) of bin/train.py processes on the
model's experiment file with the tiny overlay, and checks what training
means, not only that it ended: every task exits 0, every replica's global
step reaches the last step, its logged loss changes, and the last
checkpoint's variables differ from the first one's.
"""

from __future__ import annotations

import glob
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from tests import REPO
from tests.cluster.helpers import TINY, describe_failure, run_cluster, scalars

pytestmark = pytest.mark.cluster

STEPS = 20
# One experiment file per zoo model and ResNet depth (the shipped files that bind each).
EXPERIMENTS = {
    "alexnet": "gin/alexnet_sync.gin",
    "cifar10": "gin/cifar10_async.gin",
    "dlrm": "gin/dlrm_sync.gin",
    "inception_v3": "gin/inception_v3_sync.gin",
    "mlp": "gin/mlp_sync.gin",
    "resnet50": "gin/resnet50_sync.gin",
    "resnet152": "gin/resnet152_sync.gin",
    "vgg16": "gin/vgg16_sync.gin",
}
SLOW = {"inception_v3", "resnet152"}  # the largest graphs of the tiny overlay: the longest cells
STRATEGIES = {"async_ps": 1, "sync_ps": 1, "allreduce": 0, "hybrid": 1}  # strategy -> PS tasks
GIN_STRATEGY = {
    "async_ps": "AsyncParameterServer",
    "sync_ps": "SyncParameterServer",
    "allreduce": "SyncAllReduce",
    "hybrid": "SyncHybrid",
}


def test_every_zoo_model_is_in_the_matrix():
    import model_zoo

    registered = {"resnet50": "resnet", "resnet152": "resnet"}  # depths of the registry's "resnet"
    assert {registered.get(name, name) for name in EXPERIMENTS} == set(model_zoo.names())
    for path in EXPERIMENTS.values():
        assert os.path.exists(os.path.join(REPO, path)), path


def checkpoint(path: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize(
    "model", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m for m in EXPERIMENTS]
)
def test_model_trains_under_strategy_on_a_real_cluster(tmp_path, model, strategy):
    cluster, codes = run_cluster(
        tmp_path,
        [os.path.join(REPO, EXPERIMENTS[model]), os.path.join(REPO, TINY)],
        timeout=300,
        num_ps=STRATEGIES[strategy],
        num_workers=2,
        gin_params=[
            f"TrainConfig.strategy=@{GIN_STRATEGY[strategy]}",
            f"TrainConfig.train_steps={STEPS}",
            "TrainConfig.log_every_steps=1",
            "TrainConfig.save_checkpoint_steps=10",
        ],
    )
    assert set(codes.values()) == {0}, (codes, describe_failure(cluster))
    logdir = str(tmp_path / "logdir")
    losses = []
    for task_dir in sorted(glob.glob(os.path.join(logdir, "tasks", "worker_*"))):
        with open(os.path.join(task_dir, "result.json")) as f:
            result = json.load(f)
        assert result["global_step"] >= STEPS, (task_dir, result)
        losses += [value for _, value in scalars(task_dir, "loss")]
    # Async: a replica may run only a few of the steps, so the loss is judged over the cluster.
    assert len(set(losses)) > 1, losses
    saved = sorted(
        int(m.group(1))
        for p in glob.glob(os.path.join(logdir, "model.ckpt-*.index"))
        if (m := re.search(r"ckpt-(\d+)\.index$", p))
    )
    assert saved[0] == 0 and saved[-1] >= STEPS, saved
    first = checkpoint(os.path.join(logdir, f"model.ckpt-{saved[0]}"))
    last = checkpoint(os.path.join(logdir, f"model.ckpt-{saved[-1]}"))
    moved = [
        name
        for name, value in first.items()
        if value.dtype.kind == "f" and not np.array_equal(value, last[name])
    ]
    assert moved, f"no variable changed between steps {saved[0]} and {saved[-1]}"
