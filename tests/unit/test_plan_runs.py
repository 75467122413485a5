"""The planner's published runs as data: every file read, every run in one set, the sets kept apart, and
the docs' tables rendered from the rows (a toy model stands in for the zoo's: no TensorFlow graph)."""

from __future__ import annotations

import dataclasses
import glob
import os

import pytest

from disttrain.plan import cost, measured, published, report, runs

MB = 1e6


def toy_results():
    toy = cost.Model("m", 100 * MB, 0.1, 32, cost.even_layout(8), 8)
    return [
        published.predict_case(c, toy.replace(step_time=c.batch_size / c.one_gpu_images_per_sec))
        for c in runs.CASES
    ]


def test_every_data_file_is_in_a_set_and_every_table_in_its_files_set():
    names = {os.path.basename(p)[: -len(".json")] for p in glob.glob(os.path.join(runs.DATA, "*.json"))}
    listed = {name for s in runs.sets()["sets"] for name in s["files"]}
    assert names - {"sets", "benchmark_emulated_hosts"} == listed
    assert [s["name"] for s in runs.sets()["sets"]] == list(runs.SPLITS)
    for s in runs.sets()["sets"]:  # each held-out set says which rule chose it and how it was kept apart
        assert s["discipline"] and (s["name"] == runs.CALIBRATION or s["rule"])
    for name in listed:
        doc = runs.source_file(name)
        assert doc["source"] and doc["tables"]
        for t in doc["tables"]:
            assert t["key"] and t["citation"] and t["runs"]
            assert name in runs.set_info(t["set"])["files"], (name, t["key"])  # else it would be read by none


def test_every_run_is_read_once_with_a_model_of_the_zoo():
    tables = [
        t
        for name in {n for s in runs.sets()["sets"] for n in s["files"]}
        for t in runs.source_file(name)["tables"]
    ]
    assert len(runs.CASES) == sum(len(t["runs"]) for t in tables)
    keys = [t["key"] for t in tables]
    assert len(keys) == len(set(keys)) == len(runs.citations())
    for c in runs.CASES:
        assert c.gin_files == tuple(runs.sets()["models"][c.model])
        assert c.published_efficiency > 0 and c.one_gpu_images_per_sec > 0


def test_held_out_sets_share_no_source_with_another_set():
    by_split = {s: {c.source for c in runs.cases(s)} for s in runs.SPLITS}
    for split in runs.HELD_OUT_SPLITS[1:]:  # the first held-out set shares a page with the calibration set
        others = set().union(*(v for k, v in by_split.items() if k != split))
        assert not by_split[split] & others, split
    assert not any(c.calibrated for s in runs.HELD_OUT_SPLITS for c in runs.cases(s))


def test_an_unknown_set_is_named():
    with pytest.raises(runs.DataError, match="no set 'held-out, nowhere'"):
        runs.cases("held-out, nowhere")


def test_set_tables_and_the_summary_follow_the_rows():
    results = toy_results()
    for name, split in report.TABLE_SPLITS.items():
        rows = [r for r in results if r.case.split == split]
        text = report.set_table(split, results)
        assert text.count("\n| ") == len(rows) + 1, name  # the separator and one line a row
        for r in rows:
            assert f"{100 * r.error:+.0f}%" in text
    summary = report.summary_table(results)
    held = published.summary([r for r in results if r.case.split in runs.HELD_OUT_SPLITS])
    assert f"| **all held-out runs** | {held.rows} | {held.inside} (" in summary
    with pytest.raises(KeyError, match="no planner table"):
        report.calibration_table("plan_nothing")


def test_a_miss_prints_its_why_only_while_it_misses():
    results = toy_results()
    i = next(i for i, r in enumerate(results) if r.case.source == runs.SEED and r.case.why)
    r = results[i]

    def published_as(efficiency):
        case = dataclasses.replace(r.case, images_per_sec=None, efficiency=efficiency)
        return [*results[:i], dataclasses.replace(r, case=case), *results[i + 1 :]]

    assert r.case.why in report.set_table(runs.CALIBRATION, published_as(r.predicted[1] / 10))  # +900%
    assert r.case.why not in report.set_table(runs.CALIBRATION, published_as(r.predicted[1]))  # exact


def test_recorded_runs_are_reports_check_run_reads():
    doc = measured.recorded()
    pairs = measured.recorded_runs(doc)
    assert len(pairs) == len(doc["runs"]) > 0
    for (rep, run), r in zip(pairs, doc["runs"], strict=True):
        assert rep["reference"]["cpu_seconds_per_step"] == pytest.approx(r["reference_cpu_ms"] / 1e3)
        assert run["counted_steps_per_sec"] == r["measured_steps_per_sec"]
        assert measured.shape_of(rep, run).hosts == r["workers"]
