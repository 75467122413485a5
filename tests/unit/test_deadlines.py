"""Every deadline comes from `disttrain.base.deadlines.Deadlines`, with the values the runtime had before it.

Each deadline is checked against the expression the runtime computed it
with before there was one place for them (trainer, launch, servers), for the
default settings and the edges; and the modules are read (`ast`, no
TensorFlow run) for a `peer_wait_secs` read or a literal timeout outside
deadlines.py. docs/design.md's "Deadlines" table names every deadline.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

from disttrain.base.config import RunSettings, TrainConfig
from disttrain.base.deadlines import Deadlines
from disttrain.base.errors import ConfigError
from tests import REPO

PACKAGE = os.path.join(REPO, "disttrain")
# The settings' own module and the deadlines' may read the setting; the analysis tools pass it on to
# the runs they start (a TF 2 peer's spec, a run's settings).
MAY_READ = {"disttrain/base/config.py", "disttrain/base/deadlines.py"}
ANALYSIS = "disttrain/bench/"


def before(pw: float, linger: float, preempt: float) -> dict[str, float]:
    """Each deadline as the runtime computed it before deadlines.py (the expression, then where)."""
    return {
        "peer_secs": pw,  # wait_for_peers(others, settings.peer_wait_secs); Watchdog(.., peer_wait_secs)
        "cluster_check_secs": pw,  # check_cluster_agrees(..., settings.peer_wait_secs)
        "chief_variables_secs": pw,  # _WorkerSessionCreator(..., settings.peer_wait_secs, ...)
        "creating_session_secs": pw,  # enter("creating the session", settings.peer_wait_secs)
        "recovering_session_secs": 2 * pw,  # _Reconnecting: 2 * wait_secs
        "first_step_secs": pw,  # step_thresholds: first_secs
        "step_min_secs": min(60.0, pw),  # step_thresholds: min_secs
        "hooks_after_step_secs": 5 * pw,  # StepWatch.after_run: 5 * first_secs
        "closing_session_secs": min(60.0, pw),  # _closing, and the close after an error
        "serving_secs": pw,  # launch.serve: enter("serving", settings.peer_wait_secs)
        "replicas_idle_secs": pw,  # _AwaitReplicas(idle_secs=settings.peer_wait_secs)
        "evaluator_secs": pw,  # evaluate_checkpoints(..., settings.peer_wait_secs)
        "linger_secs": linger,  # serve_until_done(linger=settings.ps_linger_secs)
        "preempted_secs": preempt,  # preemption.PROCESS.install(settings.preempt_secs)
        "ps_preempted_secs": max(1.0, preempt - 3.0),  # _count_reports: max(1.0, preempt_secs - 3.0)
    }


def deadlines_named() -> list[str]:
    return sorted(name for name, value in vars(Deadlines).items() if isinstance(value, property))


def test_every_deadline_is_checked_here():
    assert deadlines_named() == sorted(before(1, 1, 1))


def test_the_default_settings_deadlines():
    deadlines = Deadlines.of(RunSettings())
    got = {name: getattr(deadlines, name) for name in deadlines_named()}
    assert got == {
        "peer_secs": 120.0,
        "cluster_check_secs": 120.0,
        "chief_variables_secs": 120.0,
        "creating_session_secs": 120.0,
        "recovering_session_secs": 240.0,
        "first_step_secs": 120.0,
        "step_min_secs": 60.0,
        "hooks_after_step_secs": 600.0,
        "closing_session_secs": 60.0,
        "serving_secs": 120.0,
        "replicas_idle_secs": 120.0,
        "evaluator_secs": 120.0,
        "linger_secs": 30.0,
        "preempted_secs": 20.0,
        "ps_preempted_secs": 17.0,
    }
    assert got == before(120.0, 30.0, 20.0)


# peer_wait_secs > 0 (0 and None are refused): a tiny one, the smallest documented (0.5), an int as gin
# gives it, 60 (where the minute caps meet it), a large one. ps_linger_secs >= 0; preempt_secs > 0
# (below 4 s a PS's bound is its 1 s floor).
@pytest.mark.parametrize(
    "pw, linger, preempt",
    [(1e-3, 0, 1e-3), (0.5, 0.0, 0.5), (10, 0, 3), (60.0, 30.0, 4.0), (59.9, 1, 20), (3600.0, 600.0, 300.0)],
)
def test_each_deadline_keeps_its_value_at_the_edges(pw, linger, preempt):
    settings = RunSettings.of(peer_wait_secs=pw, ps_linger_secs=linger, preempt_secs=preempt)
    deadlines = Deadlines.of(settings)
    expected = before(pw, linger, preempt)
    for name in deadlines_named():
        got = getattr(deadlines, name)
        assert got == expected[name] and type(got) is type(expected[name]), (name, got, expected[name])


def test_refused_peer_waits_make_no_deadlines():
    for refused in (0, None, -1):
        with pytest.raises(ConfigError, match="peer_wait_secs"):
            RunSettings.of(peer_wait_secs=refused)


def test_the_fixed_bounds_and_the_step_rule():
    assert (Deadlines.PROBE_SECS, Deadlines.TELL_PS_SECS, Deadlines.READY_READ_SECS) == (1.0, 10.0, 2.0)
    assert Deadlines.LEAST_ROUND_SECS == 0.5
    assert (Deadlines.STOP_THREADS_SECS, Deadlines.DONE_QUEUE_CLOSE_SECS) == (5.0, 5.0)
    assert (Deadlines.PREEMPT_NOTICE_READ_SECS, Deadlines.PREEMPT_SETTLE_SECS) == (5.0, 3.0)
    assert (Deadlines.DRAIN_SECS, Deadlines.DRAIN_CLOSE_GRACE_SECS) == (120.0, 15.0)
    assert (Deadlines.AGGREGATOR_CALL_SECS, Deadlines.RELEASE_IDLE_SECS, Deadlines.STEP_FACTOR) == (
        5.0,
        60.0,
        10.0,
    )
    assert Deadlines.hooks_after(1.0) == 5.0  # a StepWatch built by hand (tests) judges its hooks so


def test_a_train_config_has_the_same_deadlines_as_its_settings():
    config = TrainConfig(peer_wait_secs=7.0, ps_linger_secs=2.0, preempt_secs=9.0)
    assert Deadlines.of(config) == Deadlines.of(
        RunSettings.of(peer_wait_secs=7.0, ps_linger_secs=2.0, preempt_secs=9.0)
    )


def modules() -> dict[str, ast.Module]:
    """Every module of disttrain/, by its path from the repository's root, parsed."""
    found = {}
    for directory, subdirs, files in os.walk(PACKAGE):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    found[os.path.relpath(path, REPO).replace(os.sep, "/")] = ast.parse(f.read(), path)
    return found


def test_no_module_but_deadlines_and_config_reads_peer_wait_secs():
    """`x.peer_wait_secs` or a "peer_wait_secs" key; a message or docstring naming the setting is no read."""
    reads = []
    for path, tree in modules().items():
        if path in MAY_READ or path.startswith(ANALYSIS):
            continue
        for node in ast.walk(tree):
            attribute = isinstance(node, ast.Attribute) and node.attr == "peer_wait_secs"
            key = isinstance(node, ast.Constant) and node.value == "peer_wait_secs"
            if attribute or key:
                reads.append(f"{path}:{node.lineno}")
    assert not reads, f"read peer_wait_secs through disttrain.base.deadlines.Deadlines instead: {reads}"


def test_no_module_passes_a_literal_timeout():
    """A number written as a call's timeout (RunOptions' timeout_in_ms, a session's grace) is a deadline."""
    literal = []
    for path, tree in modules().items():
        if path == "disttrain/base/deadlines.py" or path.startswith(ANALYSIS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg in ("timeout_in_ms", "stop_grace_period_secs"):
                if isinstance(node.value, ast.Constant):
                    literal.append(f"{path}:{node.value.lineno}")
    assert not literal, f"name these in disttrain/base/deadlines.py: {literal}"


def test_docs_design_lists_every_deadline():
    with open(os.path.join(REPO, "docs", "design.md"), encoding="utf-8") as f:
        page = f.read()
    section = page.split("\n## Deadlines\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(\w+)`", section))
    fixed = [name for name in vars(Deadlines) if name.isupper()]
    missing = [name for name in deadlines_named() + fixed if name not in named]
    assert not missing, f"docs/design.md's Deadlines section does not name: {missing}"
