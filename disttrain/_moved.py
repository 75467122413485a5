"""The module paths of disttrain 0.1.0, kept as deprecated aliases of where each module went.

disttrain 0.1.0 was 29 flat modules; they now live in one subpackage per
layer (docs/layout.md). `import disttrain.placement`, `from disttrain.errors
import NoFilesError` and `disttrain.local.free_port` keep working, with a
DeprecationWarning that names the new path: the alias is the moved module
itself, so its names, private ones and monkeypatching included, are the
new module's. `disttrain.servers` was split in three; its alias looks a
name up in each part in turn. The aliases go in disttrain 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

# old path -> the new module (or, for a module that was split, its parts)
MOVED: dict[str, tuple[str, ...]] = {
    **{
        f"disttrain.{name}": (f"disttrain.{layer}.{name}",)
        for layer, names in {
            "base": (
                "errors",
                "cluster",
                "config",
                "deadlines",
                "logs",
                "quiet",
                "tf_internals",
                "preemption",
            ),
            "graph": (
                "placement",
                "input_context",
                "input_feeds",
                "run_steps",
                "clipping",
                "schedules",
                "optimizers",
            ),
            "runtime": ("watchdog", "recovery", "trainer", "evaluation", "exporting", "metrics"),
            "edges": ("cli", "configurables", "zoo_run", "local", "private_network"),
            "plan": ("traffic",),
        }.items()
        for name in names
    },
    "disttrain.servers": (
        "disttrain.runtime.peers",
        "disttrain.runtime.ps_serving",
        "disttrain.base.tf_errors",
    ),
}


def _warn(old: str, new: tuple[str, ...]) -> None:
    warnings.warn(
        f"{old} has moved to {' and '.join(new)}; import it from there ({old} goes in disttrain 0.3)",
        DeprecationWarning,
        stacklevel=3,
    )


class _Split(types.ModuleType):
    """A module that was split: a name is looked up in each part in turn."""

    def __init__(self, name: str, parts: tuple[types.ModuleType, ...]):
        super().__init__(name, f"deprecated: {name}, now {', '.join(p.__name__ for p in parts)}")
        self._parts = parts

    def __getattr__(self, attr: str):
        for part in self._parts:
            if hasattr(part, attr):
                return getattr(part, attr)
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")

    def __dir__(self):
        return sorted({n for part in self._parts for n in dir(part)})


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the moved module itself."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

    def create_module(self, spec):
        new = MOVED[spec.name]
        _warn(spec.name, new)
        parts = tuple(importlib.import_module(name) for name in new)
        if len(parts) > 1:
            return _Split(spec.name, parts)
        module = parts[0]
        # The import system is about to give the module the alias's spec: keep its own.
        self._own = getattr(self, "_own", {})
        self._own[spec.name] = (module.__spec__, module.__loader__)
        return module

    def exec_module(self, module):
        own = getattr(self, "_own", {}).pop(module.__spec__.name, None)
        if own is not None:
            module.__spec__, module.__loader__ = own


def install() -> None:
    """Put the aliases on the import path, once per process."""
    if not any(isinstance(finder, _Aliases) for finder in sys.meta_path):
        sys.meta_path.append(_Aliases())


def attribute(name: str):
    """`disttrain.<name>` for an old module path read as an attribute (module `__getattr__`)."""
    if f"disttrain.{name}" not in MOVED:
        raise AttributeError(f"module 'disttrain' has no attribute {name!r}")
    return importlib.import_module(f"disttrain.{name}")
