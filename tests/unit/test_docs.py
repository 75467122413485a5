"""README.md and docs/*.md: every relative link resolves, and every command names only real flags.

Links: `[text](path#anchor)` outside code, relative to the page; the path
must exist, and an anchor must be a heading of the target page, slugified
as GitHub does. Commands: each line of a code block (backslash continuations
joined) that runs `python bin/<script>.py` or a `disttrain-*` console script; its
`--flag`, `--flag=value` and `--noflag` tokens are checked against the flags
the script's module defines, read from absl after importing it. No
subprocess: the modules are imported here, one at a time.
"""

from __future__ import annotations

import glob
import importlib
import os
import re
import shlex
import sys

import pytest
from absl import flags

from tests import REPO

PAGES = [
    *(os.path.join(REPO, page) for page in ("README.md", "CONTRIBUTING.md", "BUILD_NOTES.md")),
    *sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)),
]

# bin/ script and console script -> the module that defines its flags (as setup.py declares them).
SCRIPTS = {
    "train": "disttrain.scripts.train",
    "launch_local": "disttrain.scripts.launch_local",
    "benchmark": "disttrain.scripts.benchmark",
    "plan": "disttrain.scripts.plan",
    "link_probe": "disttrain.scripts.link_probe",
    "accuracy": "disttrain.scripts.accuracy",
    "export": "disttrain.scripts.export",
    "tables": "disttrain.scripts.tables",
    "diagnose": "disttrain.scripts.diagnose",
}

# absl's own flags, which every command accepts (app.run defines the help flags when it starts).
ABSL_FLAGS = {"help", "helpfull", "helpshort", "helpxml", "flagfile", "undefok", "only_check_args"}

CODE_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", flags=re.S | re.M)
COMMAND = re.compile(r"(?:\bpython\s+bin/(\w+)\.py|(?<![\w/-])disttrain-([a-z-]+))\b")


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def rel(path: str) -> str:
    return os.path.relpath(path, REPO)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in CODE_BLOCK.sub("", read(path)).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m[1])
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: str) -> list[str]:
    """Relative link targets of a page, outside code blocks and code spans."""
    text = re.sub(r"`[^`\n]*`", "", CODE_BLOCK.sub("", read(path)))
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # not http:, mailto:, ...


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(full):
            broken.append(f"{target}: no file {rel(full)}")
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            broken.append(f"{target}: no heading #{anchor} in {rel(full)}; headings: {sorted(anchors(full))}")
    assert not broken, f"{rel(page)}: " + "; ".join(broken)


def commands(path: str) -> list[tuple[str, list[str]]]:
    """(script, the flag tokens after it) for each command in the page's code blocks."""
    found = []
    for block in CODE_BLOCK.findall(read(path)):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|;|\|\s", line):  # "a=1|2" in a placeholder value stays
                m = COMMAND.search(part)
                if not m:
                    continue
                rest = part[m.end() :]
                try:
                    tokens = shlex.split(rest, comments=True)
                except ValueError:
                    tokens = rest.split()
                found.append((m[1] or m[2].replace("-", "_"), [t for t in tokens if t.startswith("--")]))
    return found


def script_flags_of(module_name: str) -> dict[str, flags.Flag]:
    """Import a script module with no other script's flags defined; its flags by name, then undone.

    The scripts define flags of the same names (gin_file, ...) in absl's one
    FLAGS, so two cannot be imported side by side: the others' flags are set
    aside while it is imported and put back after, and the module is
    forgotten again, leaving FLAGS and sys.modules as they were.
    """
    if module_name in sys.modules:
        return {f.name: f for f in flags.FLAGS.get_flags_for_module(module_name)}
    others = {m: flags.FLAGS.get_flags_for_module(m) for m in SCRIPTS.values() if m in sys.modules}
    keys = {m: flags.FLAGS.get_key_flags_for_module(m) for m in others}
    for flag in {f.name for fs in others.values() for f in fs}:
        delattr(flags.FLAGS, flag)
    try:
        module = importlib.import_module(module_name)
        defined = {f.name: f for f in flags.FLAGS.get_flags_for_module(module)}
        for name in defined:
            delattr(flags.FLAGS, name)
        del sys.modules[module_name]
    finally:
        for m, fs in others.items():
            for f in fs:
                flags.FLAGS[f.name] = f
                flags.FLAGS.register_flag_by_module(m, f)
            for f in keys[m]:
                flags.FLAGS.register_key_flag_for_module(m, f)
    return defined


def _tokens(defined: dict[str, flags.Flag]) -> set[str]:
    """The flag names a command line may use: `noX` too for a boolean X."""
    return set(defined) | {f"no{name}" for name, f in defined.items() if f.boolean}


@pytest.fixture(scope="module")
def script_flags() -> dict[str, set[str]]:
    """Each script -> the flag tokens it accepts (`noX` for a boolean X), absl's own included."""
    own = {script: _tokens(script_flags_of(module)) for script, module in SCRIPTS.items()}
    absl_own = {
        f.name
        for module, fs in flags.FLAGS.flags_by_module_dict().items()
        if module.startswith("absl.")
        for f in fs
    }
    return {script: names | ABSL_FLAGS | absl_own for script, names in own.items()}


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_command_names_only_flags_its_script_defines(page, script_flags):
    wrong = []
    for script, tokens in commands(page):
        if script not in script_flags:
            wrong.append(f"{script}: no such command (known: {sorted(script_flags)})")
            continue
        for token in tokens:
            name = token[2:].split("=", 1)[0]
            if name not in script_flags[script]:
                wrong.append(f"{script}: {token}")
    assert not wrong, f"{rel(page)} names flags its commands do not define: {wrong}"


def test_the_flag_check_sees_the_readme_commands(script_flags):
    """The check is not vacuous: README's commands are found, and a made-up flag would be caught."""
    found = commands(os.path.join(REPO, "README.md"))
    assert {"launch_local", "train"} <= {script for script, _ in found}, found
    assert "gin_file" in script_flags["train"] and "nodry_run" in script_flags["train"]
    assert "no_such_flag" not in script_flags["train"]


def test_every_decision_record_is_in_the_index_with_its_title():
    """docs/decisions/README.md lists every record (a record left out is one no reader finds)."""
    folder = os.path.join(REPO, "docs", "decisions")
    with open(os.path.join(folder, "README.md")) as f:
        index = f.read()
    missing = []
    for path in sorted(glob.glob(os.path.join(folder, "[0-9][0-9][0-9][0-9]-*.md"))):
        with open(path) as f:
            title = f.readline().removeprefix("# ").strip()
        name = os.path.basename(path)
        if f"[{title}]({name})" not in index:
            missing.append(f"[{title}]({name})")
    assert not missing, f"add to docs/decisions/README.md: {missing}"
