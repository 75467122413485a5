"""docs/layout.md lists every module of disttrain/ and model_zoo/, and no module that has gone.

A module is a .py file anywhere under the two packages (subpackages and
programs run by path included); the page names each as a backticked path
from the repository's root, `disttrain/strategies/base.py`. Pure Python: no
TensorFlow.
"""

from __future__ import annotations

import collections
import os
import re

from tests import REPO

PACKAGES = ("disttrain", "model_zoo")
PAGE = os.path.join(REPO, "docs", "layout.md")
LISTED = re.compile(r"`((?:" + "|".join(PACKAGES) + r")/[\w/]*\w\.py)`")


def modules() -> set[str]:
    """Every .py file under the packages, as a path from the repository's root."""
    found = set()
    for package in PACKAGES:
        for directory, subdirs, files in os.walk(os.path.join(REPO, package)):
            subdirs[:] = [d for d in subdirs if d != "__pycache__" and not d.startswith(".")]
            for name in files:
                if name.endswith(".py"):
                    found.add(os.path.relpath(os.path.join(directory, name), REPO).replace(os.sep, "/"))
    return found


def listed() -> list[str]:
    with open(PAGE, encoding="utf-8") as f:
        return LISTED.findall(f.read())


def test_every_module_is_listed_in_docs_layout():
    missing = sorted(modules() - set(listed()))
    assert not missing, (
        "docs/layout.md does not list these modules; give each one line in the table of its layer: "
        + ", ".join(missing)
    )


def test_docs_layout_lists_no_module_that_is_gone():
    gone = sorted(set(listed()) - modules())
    assert not gone, "docs/layout.md lists modules that no longer exist: " + ", ".join(gone)


def test_docs_layout_lists_each_module_once():
    twice = sorted(name for name, n in collections.Counter(listed()).items() if n > 1)
    assert not twice, "docs/layout.md lists these modules more than once: " + ", ".join(twice)
