"""Shared test set-up: graph mode for the whole test process, repo on sys.path."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()
