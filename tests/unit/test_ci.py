"""CI runs README's test command exactly as a newcomer types it.

.ci/run takes the first README line that installs with pip and runs pytest, and runs it with
nothing that changes which tests run, in which processes or in which order: no PYTEST_ADDOPTS,
no pytest options of its own. A green CI that ran another command would hide what the newcomer
meets (it did once: a gin lock leaked between tests in one process, and CI's two-file split never
saw it).
"""

import os
import re
import shlex

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEST_COMMAND = re.compile(r"^python -m pip install .*&& python -m pytest", re.M)


def read(path: str) -> str:
    with open(os.path.join(REPO, path)) as f:
        return f.read()


def test_readme_has_one_test_command_and_ci_finds_it_the_same_way():
    readme = read("README.md")
    lines = TEST_COMMAND.findall(readme)
    assert len(lines) == 1, f"README.md must have one test command line, has {len(lines)}"
    ci = read(".ci/run")
    assert "grep -m1 -E '^python -m pip install .*&& python -m pytest' README.md" in ci
    assert 'bash -euo pipefail -c "$test_command"' in ci


def test_ci_changes_nothing_about_how_readmes_command_runs():
    ci = read(".ci/run")
    assert "unset PYTEST_ADDOPTS" in ci
    exported = re.search(r"^\s*export\s+PYTEST_", ci, re.M)
    assert not exported, "an exported PYTEST_* variable reaches README's run"
    # pyproject's addopts reach every run alike: nothing there may choose processes or order.
    addopts = re.search(r'^addopts = "(.*)"', read("pyproject.toml"), re.M).group(1)
    assert not {"-n", "-p", "--dist", "--randomly-seed"} & set(shlex.split(addopts)), addopts


def test_the_test_command_runs_the_quick_tier_with_what_the_test_extra_installs():
    line = next(line for line in read("README.md").splitlines() if TEST_COMMAND.match(line))
    install, run = line.split(" && ")
    assert "test" in re.search(r'"\.\[([^\]]*)\]"', install).group(1).split(",")
    assert "-m quick" in run
    setup = read("setup.py")
    for plugin in ("pytest-xdist", "pytest-randomly"):  # -n 2, and a new order every run
        assert f'"{plugin}' in setup, plugin
