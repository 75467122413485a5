"""Shared test set-up: graph mode for the whole test process, repo on sys.path, the quick tier.

Tiers (docs/design.md, "Tests"): README's test command runs `-m quick`, CI runs it and then
`-m "not quick and not extended"`; `-m extended` (long soaks, heavy repeats) is run by hand.
Every test under tests/unit is quick; anywhere else a test is quick only when it is marked
`@pytest.mark.quick`, so a test added without a thought goes to the full tier.
"""

import logging
import os
import sys

import gin
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# disttrain first, as users are told to import it: it keeps TensorFlow's start-up lines (oneDNN,
# "before absl::InitializeLog") off stderr, where xdist would relay them after the summary.
import disttrain  # noqa: E402, F401

# isort: split
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()


@pytest.fixture(autouse=True)
def _disttrain_logger_fresh():
    """disttrain's logger as a new process has it, before and after every test.

    `fit` and the entry points add a console handler once per process, on the
    sys.stdout of that moment (a test's capture, or a module fixture's), and
    turn propagation off. Left in place, a later test's lines would go to that
    closed capture ("I/O operation on closed file") or past caplog, depending
    on which test the worker happened to run before.
    """

    def fresh():
        logger = logging.getLogger("disttrain")
        for handler in [h for h in logger.handlers if getattr(h, "_disttrain", False)]:
            logger.removeHandler(handler)
        logger.propagate, logger.level = True, logging.NOTSET

    fresh()
    yield
    fresh()


@pytest.fixture(autouse=True)
def _gin_fresh():
    """gin's config as a new process has it, before and after every test: unlocked, no bindings.

    `cli.train_config` (and so every gin entry point) parses its files and locks the config.
    Left locked, a later test that declares a configurable fails with gin's "Attempted to add
    a new configurable after the config was locked", and a later parse inherits stale bindings,
    depending on which test the process happened to run before.
    """
    gin.clear_config()
    yield
    gin.clear_config()


UNIT = os.path.join(REPO, "tests", "unit")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: it must see the marker
def pytest_collection_modifyitems(items):
    for item in items:
        if os.path.commonpath([str(item.path), UNIT]) == UNIT:
            item.add_marker(pytest.mark.quick)
