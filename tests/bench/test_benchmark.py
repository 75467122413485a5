"""bin/benchmark.py end to end at tiny size: on loopback, and on emulated hosts (root)."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import gin
import pytest

from disttrain.bench import netem, runner
from disttrain.edges import configurables
from tests import REPO

BENCHMARK = os.path.join(REPO, "bin", "benchmark.py")
TINY = "gin/testing/tiny.gin"
RUN_KEYS = {
    "system",
    "strategy",
    "network",
    "workers",
    "ps",
    "link_mbit",
    "steps_per_sec",
    "examples_per_sec",
    "min_worker_steps_per_sec",
    "bound_steps_per_sec",
    "efficiency_vs_bound",
    "busiest_link_bytes_per_step",
    "min_link_bytes_per_step",
    "ps_load_max_over_mean",
    "scaling_efficiency",
}
# The tiny MLP, disttrain only, 1 worker + 1 PS, each on its own emulated host at 100 Mbit/s.
TINY_EMULATED = [
    "--gin_file=gin/bench/mlp.gin",
    f"--gin_file={TINY}",
    "--workers=1",
    "--ps=1",
    "--systems=disttrain",
    "--network=emulated",
    "--link_mbit=100",
]


def benchmark(args, tmp_path, timeout=240) -> tuple[subprocess.CompletedProcess, dict | None, int]:
    """Run bin/benchmark.py; return the process, its JSON report (if written) and its pid."""
    out = tmp_path / "report.json"
    argv = [sys.executable, BENCHMARK, f"--logdir={tmp_path / 'logs'}", f"--out={out}", *args]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    report = json.loads(out.read_text()) if out.exists() else None
    return done, report, proc.pid


def _explain(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"


def _check_row(run: dict) -> None:
    assert RUN_KEYS <= set(run), sorted(RUN_KEYS - set(run))
    assert run["error"] is None, run["error"]
    assert run["steps_per_sec"] > 0 and run["examples_per_sec"] > 0
    assert 0 < run["min_worker_steps_per_sec"] <= max(run["per_worker_steps_per_sec"])
    assert run["bound_steps_per_sec"] > 0
    assert 0 < run["efficiency_vs_bound"] < 1.5
    assert 0 < run["scaling_efficiency"] < 1.5
    assert run["ps_load_max_over_mean"] == pytest.approx(1.0)  # one PS holds everything


@pytest.mark.cluster
def test_localhost_both_systems(tmp_path):
    args = [
        "--gin_file=gin/bench/mlp.gin",
        f"--gin_file={TINY}",
        "--workers=1",
        "--ps=1",
        "--systems=disttrain,tf_default",
        "--warmup_steps=10",
        "--measure_steps=20",
        # Overlap builds a QueueRunner, which TensorFlow calls deprecated: no notice may reach the console.
        "--gin_param=AsyncParameterServer.overlap=True",
    ]
    done, report, _ = benchmark(args, tmp_path)
    assert done.returncode == 0, _explain(done)
    assert "deprecated" not in done.stdout + done.stderr, _explain(done)
    assert report["reference"]["steps_per_sec"] > 0
    assert report["config"]["intra_op_threads"] == 1
    runs = report["runs"]
    assert [(r["system"], r["strategy"], r["workers"], r["ps"]) for r in runs] == [
        ("disttrain", "async_ps", 1, 1),
        ("tf_default", "async_ps", 1, 1),
    ]
    for run in runs:
        _check_row(run)
        assert run["network"] == "localhost" and run["link_mbit"] is None
        assert run["busiest_link_bytes_per_step"] is None  # loopback has no per-host counters
        assert run["bound_limited_by"] == "compute"  # unlimited links: the bound is N x one process
        assert run["bound_steps_per_sec"] == pytest.approx(report["reference"]["steps_per_sec"])
    # Each measured run's checkpoints are deleted (--keep_checkpoints keeps them); its logs stay.
    logs = tmp_path / "logs"
    assert not [p.name for p in logs.rglob("*") if p.name == "checkpoint" or ".ckpt-" in p.name]
    assert len(list(logs.glob("*/logs/*.log"))) >= 3  # the reference's and both runs'
    assert "tf_default" in done.stdout and "summary:" in done.stdout
    assert os.path.getsize(tmp_path / "report.png") > 0


@pytest.mark.netem
def test_emulated_link_bytes_and_cleanup(tmp_path):
    reason = netem.check_permitted()
    if reason is not None:
        pytest.skip(reason)
    args = [
        *TINY_EMULATED,
        "--warmup_steps=10",
        # The window's step count can be off by about one step at each end (the chief's logged
        # global step is read during its step): 40 steps keep that error near 5%, inside 0.9.
        "--measure_steps=40",
    ]
    done, report, pid = benchmark(args, tmp_path)
    assert done.returncode == 0, _explain(done)
    (run,) = report["runs"]
    _check_row(run)
    assert (run["network"], run["link_mbit"], run["bound_limited_by"]) == ("emulated", 100.0, "network")
    # Tiny MLP: 32*64+64 + 64*64+64 + 64*10+10 = 6,922 params = 27,688 bytes each way per step.
    assert report["config"]["model_bytes"] == 27_688
    assert run["busiest_link_bytes_per_step"] > 0 and run["min_link_bytes_per_step"] > 0
    hosts = {h["tasks"]: h for h in run["link_bytes_per_step"]}
    assert set(hosts) == {"worker0", "ps0"}  # dedicated: the PS on its own host
    # The payload must be there in both directions. At this size the per-step RPCs, their
    # headers and the ACKs add ~10-20 KB (measured 27.7-44.6 KB sent per step).
    for h in hosts.values():
        assert 0.9 * 27_688 < h["sent"] < 2.5 * 27_688
        assert 0.9 * 27_688 < h["received"] < 2.5 * 27_688
    left = [ns for ns in netem._netns_list() if ns.startswith(f"dtbench-{pid}-")]
    assert not left, f"namespaces left behind: {left}"


@pytest.mark.netem
def test_ctrl_c_leaves_no_namespaces_or_tasks(tmp_path):
    reason = netem.check_permitted()
    if reason is not None:
        pytest.skip(reason)
    logdir = tmp_path / "logs"
    argv = [
        sys.executable,
        BENCHMARK,
        *TINY_EMULATED,
        "--reference=false",
        "--measure_steps=1000000",  # never finishes by itself
        f"--logdir={logdir}",
    ]
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    try:
        mine = lambda: [ns for ns in netem._netns_list() if ns.startswith(f"dtbench-{proc.pid}-")]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not list(logdir.glob("*/logs/worker_0.log")):
            time.sleep(0.2)
        time.sleep(3)  # the tasks are up inside their namespaces
        assert mine(), "the run never started"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out[-2000:]
    assert out.strip().splitlines()[-1] == "disttrain: error: interrupted"
    assert not mine()
    left = subprocess.run(["pgrep", "-f", f"logdir={logdir}"], capture_output=True, text=True).stdout
    assert not left.strip(), f"tasks left running: {left}"


@pytest.mark.netem
def test_emulated_needs_a_link_rate(tmp_path):
    done, _, _ = benchmark(["--gin_file=gin/bench/mlp.gin", "--network=emulated"], tmp_path, timeout=120)
    assert done.returncode != 0
    assert "--link_mbit" in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "args, said",
    [
        (["--network=emulated", "--link_mbit=100", "--link_ratio=1"], "--link_mbit (Mbit/s) or --link_ratio"),
        (["--network=emulated", "--link_ratio=0"], "--link_ratio must be > 0, got 0.0"),
        (["--network=emulated", "--link_ratio=1", "--noreference"], "drop --noreference"),
        (["--link_ratio=1"], "shape emulated links: use --network=emulated"),
    ],
    ids=["both", "zero", "no_reference", "localhost"],
)
def test_a_link_rate_given_wrong_is_one_line_before_anything_runs(tmp_path, args, said):
    done, report, _ = benchmark(["--gin_file=gin/bench/mlp.gin", *args], tmp_path, timeout=120)
    assert done.returncode != 0 and report is None
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("disttrain: error: ") and said in last, last


@pytest.mark.netem
def test_a_link_at_a_ratio_is_set_from_the_reference_and_used_by_every_run(tmp_path):
    reason = netem.check_permitted()
    if reason is not None:
        pytest.skip(reason)
    args = [a for a in TINY_EMULATED if not a.startswith("--link_mbit")]
    done, report, _ = benchmark([*args, "--link_ratio=2", "--warmup_steps=5", "--measure_steps=10"], tmp_path)
    assert done.returncode == 0, _explain(done)
    config, (run,) = report["config"], report["runs"]
    step = 1 / report["reference"]["steps_per_sec"]
    # The tiny MLP's 27,688 bytes each way in 2 x one process's step.
    expected = 27_688 * 8 / (2 * step) / 1e6
    assert config["link_ratio"] == 2.0 and config["link_mbit"] == pytest.approx(expected)
    assert run["link_mbit"] == config["link_mbit"]
    assert f"link: {expected:.0f} Mbit/s each way" in done.stdout


@pytest.mark.netem
def test_latency_unsupported_is_one_line(tmp_path):
    if netem.check_permitted() is not None:
        pytest.skip(netem.check_permitted())
    if netem.check_permitted(latency=True) is None:
        pytest.skip("this kernel has sch_netem: latency works")
    args = ["--gin_file=gin/bench/mlp.gin", "--network=emulated", "--link_mbit=100", "--link_latency_ms=5"]
    done, report, _ = benchmark(args, tmp_path, timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("disttrain: error: emulated hosts unavailable") and "sch_netem" in last
    assert report is None  # nothing ran


CONFIGS = sorted(
    p for p in glob.glob(os.path.join(REPO, "gin", "bench", "*.gin")) if not p.endswith("common.gin")
)


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_bench_configs_parse(path):
    configurables.register_all()
    gin.add_config_file_search_path(REPO)
    gin.clear_config()
    try:
        gin.parse_config_files_and_bindings([path, os.path.join(REPO, TINY)], [], skip_unknown=False)
        config = configurables.train_config().validate()
    finally:
        gin.clear_config()
    assert config.intra_op_threads == 1


def test_each_benchmark_gets_its_own_log_directory():
    # Runs' directories are emptied before each run: a shared default would let two
    # benchmarks running at once delete each other's logs.
    first, second = (runner.BenchConfig(gin_files=[], load_config=None).logdir for _ in range(2))
    assert first != second
    assert os.path.dirname(first) == os.path.dirname(second) == "/tmp/disttrain_bench"


def test_several_strategies_of_disttrain_are_systems_of_one_run(tmp_path):
    assert runner._strategy_of("disttrain:hybrid") == "hybrid"
    assert runner._strategy_of("disttrain") is None and runner._strategy_of("tf_default") is None
    done, _, _ = benchmark(
        ["--gin_file=gin/bench/mlp.gin", "--systems=disttrain:nope"], tmp_path, timeout=120
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "--systems=disttrain:nope" in last and "disttrain:<strategy>" in last and "hybrid" in last, last
