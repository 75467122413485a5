"""0.1.0's module paths still import, warn once with the new path, and are the moved modules themselves.

`disttrain.placement`, `from disttrain.errors import NoFilesError`, the
attribute `disttrain.local` and the split `disttrain.servers` are what
users' code and docs of 0.1.0 wrote. Each old path is imported afresh
(dropped from sys.modules first) so that its warning is seen here, whatever
imported it before.
"""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import disttrain
from disttrain import _moved


def _fresh(old: str):
    sys.modules.pop(old, None)
    disttrain.__dict__.pop(old.rpartition(".")[2], None)  # the attribute an earlier import set
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    return module, [w for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_path_warns_with_its_new_path(old):
    module, said = _fresh(old)
    new = _moved.MOVED[old]
    assert len(said) == 1, f"import {old}: {len(said)} DeprecationWarnings, expected 1"
    assert all(name in str(said[0].message) for name in new), str(said[0].message)
    if len(new) == 1:
        assert module is importlib.import_module(new[0]), f"{old} is not {new[0]} itself"
        assert module.__spec__.name == new[0], "the alias must not rename the moved module's spec"
    else:
        for part in map(importlib.import_module, new):
            public = [n for n in vars(part) if not n.startswith("__") and callable(getattr(part, n))]
            assert all(getattr(module, n) is getattr(part, n) for n in public if n in part.__dict__)


def test_users_documented_imports_of_0_1_0_still_work():
    _fresh("disttrain.errors")
    _fresh("disttrain.input_context")
    from disttrain.base.errors import NoFilesError
    from disttrain.errors import NoFilesError as old_error
    from disttrain.graph.input_context import shard_files
    from disttrain.input_context import shard_files as old_shard_files

    assert old_error is NoFilesError and old_shard_files is shard_files


def test_an_old_path_as_an_attribute_of_disttrain():
    sys.modules.pop("disttrain.local", None)
    disttrain.__dict__.pop("local", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        free_port = disttrain.local.free_port
    from disttrain.edges.local import free_port as new

    assert free_port is new
    assert any("disttrain.edges.local" in str(w.message) for w in caught)


def test_a_name_that_never_was_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        disttrain.nothing_here  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("disttrain.nothing_here")
    split, _ = _fresh("disttrain.servers")
    with pytest.raises(AttributeError, match="'disttrain.servers' has no attribute 'nothing_here'"):
        split.nothing_here  # noqa: B018


def test_new_code_uses_no_old_path():
    """The aliases are for users' code: nothing in the packages or the tests imports an old path."""
    import ast
    import os

    from tests import REPO

    old = set(_moved.MOVED)
    wrong = []
    for top in ("disttrain", "model_zoo", "tests", "bin"):
        for directory, subdirs, files in os.walk(os.path.join(REPO, top)):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            for f in files:
                if not f.endswith(".py") or f == "test_moved.py":
                    continue
                path = os.path.join(directory, f)
                with open(path, encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())
                for node in ast.walk(tree):
                    names = []
                    if isinstance(node, ast.Import):
                        names = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                    wrong += [f"{os.path.relpath(path, REPO)}:{node.lineno} {n}" for n in names if n in old]
    assert not wrong, "imports of deprecated paths: " + "; ".join(wrong)
