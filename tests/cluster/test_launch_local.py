"""bin/launch_local.py as a user runs it: failure propagation, Ctrl-C, no orphans (README's main command:
tests/cluster/test_main_job.py)."""

import json
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


def listening(pid) -> dict[int, str]:
    """Port -> local address (hex, as the kernel writes it) of each TCP socket listening in pid's netns."""
    found = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except FileNotFoundError:
            continue
        for row in rows:
            address, port = row[1].rsplit(":", 1)
            if row[3] == "0A":  # TCP_LISTEN
                found[int(port, 16)] = address
    return found


def interfaces(pid) -> set[str]:
    with open(f"/proc/{pid}/net/dev") as f:
        return {line.split(":")[0].strip() for line in f.readlines()[2:]}


def task_port(proc: psutil.Process) -> int:
    config = json.loads(proc.environ()["TF_CONFIG"])
    job, index = config["task"]["type"], config["task"]["index"]
    return int(config["cluster"][job][index].rsplit(":", 1)[1])


def test_tasks_listen_only_on_a_private_loopback_and_ctrl_c_stops_them_all(tmp_path):
    """TF's servers listen on every interface; launched as root they sit in a namespace with only lo."""
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
        tasks = [p for p in children if "disttrain.scripts.train" in " ".join(p.cmdline())]
        assert len(tasks) == 2, [p.cmdline() for p in children]
        seen = {p.pid: (task_port(p), listening(p.pid), interfaces(p.pid)) for p in tasks}
        here = listening("self")
        private = [os.readlink(f"/proc/{p.pid}/ns/net") != os.readlink("/proc/self/ns/net") for p in tasks]
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=30)
        assert launcher.returncode == 130, err[-2000:]
        assert "interrupted" in err
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if launcher.poll() is None:
            launcher.kill()
    for port, theirs, _ in seen.values():
        assert port in theirs, (port, theirs)  # the task's server, seen from its own namespace
    if "in a network namespace of their own" in out:
        assert all(private), private
        for port, _, devices in seen.values():
            assert devices == {"lo"}, devices  # nothing but loopback reaches that namespace
            assert port not in here, (port, here[port])  # and no socket of this machine's network
    else:  # no root: what is exposed is said, plainly
        assert "TensorFlow's servers listen on every interface" in out, out[:2000]
