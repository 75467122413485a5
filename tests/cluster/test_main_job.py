"""README's main command, the main job, as a user runs it: one run, read by every test here.

The command is read from README's "Set up" line and run as written (bin/launch_local.py,
gin/mlp_async.gin, 2 PS and 2 workers, its steps) in a user's environment, with the tiny
overlay's MLP and three settings the checks need: a log line every 4 steps (several intervals
even if one worker takes most steps), a trace of one step, and a checkpoint every 100 steps
(so that step 0's stays among the 5 kept).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest
import tensorflow as tf

from disttrain.launch import read_results
from tests import REPO
from tests.cluster.helpers import TINY, moved_weights, saved_steps, scalars, texts, user_env
from tests.cluster.test_quiet_console import MLIR, SERVER_START, START_UP, TF_CPP, TF_PYTHON, found

pytestmark = [pytest.mark.cluster, pytest.mark.quick]

SETTINGS = ["log_every_steps=4", "trace_steps=1", "save_checkpoint_steps=100"]


def readme_main_command() -> list[str]:
    """README's main command (its line that installs and runs bin/launch_local.py), as argv."""
    with open(os.path.join(REPO, "README.md")) as f:
        line = next(x for x in f if x.startswith("python -m pip install") and "bin/launch_local.py" in x)
    argv = shlex.split(line.split("&&", 1)[1])
    assert argv[:2] == ["python", "bin/launch_local.py"], argv
    return [sys.executable, os.path.join(REPO, "bin", "launch_local.py"), *argv[2:]]


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    """The run: its console (stdout, stderr), log directory, task logs and README's step count."""
    argv = readme_main_command()
    assert "--gin_file=gin/mlp_async.gin" in argv and "--num_ps=2" in argv and "--num_workers=2" in argv
    (steps,) = [
        int(a.rsplit("=", 1)[1]) for a in argv if a.startswith("--gin_param=TrainConfig.train_steps=")
    ]
    logdir = str(tmp_path_factory.mktemp("main_job"))
    argv += [f"--gin_file={TINY}", *(f"--gin_param=TrainConfig.{s}" for s in SETTINGS), f"--logdir={logdir}"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO, env=user_env())
    logs = {
        os.path.basename(p): open(p).read() for p in sorted(glob.glob(os.path.join(logdir, "logs", "*.log")))
    }
    tails = "\n".join(f"--- {name}\n{text[-2500:]}" for name, text in logs.items())
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}\n{tails}"
    return SimpleNamespace(stdout=r.stdout, stderr=r.stderr, logdir=logdir, logs=logs, steps=steps)


def test_it_trains_to_readmes_last_step_summarises_and_every_task_exits_0(main_job):
    assert "summary:" in main_job.stdout and "cluster examples/sec" in main_job.stdout
    (line,) = [x for x in main_job.stdout.splitlines() if x.strip().startswith("exit codes:")]
    tasks = ("/job:ps/task:0", "/job:ps/task:1", "/job:worker/task:0", "/job:worker/task:1")
    assert re.findall(r"(/job:\w+/task:\d+) (-?\d+)", line) == [(t, "0") for t in tasks], line  # PS too
    assert set(main_job.logs) == {"ps_0.log", "ps_1.log", "worker_0.log", "worker_1.log"}
    assert tf.train.load_checkpoint(main_job.logdir).get_tensor("global_step") >= main_job.steps
    saved = saved_steps(main_job.logdir)
    assert saved[0] == 0 and saved[-1] >= main_job.steps, saved
    assert moved_weights(main_job.logdir, saved[0], saved[-1])
    r = read_results(main_job.logdir)
    assert set(r) == {"worker_0", "worker_1"} and all(x["local_steps"] > 0 for x in r.values())


def test_no_tensorflow_start_up_line_on_the_console_or_in_a_task_log(main_job):
    """tests/cluster/test_quiet_console.py: the words looked for, and TensorFlow logging at INFO."""
    for name, text in {"console": main_job.stdout + main_job.stderr, **main_job.logs}.items():
        lines = found(text, (*START_UP, SERVER_START, MLIR, *TF_CPP, *TF_PYTHON))
        assert not lines, f"{name} has TensorFlow lines:\n" + "\n".join(lines)


def test_the_loss_falls_and_throughput_is_written_for_the_cluster_and_each_worker(main_job):
    losses = scalars(main_job.logdir, "loss")
    assert len(losses) >= 2, main_job.logs["worker_0.log"][-3000:]
    assert losses[-1][1] < losses[0][1], losses
    assert scalars(main_job.logdir, "examples/sec") and scalars(main_job.logdir, "global_step/sec")
    for worker in ("worker_0", "worker_1"):
        assert scalars(os.path.join(main_job.logdir, "tasks", worker), "examples/sec")


def test_tensorboard_and_the_chief_say_what_ran(main_job):
    """Settings, cluster, strategy, placement and the operative gin config; the placement printed."""
    assert os.path.exists(os.path.join(main_job.logdir, "operative_config.gin"))
    described = texts(main_job.logdir)
    assert set(described) == {
        "run/settings",
        "run/cluster",
        "run/strategy",
        "run/placement",
        "run/gin_config",
    }
    assert "/job:worker/task:0" in described["run/cluster"] and "/job:ps/task:1" in described["run/cluster"]
    assert described["run/strategy"].strip().startswith("AsyncParameterServer(num_towers=1")
    assert "busiest PS / mean" in described["run/placement"]
    assert f"TrainConfig.train_steps = {main_job.steps}" in described["run/gin_config"]
    assert "log_every_steps=4" in described["run/settings"]
    assert "busiest PS / mean" in main_job.logs["worker_0.log"]  # the placement report, by the chief


@pytest.mark.parametrize("worker", ["worker_0", "worker_1"])
def test_each_worker_traces_a_step_with_the_ps_ops_in_it(main_job, worker):
    (trace,) = glob.glob(os.path.join(main_job.logdir, "tasks", worker, "trace_step_*.json"))
    events = json.load(open(trace))["traceEvents"]
    devices = {e["args"]["name"].split()[0] for e in events if e.get("name") == "process_name"}
    assert {d.split("/replica")[0] for d in devices} >= {"/job:ps", "/job:worker"}, devices
    assert any(e.get("ph") == "X" and e["args"]["name"].startswith("fc") for e in events)


def test_each_worker_says_where_its_step_went_in_its_result_tensorboard_and_the_summary(main_job):
    results = read_results(main_job.logdir)
    for name, r in results.items():
        where = r["breakdown"]
        assert where is not None and where["traced"] >= 1, name
        assert sum(where["seconds"].values()) == pytest.approx(where["step_secs"]), name
        assert where["seconds"]["compute"] > 0 and 0 <= where["trace_cost"] < 0.5, name
        shares = scalars(os.path.join(main_job.logdir, "tasks", name), "time/compute")
        assert shares and all(0 <= share <= 1 for _, share in shares), name
    lines = main_job.stdout.split("where the step went:", 1)[1].splitlines()
    for name in results:
        (line,) = [x for x in lines if x.strip().startswith(name + " ")]
        assert re.search(r"step [\d.]+ ms: compute \d+%, input \d+%, peers \d+%, transfer \d+%", line), line


def test_the_summary_ends_with_the_runs_verdict_and_diagnose_reads_the_run(main_job):
    (line,) = [x for x in main_job.stdout.splitlines() if x.strip().startswith("verdict:")]
    assert f"(more: disttrain-diagnose {main_job.logdir})" in line
    script = os.path.join(REPO, "bin", "diagnose.py")
    r = subprocess.run([sys.executable, script, main_job.logdir], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "strategy: AsyncParameterServer" in r.stdout and "bytes of variables per PS: " in r.stdout
    assert re.search(r"worker_0 +step [\d.]+ ms: compute", r.stdout) and "\nverdict: " in r.stdout
