"""The README's code runs as written (in one local process)."""

import os
import re

import pytest
import tensorflow as tf

from tests import REPO


def python_blocks():
    with open(os.path.join(REPO, "README.md")) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


@pytest.mark.parametrize("strategy", ["async", "sync", "allreduce"])
def test_own_model_example_trains(monkeypatch, strategy):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("STRATEGY", strategy)
    blocks = python_blocks()
    assert blocks
    for code in blocks:
        with tf.Graph().as_default():
            namespace = {}
            exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102
            assert namespace["train_op"] is not None and namespace["loss_value"] > 0
