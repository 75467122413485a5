"""The accuracy tool over seeds: end figures, mean and SE per system, seed-paired differences, --seeds."""

import json
import math

import pytest

from disttrain.bench import accuracy
from disttrain.scripts import accuracy as script


def row(system, seed, accuracies, accumulate=1, batch_scale=1, task="teacher", every=320):
    """A finished report row as run_system gives it: evaluations every `every` examples."""
    points = [
        {
            "global_step": i + 1,
            "examples": (i + 1) * every,
            "seconds": i + 1.0,
            "accuracy": a,
            "first_step_wall": 0,
        }
        for i, a in enumerate(accuracies)
    ]
    out = accuracy.summarize(task, system, 2, points, 0, [0, 0], 0.6)
    out.update(seed=seed, steps_per_run=10, accumulate_steps=accumulate, batch_scale=batch_scale)
    return out


def test_mean_and_se_is_the_sample_standard_error_and_none_for_one_value():
    mean, se = accuracy.mean_and_se([0.60, 0.62, 0.64])
    assert mean == pytest.approx(0.62) and se == pytest.approx(0.02 / math.sqrt(3))
    assert accuracy.mean_and_se([0.7]) == (0.7, None)


def test_last_three_evaluations_count_an_end_at_the_same_examples_once():
    curve = [(1.0, 100, 0.5), (2.0, 200, 0.6), (3.0, 300, 0.7), (4.0, 400, 0.8), (4.1, 400, 0.9)]
    assert accuracy.last_mean(curve) == pytest.approx((0.6 + 0.7 + 0.9) / 3)
    assert accuracy.last_mean(curve[:1]) == 0.5
    assert row("allreduce", 0, [0.5, 0.6, 0.7, 0.8])["last3_accuracy"] == pytest.approx(0.7)


def test_over_seeds_groups_each_system_and_settings_and_leaves_failed_runs_out():
    rows = [row("allreduce", s, [0.5, 0.6, a]) for s, a in enumerate([0.60, 0.64, 0.62])]
    rows.append(dict(row("allreduce", 3, [0.1]), failed="timed out"))
    rows.append(row("allreduce", 0, [0.5, 0.6, 0.7], accumulate=2))
    by = {e["accumulate_steps"]: e for e in accuracy.over_seeds(rows)}
    assert by[1]["seeds"] == [0, 1, 2] and by[2]["seeds"] == [0]
    assert by[1]["final"] == pytest.approx(0.62) and by[1]["final_se"] == pytest.approx(0.02 / math.sqrt(3))
    assert by[1]["last3"] == pytest.approx((0.5 + 0.6 + 0.62) / 3) and by[2]["final_se"] is None


def test_16_bit_is_paired_with_float32_at_the_same_seed():
    # Seeds move float32's end by points; 16-bit is 1 point below it at every seed. Rows in any order.
    base = {0: 0.60, 1: 0.70, 2: 0.55}
    rows = [row("sync_ps_bf16", s, [0.4, 0.5, base[s] - 0.01]) for s in (2, 0, 1)]
    rows += [row("sync_ps", s, [0.4, 0.5, base[s]]) for s in (0, 1, 2)]
    rows.append(row("sync_ps_bf16", 3, [0.4, 0.5, 0.9]))  # no float32 twin at seed 3: not a pair
    (pair,) = accuracy.paired_differences(rows)
    assert (pair["kind"], pair["system"], pair["against"]) == ("16-bit", "sync_ps_bf16", "sync_ps")
    assert sorted(pair["seeds"]) == [0, 1, 2]
    assert pair["final_points"] == pytest.approx(-1.0) and pair["final_points_se"] == pytest.approx(
        0, abs=1e-9
    )
    assert pair["last3_points"] == pytest.approx(-1 / 3)
    assert "| teacher | sync_ps_bf16 | sync_ps | 2 | 10 | 1 | 1 | 3 | -1.0 ± 0.0 | -0.3 ± 0.0 |" in (
        accuracy.paired_table(rows)
    )


def test_accumulation_is_paired_with_one_step_of_the_same_global_batch():
    rows = [row("allreduce", s, [0.5, 0.6, 0.60 + 0.02 * s], accumulate=2) for s in (0, 1)]
    rows += [row("allreduce", s, [0.5, 0.6, 0.61], batch_scale=2) for s in (0, 1)]
    rows += [row("allreduce", s, [0.5, 0.6, 0.9]) for s in (0, 1)]  # the task's batch alone: not the twin
    (pair,) = accuracy.paired_differences(rows)
    assert (pair["kind"], pair["against"], pair["accumulate_steps"]) == ("accumulation", "allreduce", 2)
    assert pair["final_points"] == pytest.approx(0.0) and pair["final_points_se"] == pytest.approx(1.0)


def test_a_single_seed_has_no_pairs_and_failed_twins_none():
    rows = [row("allreduce", 0, [0.6]), dict(row("allreduce_bf16", 0, [0.6]), failed="exit codes [0, 1]")]
    assert accuracy.paired_differences(rows) == []


def test_seeds_flag_takes_distinct_integers_from_zero():
    assert script._counts("seeds", ["0", "1", "4"], minimum=0) == [0, 1, 4]
    assert script._counts("batch_scale", ["1", "2"]) == [1, 2]


@pytest.mark.parametrize("values, minimum", [(["0", "0"], 0), (["-1"], 0), (["a"], 0), ([], 0), (["0"], 1)])
def test_bad_seeds_or_counts_exit_2_with_one_line(values, minimum, capsys):
    with pytest.raises(SystemExit) as stop:
        script._counts("seeds", values, minimum=minimum)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--seeds=" in err and f">= {minimum}" in err


def test_a_tf2_peer_is_given_the_seed(tmp_path):
    argv = accuracy.peer_command("digits", "tf2_mwms", 2, 640, 10, str(tmp_path), seed=3)
    with open(tmp_path / "peer_spec.json") as f:
        assert json.load(f)["heldout"]["seed"] == 3
    assert argv[-1] == f"--spec={tmp_path / 'peer_spec.json'}"


def test_plot_labels_each_system_once_over_seeds(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt  # the `bench` extra, which the test command installs: never a skip

    rows = [row("allreduce", s, [0.5, 0.6, 0.7]) for s in (0, 1, 2)] + [
        row("allreduce", 0, [0.6], batch_scale=2)
    ]
    drawn, savefig = [], plt.Figure.savefig

    def keep_labels(fig, *args, **kwargs):
        drawn.extend(line.get_label() for line in fig.axes[0].get_lines())
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", keep_labels)
    assert accuracy.plot(rows, str(tmp_path / "p.png"))
    shown = [label for label in drawn if not label.startswith("_")]  # matplotlib's own: _child0 ...
    assert shown == ["allreduce (2, 10 steps/run)", "allreduce (2, 10 steps/run, 2 x the batch)"], drawn


def test_each_row_is_compared_with_one_process_at_its_seed_and_a_scaled_batch_is_shown():
    rows = [row("one_process", s, [0.5, 0.6 + 0.01 * s]) for s in (0, 1)]
    rows += [
        row("one_process", 1, [0.5, 0.9], batch_scale=2),
        row("allreduce", 1, [0.5, 0.62], batch_scale=2),
    ]
    assert accuracy.reference_row(rows, rows[3]) is rows[1]  # seed 1, the task's batch
    assert "| teacher | allreduce | 2 | 10 | 1 (batch x2) |" in accuracy.table(rows)
    assert "| 0.6200 | +1.0 |" in accuracy.table(rows)  # against seed 1's 0.61
