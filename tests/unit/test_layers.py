"""The import graph keeps the layers: a module imports only from its own layer and those below it.

The layers, lowest first, and what each may import (docs/design.md#rooms;
each layer's `__init__.py` docstring says the same in its "May import:"
line, and a test here holds the two together):

    base        disttrain/base/        nothing of disttrain's
    graph       disttrain/graph/       base
    strategies  disttrain/strategies/  base, graph
    runtime     disttrain/runtime/     base, graph, strategies
    launch      disttrain/launch.py    base, graph, strategies, runtime
    model_zoo   model_zoo/             base, graph
    edges       disttrain/edges/       the core (base to launch), model_zoo
    plan        disttrain/plan/        the core, model_zoo, edges
    bench       disttrain/bench/       the core, model_zoo, edges, plan
    console     disttrain/scripts/     everything

`disttrain/__init__.py` (the public API, "api") re-exports from the core;
the edges and the analysis tools may import it. `disttrain/_moved.py`
(0.1.0's module paths as deprecated aliases) names modules only as text.
The analysis tools (plan, bench) and the console are never imported by the
core, the zoo or the edges. Only the edges and the console import gin or
absl (no flags read inside the library). Every import counts, at the top of a module or
inside a function: the rule is about what a module's code uses. Programs
run by file path (the TF 2 peers, the transport probe's task) import no
disttrain at all. Pure Python (ast): no TensorFlow.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

from tests import REPO

CORE = ("base", "graph", "strategies", "runtime", "launch")
MAY_IMPORT = {
    "base": (),
    "graph": ("base",),
    "strategies": ("base", "graph"),
    "runtime": ("base", "graph", "strategies"),
    "launch": ("base", "graph", "strategies", "runtime"),
    "model_zoo": ("base", "graph"),
    "edges": (*CORE, "api", "model_zoo"),
    "plan": (*CORE, "api", "model_zoo", "edges"),
    "bench": (*CORE, "api", "model_zoo", "edges", "plan"),
    "console": (*CORE, "api", "model_zoo", "edges", "plan", "bench"),
    "api": (*CORE, "moved"),
    "moved": (),
}
# Only these read flags or gin (the edges and the console; gin at the edges).
READ_FLAGS_OR_GIN = ("edges", "console")
# Where each layer lives: a package folder, or one module.
HOME = {
    "base": "disttrain/base",
    "graph": "disttrain/graph",
    "strategies": "disttrain/strategies",
    "runtime": "disttrain/runtime",
    "launch": "disttrain/launch.py",
    "model_zoo": "model_zoo",
    "edges": "disttrain/edges",
    "plan": "disttrain/plan",
    "bench": "disttrain/bench",
    "console": "disttrain/scripts",
    "api": "disttrain/__init__.py",
    "moved": "disttrain/_moved.py",
}
# Run by file path in a process of their own: no disttrain import at all.
RUN_BY_PATH = ("disttrain/bench/peers/", "disttrain/bench/probe_task.py")


def module_files() -> list[str]:
    found = []
    for package in ("disttrain", "model_zoo"):
        for directory, subdirs, files in os.walk(os.path.join(REPO, package)):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            found += [
                os.path.relpath(os.path.join(directory, f), REPO).replace(os.sep, "/")
                for f in files
                if f.endswith(".py")
            ]
    return sorted(found)


def layer_of_file(path: str) -> str | None:
    for layer, home in HOME.items():
        if path == home or path.startswith(home + "/"):
            return layer
    return None


def _path_of_module(name: str) -> str | None:
    """The file a dotted module name is, or None when it is not a module (a name inside one)."""
    base = os.path.join(REPO, *name.split("."))
    if os.path.isfile(base + ".py"):
        return "/".join(name.split(".")) + ".py"
    if os.path.isfile(os.path.join(base, "__init__.py")):
        return "/".join(name.split(".")) + "/__init__.py"
    return None


def _imports(path: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in the file; `from a.b import c` is a.b.c if that is a module."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [
                (
                    node.lineno,
                    f"{node.module}.{a.name}" if _path_of_module(f"{node.module}.{a.name}") else node.module,
                )
                for a in node.names
            ]
    return out


def imported_files(path: str) -> list[tuple[int, str]]:
    """(line, file) of each disttrain or model_zoo module imported (`from disttrain import fit`: the API)."""
    out = []
    for line, name in _imports(path):
        if name.split(".")[0] not in ("disttrain", "model_zoo"):
            continue
        target = _path_of_module(name)
        while target is None and "." in name:
            name = name.rpartition(".")[0]
            target = _path_of_module(name)
        if target is not None:
            out.append((line, target))
    return out


def test_every_module_has_a_layer():
    homeless = [p for p in module_files() if layer_of_file(p) is None and not p.startswith(RUN_BY_PATH)]
    assert not homeless, f"modules in no layer (give each a home in a layer's package): {homeless}"


def violations() -> list[str]:
    found = []
    for path in module_files():
        if path.startswith(RUN_BY_PATH):
            continue
        layer = layer_of_file(path)
        for line, target in imported_files(path):
            theirs = layer_of_file(target)
            if theirs == layer or theirs in MAY_IMPORT[layer]:
                continue
            found.append(f"{path}:{line} ({layer}) imports {target} ({theirs})")
    return found


def test_imports_keep_the_layers():
    wrong = violations()
    assert not wrong, (
        "imports against the layers (docs/design.md#rooms; a module may import its own layer and those "
        "below it): " + "; ".join(wrong)
    )


def test_programs_run_by_path_import_no_disttrain():
    for path in module_files():
        if path.startswith(RUN_BY_PATH):
            wrong = [t for _, t in imported_files(path) if t.startswith("disttrain")]
            assert not wrong, (
                f"{path} is run by path and must not import disttrain (graph mode for the process): {wrong}"
            )


def _third_party(path: str) -> list[tuple[int, str]]:
    return [(line, name.split(".")[0]) for line, name in _imports(path)]


def test_only_the_edges_and_the_console_import_gin_or_absl():
    wrong = [
        f"{path}:{line} imports {name}"
        for path in module_files()
        if layer_of_file(path) not in READ_FLAGS_OR_GIN and not path.startswith(RUN_BY_PATH)
        for line, name in _third_party(path)
        if name in ("gin", "absl")
    ]
    assert not wrong, "gin and absl belong to the edges (disttrain/edges, disttrain/scripts): " + "; ".join(
        wrong
    )


_MAY_IMPORT_LINE = re.compile(r"^May import: (.+?)\.?$", re.M)


@pytest.mark.parametrize("layer", [name for name, home in HOME.items() if not home.endswith(".py")])
def test_each_layer_package_says_what_it_may_import(layer):
    init = os.path.join(REPO, HOME[layer], "__init__.py")
    with open(init, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    said = _MAY_IMPORT_LINE.search(doc)
    assert said, f"{HOME[layer]}/__init__.py's docstring has no 'May import: ...' line"
    words = {w.strip() for w in re.split(r",|\band\b", said.group(1))}
    expected = set(MAY_IMPORT[layer]) or {"nothing of disttrain's"}
    assert words == expected, (
        f"{HOME[layer]}/__init__.py says it may import {sorted(words)}; the rule is {sorted(expected)}"
    )


def test_a_wrong_import_is_found(tmp_path, monkeypatch):
    """The check itself: a base module importing the runtime is reported."""
    import tests.unit.test_layers as me

    wrong = os.path.join(REPO, "disttrain", "base", "_layers_probe.py")
    with open(wrong, "w", encoding="utf-8") as f:
        f.write("from disttrain.runtime import trainer\n")
    try:
        assert any(
            "disttrain/base/_layers_probe.py:1 (base) imports disttrain/runtime/trainer.py" in v
            for v in me.violations()
        )
    finally:
        os.remove(wrong)
