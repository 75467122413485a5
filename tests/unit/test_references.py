"""No file of the repository refers to a repository file that does not exist.

Scanned: the repository's files (git's, tracked or new and not ignored) named
*.md, *.py, *.gin, *.yaml, *.toml, Dockerfile and .ci/run, but not
CHANGELOG.md and docs/decisions/, which tell history and may name files that
have since gone. Two kinds of reference are checked:

- markdown links `[text](path)` in .md files, outside code, resolved from
  the page's directory (`#anchor` dropped; http(s):, mailto: and pure
  `#anchor` links are not files; test_docs.py checks the anchors);
- paths written out, in backticks or bare, anywhere in a file (in .py files
  under tests/, only in comments and docstrings: their code builds scratch
  trees, and code that names a missing file fails when it runs): those that
  start with a top-level folder (disttrain/, model_zoo/, gin/, bin/, tests/,
  docs/, deploy/) and the top-level files below, read from the
  repository's root. A pytest id's `::test` or a `:line` is dropped; an
  existing directory counts.

Not references: a path with a glob or placeholder in it (`*`, `<kind>`,
`{name}`, `%s`, `NNNN`), one followed by `/...`, a pytest parameter
(`test_x[gin/x.gin-1]`, part of a test's id), and run-time paths: an
absolute one (/tmp/disttrain/...) or one inside another path or a URL,
where a match never starts. ABSENT names the few repository-looking paths
that are rightly not in the repository, each with why. Pure Python and git:
no TensorFlow.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tokenize

import pytest

from tests import REPO

TOP_FOLDERS = ("disttrain", "model_zoo", "gin", "bin", "tests", "docs", "deploy")
# Top-level files a text may name bare. The design file is listed so that a leftover
# reference to the old top-level one is caught (it is docs/design.md now).
TOP_FILES = ("README.md", "BUILD_NOTES.md", "CHANGELOG.md", "CONTRIBUTING.md", "DESIGN" + ".md", "setup.py")
SUFFIXES = (".md", ".py", ".gin", ".yaml", ".toml")
NAMES = ("Dockerfile",)
EXTRA = (".ci/run",)
HISTORY = ("CHANGELOG.md", "docs/decisions/")  # they may name files that have gone
SELF = "tests/unit/test_references.py"  # names the patterns above, not files
# Paths that look like the repository's and rightly are not in it, each with why.
ABSENT = {
    "disttrain/gin": "an installed package's copy of gin/ (setup.py puts it there; cli.shipped_gin_dir)",
    "gin/__init__.py": "tests/cluster/test_gin_and_deploy.py: it must not exist (it would shadow gin-config)",
}

_FOLDER_PATH = re.compile(
    r"(?<![\w/.\-~$])(?:\./)?((?:" + "|".join(TOP_FOLDERS) + r")/[\w./\-]*)"
    r"|(?<![\w/.\-~$])(" + "|".join(re.escape(f) for f in TOP_FILES) + r")(?![\w\-])"
)
_PLACEHOLDER_AFTER = tuple("*<{[%$…")
_CODE_BLOCK = re.compile(r"^\s*```[^\n]*\n.*?^\s*```", flags=re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_PARAMETER = re.compile(r"\btest\w*\[[^\]\s]*$")  # ends just before the match: a test id's parameter
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.\-]*:")


def repository_files() -> list[str]:
    """The repository's files, relative to its root: tracked, and new ones git does not ignore."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout, or no git: {e}")
    names = {name for name in out.decode().split("\0") if name}
    return sorted(name for name in names if os.path.isfile(os.path.join(REPO, name)))


def scanned(files: list[str]) -> list[str]:
    return [
        name
        for name in files
        if (name.endswith(SUFFIXES) or os.path.basename(name) in NAMES or name in EXTRA)
        and not name.startswith(HISTORY)
        and name != SELF
    ]


def _exists(path: str, files: set[str], folders: set[str]) -> bool:
    path = os.path.normpath(path).replace(os.sep, "/")
    return path in files or path in folders or path == "."


def _folders(files: set[str]) -> set[str]:
    found = set()
    for name in files:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            found.add("/".join(parts[:i]))
    return found


def python_prose(text: str) -> str:
    """`text` with everything but its comments and docstrings blanked, lines kept where they were.

    A docstring here is any string that is a statement of its own. Text that
    does not tokenize is returned whole.
    """
    lines = text.splitlines(keepends=True)
    kept = [re.sub(r"[^\n]", " ", line) for line in lines]
    statement_start = True
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and statement_start):
                (row, col), (end_row, end_col) = tok.start, tok.end
                for r in range(row, end_row + 1):
                    line = lines[r - 1]
                    a = col if r == row else 0
                    b = end_col if r == end_row else len(line.rstrip("\n"))
                    kept[r - 1] = kept[r - 1][:a] + line[a:b] + kept[r - 1][b:]
            if tok.type not in (tokenize.COMMENT, tokenize.NL):
                statement_start = tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    except (tokenize.TokenError, SyntaxError):
        return text
    return "".join(kept)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def written_paths(text: str) -> list[tuple[int, str]]:
    """(line, path) for every repository path written out in `text`, placeholders and globs left out."""
    found = []
    for m in _FOLDER_PATH.finditer(text):
        path = m[1] or m[2]
        after = text[m.end() : m.end() + 1]
        if after.startswith(_PLACEHOLDER_AFTER) or "..." in path or "NNNN" in path:
            continue
        if _PARAMETER.search(text, max(0, m.start() - 300), m.start()):
            continue
        path = path.split("::")[0].rstrip(".-")
        found.append((_line_of(text, m.start()), path))
    return found


def markdown_links(text: str) -> list[tuple[int, str]]:
    """(line, target) of each relative link outside code; code is blanked so that lines still count."""
    blank = lambda m: re.sub(r"[^\n]", " ", m[0])  # noqa: E731
    prose = _CODE_SPAN.sub(blank, _CODE_BLOCK.sub(blank, text))
    links = []
    for m in _LINK.finditer(prose):
        target = m[1]
        if _SCHEME.match(target) or target.startswith("#"):
            continue
        links.append((_line_of(prose, m.start()), target))
    return links


def dangling(files: list[str]) -> list[str]:
    """'file:line -> missing path' for every reference in the scanned files to a file that is not there."""
    present = set(files)
    folders = _folders(present)
    missing: dict[tuple[str, int, str], str] = {}  # one line per file, line and path
    for name in scanned(files):
        with open(os.path.join(REPO, name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        if name.startswith("tests/") and name.endswith(".py"):
            text = python_prose(text)
        for line, path in written_paths(text):
            clean = re.sub(r":\d+$", "", path)
            if clean.rstrip("/") in ABSENT or _exists(clean, present, folders):
                continue
            missing.setdefault((name, line, os.path.normpath(clean)), f"{name}:{line} -> {clean}")
        if name.endswith(".md"):
            for line, target in markdown_links(text):
                path = target.split("#")[0].split("?")[0]
                if not path:
                    continue
                if path.startswith("/"):
                    full = path.lstrip("/")
                else:
                    full = os.path.join(os.path.dirname(name), path)
                if not _exists(full, present, folders):
                    full = os.path.normpath(full)
                    missing.setdefault((name, line, full), f"{name}:{line} -> {full} (link {target})")
    return list(missing.values())


def test_no_file_refers_to_a_file_the_repository_lacks():
    found = dangling(repository_files())
    assert not found, f"{len(found)} reference(s) to files the repository lacks:\n" + "\n".join(found)


def test_the_check_finds_what_it_should_and_nothing_else():
    """Written paths and links as the check reads them, on made-up text."""
    text = (
        "see `disttrain/runtime/trainer.py`, bin/train.py and tests/unit/test_docs.py::test_x;\n"
        "not /tmp/disttrain/run, gin/strategies/<kind>.gin, docs/images/*.png, disttrain/strategies/...,\n"
        "docs/decisions/NNNN-title.md, https://github.com/o/r/blob/main/tests/x.py, {logdir}/tasks\n"
        "`tests/unit/test_a.py::test_b[gin/mlp_async.gin-2]`,\n"
        "the top files README.md and setup.py, ./bin/plan.py, and docs/faults.md.\n"
    )
    assert [p for _, p in written_paths(text)] == [
        "disttrain/runtime/trainer.py",
        "bin/train.py",
        "tests/unit/test_docs.py",
        "tests/unit/test_a.py",
        "README.md",
        "setup.py",
        "bin/plan.py",
        "docs/faults.md",
    ]
    page = "[a](faults.md#x) [b](https://x.org) [c](#top) `[d](no.md)`\n```\n[e](nor.md)\n```\n[f](../gin/)\n"
    assert markdown_links(page) == [(1, "faults.md#x"), (5, "../gin/")]
    code = '"""See docs/a.md."""\n\nx = "docs/b.md"  # docs/c.md\n\n\ndef f():\n    """docs/d.md"""\n'
    assert [(n, p) for n, p in written_paths(python_prose(code))] == [
        (1, "docs/a.md"),
        (3, "docs/c.md"),
        (7, "docs/d.md"),
    ]
    files = ["docs/faults.md", "docs/page.md", "gin/mlp.gin", "README.md"]
    assert _exists("docs/../gin", set(files), _folders(set(files)))
    assert not _exists("docs/gone.md", set(files), _folders(set(files)))
