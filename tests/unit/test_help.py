"""`--help` of every command, from a checkout (bin/) and as a console script, lists the command's flags.

The flags expected are read from each script module's own DEFINE_ calls, so a
flag added there is checked here without editing this file.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests import REPO

# console script -> (bin/ script, module), as setup.py declares them.
COMMANDS = {
    "disttrain-train": ("train.py", "train"),
    "disttrain-launch-local": ("launch_local.py", "launch_local"),
    "disttrain-benchmark": ("benchmark.py", "benchmark"),
    "disttrain-plan": ("plan.py", "plan"),
    "disttrain-link-probe": ("link_probe.py", "link_probe"),
    "disttrain-accuracy": ("accuracy.py", "accuracy"),
    "disttrain-export": ("export.py", "export"),
    "disttrain-tables": ("tables.py", "tables"),
}

# What pip writes for a console script, when none is installed beside this Python.
SHIM = "import sys; from disttrain.scripts.{module} import run; sys.argv[0] = {name!r}; sys.exit(run())"


def defined_flags(module: str) -> dict[str, bool]:
    """Each flag disttrain/scripts/<module>.py defines -> whether it has a default."""
    path = os.path.join(REPO, "disttrain", "scripts", f"{module}.py")
    with open(path) as f:
        source = f.read()
    found = {}
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr.startswith("DEFINE_")
        ):
            name, default = node.args[0], node.args[1]
            assert isinstance(name, ast.Constant), f"{path}: a flag whose name is not a literal"
            has_default = not (isinstance(default, ast.Constant) and default.value is None)
            found[name.value] = has_default
    # A flag defined some other way (a helper, a loop) would escape this test: fail instead.
    assert len(found) == source.count("DEFINE_"), f"{path}: not every DEFINE_ is a plain call"
    return found


def entries(name: str, bin_script: str, module: str) -> list[tuple[str, list[str]]]:
    installed = os.path.join(os.path.dirname(sys.executable), name)
    console = [installed] if os.path.isfile(installed) else [sys.executable, "-c", SHIM.format(**locals())]
    return [
        (f"bin/{bin_script}", [sys.executable, os.path.join(REPO, "bin", bin_script)]),
        (name, console),
    ]


def help_text(argv: list[str]) -> subprocess.CompletedProcess:
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=REPO + (os.pathsep + path if path else ""))  # this checkout
    return subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)


def flag_blocks(text: str) -> dict[str, str]:
    """--help's flag entries: name -> its text (the `--name:` line and its indented continuation)."""
    blocks: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"^  --(?:\[no\])?(\w+):", line)
        if m:
            name = m[1]
            blocks[name] = line
        elif name and line.startswith("    "):
            blocks[name] += "\n" + line
        else:
            name = None
    return blocks


@pytest.fixture(scope="module")
def outputs():
    """Every command's --help, run two at a time (each imports TensorFlow)."""
    runs = [(label, argv) for name, (b, m) in COMMANDS.items() for label, argv in entries(name, b, m)]
    with ThreadPoolExecutor(2) as pool:
        results = pool.map(lambda run: help_text(run[1]), runs)
        return dict(zip([label for label, _ in runs], results, strict=True))


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_lists_every_flag_of_the_command_with_its_default(name, outputs):
    bin_script, module = COMMANDS[name]
    expected = defined_flags(module)
    assert expected, f"no flags found in disttrain/scripts/{module}.py"
    for label in (f"bin/{bin_script}", name):
        r = outputs[label]
        assert r.returncode in (0, 1), f"{label} --help: exit {r.returncode}\n{r.stderr[-2000:]}"
        assert "Traceback" not in r.stderr, r.stderr[-2000:]
        blocks = flag_blocks(r.stdout)
        missing = sorted(set(expected) - set(blocks))
        assert not missing, f"{label} --help does not list {missing}:\n{r.stdout}"
        no_default = [f for f, has in expected.items() if has and "(default:" not in blocks[f]]
        assert not no_default, f"{label} --help shows no default for {no_default}:\n{r.stdout}"
        # The command's own description, not the shim's or the bin/ script's pointer to it.
        assert f"disttrain-{module.replace('_', '-')} --" in r.stdout, r.stdout
