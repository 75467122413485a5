"""bin/launch_local.py as a user runs it: failure propagation, Ctrl-C, no orphans (README's main command:
tests/cluster/test_main_job.py)."""

import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests import REPO
from tests.cluster.helpers import TINY, wait_for_line

pytestmark = pytest.mark.cluster

LAUNCH = [
    sys.executable,
    os.path.join(REPO, "bin", "launch_local.py"),
    "--gin_file=gin/mlp_async.gin",
    f"--gin_file={TINY}",
]


def env():
    return {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}


def launch(*args, timeout):
    return subprocess.run(
        LAUNCH + list(args), capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env()
    )


def test_a_failing_task_stops_everything_and_is_named(tmp_path):
    # No PS for an async PS strategy: every replica fails at start with a configuration error.
    r = launch("--num_ps=0", "--num_workers=2", f"--logdir={tmp_path}", timeout=120)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("disttrain: error: /job:worker/task:") and "failed with exit code 2" in last, last
    assert "needs at least one 'ps' task" in r.stderr


def test_ctrl_c_stops_every_task_and_leaves_no_orphans(tmp_path):
    launcher = subprocess.Popen(
        LAUNCH
        + [
            "--num_ps=1",
            "--num_workers=1",
            "--gin_param=TrainConfig.train_steps=100000",
            f"--logdir={tmp_path}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env(),
    )
    try:
        wait_for_line(tmp_path / "logs" / "worker_0.log", r" /job:worker/task:0 step ", timeout=120)
        children = psutil.Process(launcher.pid).children(recursive=True)
        assert len(children) >= 2
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=30)
        assert launcher.returncode == 130, err[-2000:]
        assert "interrupted" in err
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if launcher.poll() is None:
            launcher.kill()
