"""How a task ends is one table (disttrain.runtime.endings), and the table holds to the code.

docs/design.md's table is generated from ENDINGS (test_tables checks that
it is not stale). Here: every code name a row gives in backticks
(`trainer._StopAtStep.after_run`, `ps_serving.signal_done`,
`SyncAllReduce.summed`) is a module of disttrain and a name in it, or a
class and its attribute; and every exit code a row names is one the errors
define (or Ctrl-C's 130).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re

import pytest

import disttrain
from disttrain.runtime import endings

_CODE = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)`")


def _modules() -> dict[str, list]:
    """disttrain's modules by their last name (`trainer` -> disttrain.runtime.trainer)."""
    found: dict[str, list] = {}
    root = os.path.dirname(disttrain.__file__)
    for info in pkgutil.walk_packages([root], "disttrain."):
        skipped = ("disttrain.scripts", "disttrain.bench", "disttrain.plan", "disttrain._moved")
        if info.name.startswith(skipped):  # the console's flags and the analysis tools: no task ends there
            continue
        found.setdefault(info.name.rpartition(".")[2], []).append(importlib.import_module(info.name))
    return found


def _resolves(name: str, modules: dict[str, list]) -> bool:
    first, *rest = name.split(".")
    starts = list(modules.get(first, []))
    # A class named first (`SyncAllReduce.summed`, `_Aggregator.end`), wherever it is defined.
    starts += [getattr(m, first) for ms in modules.values() for m in ms if first in vars(m)]
    for obj in starts:
        for attr in rest:
            obj = getattr(obj, attr, None)
            if obj is None:
                break
        else:
            return True
    return False


def _names() -> list[str]:
    cells = [cell for e in endings.ENDINGS for cell in (e.decides, e.peers_learn)]
    return sorted({name for cell in cells for name in _CODE.findall(cell)})


def test_every_code_name_in_the_table_exists():
    modules = _modules()
    missing = [n for n in _names() if not n.endswith(".py") and not _resolves(n, modules)]
    assert not missing, f"disttrain.runtime.endings names code that does not exist: {missing}"


def test_the_check_finds_a_name_that_is_gone():
    assert not _resolves("trainer._NoSuchHook", _modules())
    assert _resolves("trainer._StopAtStep.after_run", _modules())


@pytest.mark.parametrize("ending", endings.ENDINGS, ids=lambda e: e.what[:40])
def test_every_exit_code_is_a_defined_one(ending):
    codes = [int(c) for c in re.findall(r"\b\d{1,3}\b", ending.exit)]
    assert codes or "code" in ending.exit, f"{ending.what!r}: no exit code"
    unknown = [c for c in codes if c not in endings.EXIT_CODES]
    assert not unknown, f"{ending.what!r} names exit codes no error defines: {unknown}"
