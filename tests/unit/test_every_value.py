"""Every documented value of every setting, run by `disttrain.fit` in one process.

Each RunSettings field (disttrain/base/config.py) at each value its docstring
names, and each strategy knob of docs/strategies.md at its documented values
(defaults once: every other run has them): the run trains to its last step, or it is refused at once with one
`disttrain: error:` line naming the setting and exit code 2. Never a
TensorFlow traceback. The same values on 2-worker clusters, combined into a
few runs per strategy: tests/cluster/test_every_value.py. The list is kept in
docs/configuration.md ("Every value runs"), which a test here reads.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re

import pytest
import tensorflow as tf

import disttrain
from disttrain.base.cluster import Cluster
from tests import REPO, reading_model

STEPS = 6

# RunSettings field -> the values that run besides its default (every other run has the default).
RUNS = {
    "log_every_steps": [1],
    "save_checkpoint_steps": [1],
    "save_checkpoint_secs": [None, 0.01],
    "keep_checkpoints": [1, None],
    "intra_op_threads": [1],
    "inter_op_threads": [1],
    "peer_wait_secs": [0.5],
    "ps_linger_secs": [0],
    "check_numerics": [False],
    "decay_threshold": [0],
    "decay_window": [1],
    "trace_steps": [2],
    "breakdown_budget": [0, 1.0],
    "stall_steps": [0, 10],
    "clip_norm": [1.0],
    "clip_where": ["replica", "aggregate"],
    "preempt_secs": [0.5],
    "wait_log_secs": [0.5],
    "replica_memory_bytes": [2**30],
    "accumulate_steps": [None, 2],
    "steps_per_run": [None, 3],
}
# RunSettings field -> values refused in one line (None wherever None is not a documented value).
REFUSED = {
    "log_every_steps": [0, None, 2.5],
    "save_checkpoint_steps": [0, -1],
    "save_checkpoint_secs": [0, -1],
    "keep_checkpoints": [0],
    "intra_op_threads": [-1, None],
    "inter_op_threads": [-1, None],
    "peer_wait_secs": [0, None],
    "ps_linger_secs": [-1, None],
    "check_numerics": [None, "yes"],
    "decay_threshold": [-0.1, None],
    "decay_window": [0, None],
    "trace_steps": [-1, None],
    "breakdown_budget": [-0.01, None],
    "stall_steps": [-1],
    "clip_norm": [0, -1.0, "1"],
    "clip_where": ["everywhere", None],
    "preempt_secs": [0, None],
    "wait_log_secs": [0, None],
    "replica_memory_bytes": [0, 2.5],
    "accumulate_steps": [0, 2.5],
    "steps_per_run": [0, "2"],
}
# Strategy -> knob -> values that run in one process besides the default; companions a value needs are
# added by _knobs.
KNOBS = {
    "AsyncParameterServer": {
        "overlap": [True],
        "transfer_dtype": ["float32", "float16", "bfloat16"],
        "piece_bytes": [64],
        "num_towers": [1, 2],
    },
    "SyncParameterServer": {
        "transfer_dtype": ["float32", "float16", "bfloat16"],
        "piece_bytes": [64],
        "num_towers": [2],
    },
    "SyncAllReduce": {
        "bucket_bytes": [1],
        "transfer_dtype": ["float32", "float16", "bfloat16"],
        "max_subdivs": [1, 8],
        "autotune": [True],
        "densify_below_bytes": [0],
        "communication_hint": ["ring", "nccl"],
        "num_towers": [2],
    },
    "SyncHybrid": {
        "bucket_bytes": [1],
        "transfer_dtype": ["float32", "float16", "bfloat16"],
        "piece_bytes": [64],
        "densify_below_bytes": [0],
        "num_towers": [2],
    },
}
# Strategy knobs refused in one line: (strategy, knobs, what the line names).
REFUSED_KNOBS = [
    ("AsyncParameterServer", {"transfer_dtype": "int8"}, "transfer_dtype='int8'"),
    ("AsyncParameterServer", {"piece_bytes": 0}, "piece_bytes must be >= 1"),
    ("AsyncParameterServer", {"num_towers": -1}, "num_towers must be >= 1"),
    ("SyncParameterServer", {"backup_workers": 1}, "backup_workers=1 out of range"),
    ("SyncParameterServer", {"backup_workers": -1}, "backup_workers=-1 out of range"),
    ("SyncParameterServer", {"piece_bytes": 0}, "piece_bytes must be >= 1"),
    ("SyncParameterServer", {"transfer_dtype": "int8"}, "transfer_dtype='int8'"),
    ("SyncAllReduce", {"bucket_bytes": 0}, "bucket_bytes must be >= 1"),
    ("SyncAllReduce", {"transfer_dtype": "int8"}, "transfer_dtype='int8'"),
    ("SyncAllReduce", {"max_subdivs": 0}, "max_subdivs must be >= 1"),
    ("SyncAllReduce", {"communication_hint": "tcp"}, "communication_hint='tcp'"),
    ("SyncAllReduce", {"autotune": True, "autotune_runs": 0}, "autotune_runs must be >= 1"),
    ("SyncHybrid", {"bucket_bytes": 0}, "bucket_bytes must be >= 1"),
    ("SyncHybrid", {"piece_bytes": 0}, "piece_bytes must be >= 1"),
    ("SyncHybrid", {"transfer_dtype": "int8"}, "transfer_dtype='int8'"),
]


def _knobs(strategy: str, knob: str, value) -> dict:
    """`knob=value`, and what that value needs beside it."""
    knobs = {knob: value}
    if knob == "autotune" and value:
        knobs.update(autotune_grid=[(1024, None), (4 * 2**20, 8)], autotune_runs=1)
    return knobs


def run_fit(logdir, strategy=None, **settings):
    """`fit` in one process, in a graph of its own: what it returned, or the exit code it asked for."""
    with tf.Graph().as_default():
        try:
            return disttrain.fit(
                reading_model.loss_fn,
                reading_model.optimizer,
                steps=STEPS,
                logdir=str(logdir),
                strategy=strategy,
                cluster=Cluster.local(),
                batch_size=reading_model.BATCH,
                **settings,
            )
        except SystemExit as e:
            return e.code


def assert_trained(result, capsys):
    """Trained to the last step, and no further: one process (overlap too) stops there."""
    err = capsys.readouterr().err
    assert not isinstance(result, int | type(None)), f"exit {result}: {err[-2000:]}"
    assert result.global_step == STEPS and result.local_steps == STEPS, result
    assert "Traceback" not in err, err[-2000:]


def assert_refused(code, capsys, named: str):
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2, (code, err[-20:])
    assert len(err) == 1 and err[0].startswith("disttrain: error: "), err[-20:]
    assert named in err[0], err[0]


def _ids(cases):
    return [f"{name}={value!r}" for name, value in cases]


SETTING_RUNS = [(name, value) for name, values in RUNS.items() for value in values]
SETTING_REFUSALS = [(name, value) for name, values in REFUSED.items() for value in values]


@pytest.mark.parametrize("name,value", SETTING_RUNS, ids=_ids(SETTING_RUNS))
def test_each_documented_value_of_each_setting_trains_to_the_last_step(tmp_path, capsys, name, value):
    settings = {name: value}
    # 'aggregate' needs a strategy that aggregates; a short time interval needs time-based saves.
    strategy = disttrain.SyncAllReduce if name == "clip_where" else None
    if name == "clip_where":
        settings["clip_norm"] = 1.0
    if name == "save_checkpoint_secs":
        settings["save_checkpoint_steps"] = None
    assert_trained(run_fit(tmp_path, strategy, **settings), capsys)


@pytest.mark.parametrize("name,value", SETTING_REFUSALS, ids=_ids(SETTING_REFUSALS))
def test_each_impossible_value_is_refused_in_one_line_naming_the_setting(tmp_path, capsys, name, value):
    settings = {name: value, **({"clip_norm": 1.0} if name == "clip_where" else {})}
    assert_refused(run_fit(tmp_path, **settings), capsys, f"RunSettings.{name} ")


STRATEGY_RUNS = [
    (strategy, knob, value)
    for strategy, knobs in KNOBS.items()
    for knob, values in knobs.items()
    for value in values
]


@pytest.mark.parametrize(
    "strategy,knob,value", STRATEGY_RUNS, ids=[f"{s}.{k}={v!r}" for s, k, v in STRATEGY_RUNS]
)
def test_each_documented_strategy_knob_trains_to_the_last_step(tmp_path, capsys, strategy, knob, value):
    knobs = _knobs(strategy, knob, value)
    built = functools.partial(getattr(disttrain, strategy), **knobs)
    assert_trained(run_fit(tmp_path, built, log_every_steps=2), capsys)


@pytest.mark.parametrize("strategy", list(KNOBS))
def test_each_strategy_at_its_defaults_trains_to_the_last_step(tmp_path, capsys, strategy):
    assert_trained(run_fit(tmp_path, getattr(disttrain, strategy)), capsys)


@pytest.mark.parametrize("strategy,knobs,named", REFUSED_KNOBS, ids=[f"{s}{k}" for s, k, _ in REFUSED_KNOBS])
def test_each_impossible_strategy_knob_is_refused_in_one_line(tmp_path, capsys, strategy, knobs, named):
    built = functools.partial(getattr(disttrain, strategy), **knobs)
    assert_refused(run_fit(tmp_path, built), capsys, named)


@pytest.mark.parametrize("strategy", ["AsyncParameterServer", "SyncHybrid"])
def test_aggregate_clipping_is_refused_where_no_one_aggregate_exists(tmp_path, capsys, strategy):
    code = run_fit(tmp_path, getattr(disttrain, strategy), clip_norm=1.0, clip_where="aggregate")
    assert_refused(code, capsys, "clip_where='aggregate'")


def _checkpoints(logdir) -> list[str]:
    return sorted(p.name for p in logdir.glob("model.ckpt-*.index"))


def test_no_checkpoint_settings_write_no_checkpoint_and_no_input_position(tmp_path, capsys):
    """RunSettings' docstring: both None, no checkpoints (they crashed TF's timer: issue 30)."""
    result = run_fit(tmp_path, save_checkpoint_steps=None, save_checkpoint_secs=None)
    assert_trained(result, capsys)
    assert not _checkpoints(tmp_path) and not (tmp_path / "checkpoint").exists()
    assert not list(tmp_path.glob("tasks/*/input-*")), list(tmp_path.glob("tasks/*/*"))


def test_keep_checkpoints_keeps_that_many_or_all(tmp_path, capsys):
    """A checkpoint every step, STEPS steps: `keep_checkpoints` newest remain (None: every one)."""
    assert_trained(run_fit(tmp_path / "two", save_checkpoint_steps=1, keep_checkpoints=2), capsys)
    assert _checkpoints(tmp_path / "two") == [f"model.ckpt-{STEPS - 1}.index", f"model.ckpt-{STEPS}.index"]
    assert_trained(run_fit(tmp_path / "all", save_checkpoint_steps=1, keep_checkpoints=None), capsys)
    steps = sorted(int(re.search(r"-(\d+)\.", name)[1]) for name in _checkpoints(tmp_path / "all"))
    assert steps == list(range(STEPS + 1)), steps  # step 0's, one per step, and the end's


def test_every_field_has_its_values_here():
    """A field added to RunSettings without its values here (and in the docs) fails this."""
    fields = {f.name for f in dataclasses.fields(disttrain.RunSettings)}
    assert set(RUNS) == fields and set(REFUSED) == fields, fields ^ set(RUNS)


def test_docs_list_every_value_and_this_test():
    """docs/configuration.md's table of values names each setting and knob and the values run here."""
    with open(os.path.join(REPO, "docs", "configuration.md")) as f:
        text = f.read()
    section = text[text.index("## Every value runs") :]
    assert "tests/unit/test_every_value.py" in section and "tests/cluster/test_every_value.py" in section
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `([\w.]+)` \|([^\n]*)$", section, flags=re.M)}
    for name in RUNS:
        for value in RUNS[name] + REFUSED[name]:
            assert f"`{value!r}`" in rows.get(name, ""), (name, value)
    for strategy, knobs in KNOBS.items():
        for knob, values in knobs.items():
            for value in values:
                assert f"`{value!r}`" in rows.get(f"{strategy}.{knob}", ""), (strategy, knob, value)
