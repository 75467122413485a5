"""disttrain's public surface against its committed snapshot, tests/unit/public_api.txt.

The surface, one line per item: `disttrain.__all__`; each public function's
signature (`fit`, `session`); each public class's constructor, its methods,
properties and class attributes as disttrain defines them (not what it
inherits from Python or TensorFlow; a subclass lists what it adds or
overrides), the strategies' instance attributes, the settings' fields with
their defaults; and every console script in setup.py with its flags, their
types and defaults. Annotations are left out: a type hint made more precise
breaks nobody.

The test fails on any difference, additions included: a change to the
surface is made on purpose, with a line in CHANGELOG.md, and a renamed name
keeps a deprecated alias (Strategy.config() is one). After such a change,
regenerate the snapshot from the repository's root:

    python -m tests.unit.test_public_api
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
import re
import warnings

import pytest

import disttrain
from disttrain.strategies import base
from tests import REPO
from tests.unit.test_docs import script_flags_of

SNAPSHOT = os.path.join(REPO, "tests", "unit", "public_api.txt")
REGENERATE = "python -m tests.unit.test_public_api"
HEADER = f"""\
# disttrain's public surface (tests/unit/test_public_api.py says what is in it).
# A change here is a change for users: say it under `## Unreleased` in CHANGELOG.md, keep a
# deprecated alias for a renamed name, and regenerate this file: {REGENERATE}
"""
# A cluster of each shape the strategies need, to read their instance attributes (nothing starts).
PS_CLUSTER = {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]}
WORKERS_ONLY = {"worker": ["127.0.0.1:2223", "127.0.0.1:2224"]}


class _Shown:
    """A default value printed as given: no memory address in the snapshot."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def shown(value) -> str:
    text = repr(value)
    if " at 0x" in text or text.startswith("<"):
        return getattr(value, "__qualname__", type(value).__qualname__)
    return text


def signature(obj) -> str:
    """`obj`'s parameters, kinds and defaults; no annotations."""
    try:
        sig = inspect.signature(obj)
    except ValueError:  # a class whose constructor is Python's own (an exception)
        return "(...)"
    params = [
        p.replace(
            annotation=inspect.Parameter.empty,
            default=p.default if p.default is inspect.Parameter.empty else _Shown(shown(p.default)),
        )
        for p in sig.parameters.values()
    ]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def own_members(cls, public: set[type]) -> dict[str, object]:
    """Public members `cls` gets from disttrain's classes, up to the nearest public base (not included)."""
    found: dict[str, object] = {}
    for klass in cls.__mro__:
        if klass is not cls and (klass in public or not klass.__module__.startswith("disttrain")):
            break
        for name, value in vars(klass).items():
            if not name.startswith("_") and name not in found:
                found[name] = value
    return found


def member_line(prefix: str, cls, name: str, value) -> str:
    if isinstance(value, property):
        return f"{prefix}.{name}  (property)"
    if isinstance(value, (staticmethod, classmethod)):
        kind = type(value).__name__
        return f"{prefix}.{name}{signature(getattr(cls, name))}  ({kind})"
    if inspect.isfunction(value):
        return f"{prefix}.{name}{signature(value)}"
    if inspect.isclass(value):
        return f"{prefix}.{name}  (class)"
    return f"{prefix}.{name} = {shown(value)}"


def class_lines(name: str, cls, public: set[type]) -> list[str]:
    prefix = f"disttrain.{name}"
    bases = [b.__name__ for b in cls.__bases__ if b is not object]
    lines = [f"{prefix}{signature(cls)}  (class{': ' + ', '.join(bases) if bases else ''})"]
    inherited = {
        f.name
        for b in cls.__mro__[1:]
        if b in public and dataclasses.is_dataclass(b)
        for f in dataclasses.fields(b)
    }
    if dataclasses.is_dataclass(cls):
        for field in (f for f in dataclasses.fields(cls) if f.name not in inherited):
            default = "" if field.default is dataclasses.MISSING else f" = {shown(field.default)}"
            lines.append(f"{prefix}.{field.name}{default}  (field)")
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for member, value in sorted(own_members(cls, public).items()):
        if member not in fields:
            lines.append(member_line(prefix, cls, member, value))
    return lines


def instance_attributes() -> list[str]:
    """The public attributes a strategy sets on itself when built (`strategy.loss`, `.cluster`, ...)."""
    lines = []
    for name in sorted(disttrain.__all__):
        cls = getattr(disttrain, name)
        if not (inspect.isclass(cls) and issubclass(cls, disttrain.Strategy)) or inspect.isabstract(cls):
            continue
        jobs = PS_CLUSTER if cls.uses_ps else WORKERS_ONLY
        strategy = cls(disttrain.Cluster(jobs, "worker", 0))
        attributes = sorted(a for a in vars(strategy) if not a.startswith("_"))
        lines.append(f"disttrain.{name}(...) instance: {', '.join(attributes)}")
    return lines


def console_scripts() -> dict[str, str]:
    """Console script -> its module, as setup.py declares them."""
    with open(os.path.join(REPO, "setup.py")) as f:
        return dict(re.findall(r'"(disttrain-[\w-]+)=([\w.]+):run"', f.read()))


def flag_lines() -> list[str]:
    lines = []
    for script, module in sorted(console_scripts().items()):
        lines.append(f"{script}  (console script, {module})")
        for name, flag in sorted(script_flags_of(module).items()):
            kind = flag.flag_type()
            if getattr(flag.parser, "enum_values", None):
                kind += f" of {sorted(flag.parser.enum_values)}"
            lines.append(f"{script} --{name}  ({kind}, default {shown(flag.default)})")
    return lines


def snapshot() -> str:
    public = {getattr(disttrain, n) for n in disttrain.__all__ if inspect.isclass(getattr(disttrain, n))}
    lines = [f"disttrain.__all__ = {sorted(disttrain.__all__)}"]
    for name in sorted(disttrain.__all__):
        obj = getattr(disttrain, name)
        if inspect.isclass(obj):
            lines += class_lines(name, obj, public)
        else:
            lines.append(f"disttrain.{name}{signature(obj)}")
    return HEADER + "\n".join(lines + instance_attributes() + flag_lines()) + "\n"


def test_public_surface_matches_the_snapshot():
    with open(SNAPSHOT) as f:
        committed = f.read()
    now = snapshot()
    diff = "".join(difflib.unified_diff(committed.splitlines(True), now.splitlines(True), "committed", "now"))
    if now != committed:
        pytest.fail(
            "disttrain's public surface changed. If on purpose: say so under '## Unreleased' in "
            "CHANGELOG.md (a renamed name keeps a deprecated alias), then regenerate the snapshot: "
            f"{REGENERATE}\n{diff}",
            pytrace=False,
        )


def test_the_snapshot_covers_what_users_call():
    """Not vacuous: the names README and docs/own_model.md use are in it, with their signatures."""
    now = snapshot()
    for line in (
        "disttrain.fit(loss_fn, optimizer_fn, *, steps, logdir, strategy=None",
        "disttrain.session(strategy, *, steps, logdir,",
        "disttrain.AsyncParameterServer(cluster, num_towers=None",
        "disttrain.SyncParameterServer(cluster, backup_workers=0, num_towers=None",
        "disttrain.SyncAllReduce(cluster, bucket_bytes=",
        "disttrain.Strategy.scope(self)",
        "disttrain.Strategy.minimize(self, optimizer, loss",
        "disttrain.Strategy.hooks(self, last_step=None, notice=None)",
        "disttrain.Strategy.session_config(self, intra_op_threads=0, inter_op_threads=0)",
        "disttrain.Strategy.config(self, intra_op_threads=0, inter_op_threads=0)",
        "disttrain.RunSettings.log_every_steps = 100  (field)",
        "disttrain-train --gin_file  (multi string, default [])",
    ):
        assert line in now, line
    assert "disttrain.Strategy.loss  (property)" in now


def test_config_is_a_deprecated_alias_of_session_config_that_warns_once(monkeypatch):
    """Renamed session_config() in 0.1.0 without an alias; a user's `config=strategy.config()` works again."""
    monkeypatch.setattr(base, "_WARNED", set())
    strategy = disttrain.SyncAllReduce(disttrain.Cluster(WORKERS_ONLY, "worker", 1), num_towers=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = strategy.config(3, 4), strategy.config()
    assert first == strategy.session_config(3, 4) and second == strategy.session_config()
    assert first.device_count["CPU"] == 2 and first.intra_op_parallelism_threads == 3  # the subclass's
    (warning,) = caught  # once, not once per call
    assert warning.category is DeprecationWarning and warning.filename == __file__  # the caller's line
    assert "Strategy.config() is deprecated: use Strategy.session_config()" in str(warning.message)


if __name__ == "__main__":
    with open(SNAPSHOT, "w") as f:
        f.write(snapshot())
    print(f"wrote {os.path.relpath(SNAPSHOT)}")
