"""Shared test set-up: graph mode for the whole test process, repo on sys.path, the quick tier.

Tiers (DESIGN.md, "Tests"): README's test command runs `-m quick`, CI runs it and then
`-m "not quick and not extended"`; `-m extended` (long soaks, heavy repeats) is run by hand.
Every test under tests/unit is quick; anywhere else a test is quick only when it is marked
`@pytest.mark.quick`, so a test added without a thought goes to the full tier.
"""

import logging
import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

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


UNIT = os.path.join(REPO, "tests", "unit")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: it must see the marker
def pytest_collection_modifyitems(items):
    for item in items:
        if os.path.commonpath([str(item.path), UNIT]) == UNIT:
            item.add_marker(pytest.mark.quick)
