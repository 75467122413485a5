"""Shared test set-up: graph mode for the whole test process, repo on sys.path."""

import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()


@pytest.fixture
def fresh_console():
    """disttrain's console handler made anew for the test, so it writes to this test's captured stdout.

    `fit` adds the handler once per process, on the sys.stdout of that moment:
    in-process tests that call `fit` would write to an earlier test's closed capture.
    """

    def drop():
        logger = logging.getLogger("disttrain")
        for handler in [h for h in logger.handlers if getattr(h, "_disttrain", False)]:
            logger.removeHandler(handler)

    drop()
    yield
    drop()
