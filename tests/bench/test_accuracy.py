"""The time-to-accuracy tool: its data, its arithmetic, its report; and bin/accuracy.py end to end, tiny."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import matplotlib  # noqa: F401  (the `bench` extra, which README's test command installs: never a skip)
import numpy as np
import pytest
import tensorflow as tf

from disttrain.bench import accuracy
from disttrain.graph import schedules
from tests import REPO, extended_beyond

ACCURACY = os.path.join(REPO, "bin", "accuracy.py")
PEERS = os.path.join(REPO, "disttrain", "bench", "peers")


def curve(*points, step_every=10, per_step=32, wall=1000.0):
    """Evaluation rows as the chief writes them: (seconds, accuracy) every `step_every` steps."""
    return [
        {
            "global_step": (i + 1) * step_every,
            "examples": (i + 1) * step_every * per_step,
            "seconds": secs,
            "accuracy": acc,
            "first_step_wall": wall,
        }
        for i, (secs, acc) in enumerate(points)
    ]


def test_examples_per_step_counts_the_replicas_a_sync_step_waits_for():
    s = accuracy.SYSTEMS
    assert accuracy.examples_per_step(s["one_process"], 1, 32) == 32
    assert accuracy.examples_per_step(s["async"], 4, 32) == 32  # one replica's update per global step
    assert accuracy.examples_per_step(s["sync_ps"], 4, 32) == 128
    assert accuracy.examples_per_step(s["sync_ps_backup"], 4, 32) == 96
    assert accuracy.examples_per_step(s["allreduce_bf16"], 2, 32) == 64


def test_learning_rate_scales_with_the_global_batch_only_where_the_task_says():
    digits, teacher, s = accuracy.TASKS["digits"], accuracy.TASKS["teacher"], accuracy.SYSTEMS
    assert accuracy.learning_rate(digits, s["sync_ps"], 2) == pytest.approx(2 * digits.learning_rate)
    assert accuracy.learning_rate(digits, s["async"], 2) == digits.learning_rate
    assert accuracy.learning_rate(teacher, s["allreduce"], 4) == pytest.approx(4 * teacher.learning_rate)
    # A scaled rate warms up over the task's examples; an unscaled one does not.
    assert accuracy.warmup_steps(teacher, s["allreduce"], 2) == teacher.warmup_examples // 64 > 0
    assert accuracy.warmup_steps(teacher, s["async"], 2) == 0
    assert accuracy.warmup_steps(digits, s["sync_ps"], 2) == 0  # digits has none


def test_tf2_and_tf_default_systems_step_and_rate_as_disttrain_systems_of_their_kind():
    digits, s = accuracy.TASKS["digits"], accuracy.SYSTEMS
    for peer, kind in (("tf2_pss", "async"), ("tf_default", "async"), ("tf2_mwms", "allreduce")):
        assert accuracy.examples_per_step(s[peer], 4, 32) == accuracy.examples_per_step(s[kind], 4, 32)
        assert accuracy.learning_rate(digits, s[peer], 4) == accuracy.learning_rate(digits, s[kind], 4)
        assert accuracy.staleness(s[peer], 4) == accuracy.staleness(s[kind], 4)
    assert accuracy.cluster_of(s["tf2_pss"], 2).keys() == {"chief", "worker", "ps"}
    assert accuracy.cluster_of(s["tf2_mwms"], 2).keys() == {"worker"}
    assert accuracy.cluster_of(s["tf_default"], 2).keys() == {"worker", "ps"}
    assert accuracy.cluster_of(s["one_process"], 2) == {}


def test_tf2_peers_evaluate_on_the_cadence_and_at_the_end():
    spec = importlib.util.spec_from_file_location("tf2_heldout", os.path.join(PEERS, "tf2_heldout.py"))
    heldout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(heldout)
    chunks = heldout.chunks(total=57, every=25, per_function=10)
    steps = [(1, False), (10, False), (10, False), (4, True), (10, False), (10, False), (5, True), (7, True)]
    assert chunks == steps
    assert heldout.chunks(total=1, every=25, per_function=5) == [(1, True)]


def test_teacher_decays_to_zero_at_its_last_step_and_tf2_peers_follow_the_same_rate(tmp_path):
    """The peers cannot import disttrain: their rate (tf2_common) must be schedules.Cosine's at every step."""
    teacher, allreduce = accuracy.TASKS["teacher"], accuracy.SYSTEMS["allreduce"]
    assert teacher.decays and not accuracy.TASKS["digits"].decays
    accuracy.peer_command("teacher", "tf2_mwms", 2, teacher.examples, teacher.eval_every_steps, str(tmp_path))
    with open(tmp_path / "peer_spec.json") as f:
        optimizer = json.load(f)["optimizer"]
    rate, warmup = accuracy.learning_rate(teacher, allreduce, 2), accuracy.warmup_steps(teacher, allreduce, 2)
    total = teacher.examples // accuracy.examples_per_step(allreduce, 2, teacher.batch_size)
    assert (optimizer["learning_rate"], optimizer["warmup_steps"], optimizer["decay_steps"]) == (
        pytest.approx(rate),
        warmup,
        total,
    )
    spec = importlib.util.spec_from_file_location("tf2_common", os.path.join(PEERS, "tf2_common.py"))
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    schedule = schedules.Cosine(rate, warmup=warmup, total=total)
    for step in (0, warmup // 2, warmup, (warmup + total) // 2, total - 1, total, total + 3):
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            variable = tf.Variable(step, dtype=tf.int64)
            peer = common.Optimizer({"optimizer": optimizer}, [], None, variable)
            session.run(variable.initializer)
            assert session.run(peer.rate()) == pytest.approx(schedule.value(step), rel=1e-5, abs=1e-9), step
    assert schedule.value(total) == pytest.approx(0.0, abs=1e-9)


def test_compensated_async_lowers_the_momentum_for_the_staleness():
    digits, s = accuracy.TASKS["digits"], accuracy.SYSTEMS
    assert accuracy.staleness(s["async"], 4) == 4 and accuracy.staleness(s["async_overlap"], 4) == 8
    assert accuracy.staleness(s["sync_ps"], 4) == 1 and accuracy.staleness(s["one_process"], 1) == 1
    assert accuracy.rate_and_momentum(digits, s["async"], 4) == (digits.learning_rate, accuracy.MOMENTUM)
    rate, momentum = accuracy.rate_and_momentum(digits, s["async_overlap_compensated"], 4)
    assert rate == pytest.approx(digits.learning_rate) and momentum == pytest.approx(0.2)  # 1 - 8 x 0.1


def test_summary_gives_time_and_examples_to_the_first_evaluation_at_the_target():
    row = accuracy.summarize(
        "digits", "sync_ps", 2, curve((0.5, 0.6), (1.0, 0.96), (1.5, 0.94)), 990.0, [0, 0, 0], 0.95
    )
    assert row["startup_secs"] == 10.0
    assert (row["secs_to_target"], row["examples_to_target"]) == (1.0, 640)
    assert row["final_accuracy"] == 0.94 and row["final_examples"] == 960
    assert "failed" not in row


def test_a_run_that_did_not_train_or_failed_is_never_a_row():
    flat = curve((0.5, 0.1), (1.0, 0.1), (1.5, 0.1))
    assert "did not train" in accuracy.summarize("digits", "async", 2, flat, 0, [0, 0], 0.95)["failed"]
    still = curve((0.5, 0.9), (1.0, 0.9))
    still[1]["global_step"] = still[0]["global_step"]
    assert "did not train" in accuracy.summarize("digits", "async", 2, still, 0, [0, 0], 0.95)["failed"]
    ok = curve((0.5, 0.6), (1.0, 0.96))
    assert accuracy.summarize("digits", "async", 2, ok, 0, [0, 1], 0.95)["failed"] == "exit codes [0, 1]"
    assert accuracy.summarize("digits", "async", 2, ok, 0, None, 0.95)["failed"] == "timed out"


def test_table_compares_each_system_with_one_process():
    rows = [
        accuracy.summarize("digits", "one_process", 1, curve((1.0, 0.96), (2.0, 0.97)), 990, [0], 0.95),
        accuracy.summarize("digits", "allreduce", 2, curve((1.5, 0.9), (3.0, 0.965)), 990, [0, 0], 0.95),
    ]
    text = accuracy.table(rows)
    # 640 examples in 3.0 s against one process's 640 in 2.0 s.
    assert (
        "| digits | allreduce | 2 | 1 | 1 | 10.0 | 3.0 | 3.00 | 640 | 213 | 0.67 | 0.9650 | -0.5 |" in text
    ), text


def test_each_row_is_compared_with_one_process_at_its_steps_per_run_without_accumulation():
    def row(system, workers, secs, per_run=1, accumulate=1, start_examples=0):
        points = curve((secs / 2, 0.9), (secs, 0.96))
        for point in points:
            point["start_examples"] = start_examples
        out = accuracy.summarize("teacher", system, workers, points, 990, [0] * workers, 0.95)
        out.update(steps_per_run=per_run, accumulate_steps=accumulate)
        return out

    rows = [
        row("one_process", 1, 2.0),
        row("one_process", 1, 1.0, per_run=10, start_examples=320),
        row("one_process", 1, 4.0, accumulate=2),
        row("allreduce", 2, 0.5, per_run=10, start_examples=320),
        row("allreduce", 2, 3.0, accumulate=2),
    ]
    assert rows[1]["examples_per_sec"] == (640 - 320) / 1.0  # the first run's examples are start-up
    assert accuracy.reference_row(rows, rows[3]) is rows[1]
    assert accuracy.reference_row(rows, rows[4]) is rows[0]  # no accumulation, the same loop
    assert accuracy.reference_row(rows, rows[2]) is rows[0]
    text = accuracy.table(rows)
    line = "| teacher | allreduce | 2 | 10 | 1 | 10.0 | 0.5 | 0.50 | 640 | 640 | 2.00 | 0.9600 | +0.0 |"
    assert line in text, text


def test_teacher_data_is_fixed_and_every_class_is_there():
    x, y, hx, hy = accuracy.teacher_data(train=2000, held_out=500)
    assert x.shape == (2000, 24, 24, 3) and hx.shape == (500, 24, 24, 3)
    assert np.bincount(y, minlength=10).min() > 50
    np.testing.assert_array_equal(accuracy.teacher_data(train=2000, held_out=500)[1], y)


DIGITS_CLASS_COUNTS = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
DIGITS_PIXEL_SUM = 561_718


def test_digits_held_out_split_is_fixed_and_apart():
    x, y, hx, hy = accuracy.digits_data()
    assert len(y) + len(hy) == 1797 and len(hy) == 397
    # The shipped file is scikit-learn's load_digits(): its class counts and its pixels' total.
    assert np.bincount(np.concatenate([y, hy])).tolist() == DIGITS_CLASS_COUNTS
    assert round(float(np.concatenate([x, hx]).sum()) * 16) == DIGITS_PIXEL_SUM
    assert x.shape[1] == 64 and 0 <= x.min() and x.max() <= 1
    again = accuracy.digits_data()
    np.testing.assert_array_equal(again[3], hy)
    train_rows = {row.tobytes() for row in x}
    assert sum(row.tobytes() in train_rows for row in hx) < 5  # load_digits has a few duplicate images


def test_plot_draws_every_system(tmp_path):
    rows = [
        accuracy.summarize("digits", "one_process", 1, curve((1.0, 0.96), (2.0, 0.97)), 990, [0], 0.95),
        accuracy.summarize("digits", "async", 2, curve((1.5, 0.9), (3.0, 0.965)), 990, [0, 0], 0.95),
    ]
    path = accuracy.plot(rows, str(tmp_path / "plot.png"))
    assert path and os.path.getsize(path) > 10_000


@pytest.mark.cluster
def test_accuracy_command_end_to_end_on_digits(tmp_path):
    """One process and sync PS with 2 workers on digits, a small budget: a JSON report, a plot, a table."""
    out = tmp_path / "digits.json"
    r = subprocess.run(
        [
            sys.executable,
            ACCURACY,
            "--tasks=digits",
            "--systems=one_process,sync_ps",
            "--workers=2",
            "--examples=8000",
            f"--logdir={tmp_path / 'runs'}",
            f"--out={out}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(row["system"], row["workers"]) for row in rows] == [("one_process", 1), ("sync_ps", 2)]
    for row in rows:
        assert row["final_examples"] >= 7900 and row["final_accuracy"] > 0.8, row
    assert "| digits | sync_ps | 2 |" in r.stdout
    assert (tmp_path / "digits.png").exists()


@pytest.mark.cluster
# CI: MWMS; the PSS and TF default runs are the extended tier's (CI's time; both train in test_benchmark).
@pytest.mark.parametrize("system", extended_beyond(["tf2_pss", "tf2_mwms", "tf_default"], {"tf2_mwms"}))
def test_tf2_and_tf_default_systems_train_digits(system, tmp_path):
    """20 steps on 2 workers: held-out rows on the cadence, the step moving, every process exiting 0."""
    how = accuracy.SYSTEMS[system]
    examples = 20 * accuracy.examples_per_step(how, 2, accuracy.TASKS["digits"].batch_size)
    row = accuracy.run_system(
        "digits", system, 2, str(tmp_path), examples=examples, eval_every_steps=10, timeout=300
    )
    assert "failed" not in row, (row, _logs(tmp_path))  # also: every process exited 0
    steps = [c["global_step"] for c in accuracy.read_curve(str(tmp_path))]
    assert steps[0] < steps[-1] and steps[-1] >= 19, steps
    if how.peer:
        assert steps == [10, 20]  # a peer evaluates exactly on the cadence
    assert row["final_examples"] >= 19 * examples // 20 and row["final_accuracy"] > 0.2, row


def _logs(logdir) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text()[-1500:]}" for p in sorted(logdir.glob("*.log")))


def test_unknown_system_is_named_with_the_known_ones():
    r = subprocess.run(
        [sys.executable, ACCURACY, "--systems=one_process,horovod"], capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode != 0
    assert "unknown ['horovod']" in r.stderr and "allreduce" in r.stderr


@pytest.mark.cluster
def test_a_rerun_in_the_same_logdir_trains_afresh_and_leaves_no_checkpoint(tmp_path):
    """The second run would otherwise resume from the first's final checkpoint and train nothing."""
    runs = []
    for keep in (True, False):
        row = accuracy.run_system(
            "digits",
            "one_process",
            1,
            str(tmp_path),
            examples=1600,
            eval_every_steps=10,
            keep_checkpoints=keep,
        )
        assert "failed" not in row, (row, _logs(tmp_path))
        runs.append([c["global_step"] for c in accuracy.read_curve(str(tmp_path))])
        left = tf.compat.v1.train.latest_checkpoint(str(tmp_path))
        assert (left is not None) == keep, left
    assert runs[1] == runs[0] and runs[0][-1] >= 49, runs
