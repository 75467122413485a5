import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from disttrain.edges import cli, local


def test_each_worker_gets_its_own_gpu_and_ps_none():
    assert local.visible_devices("ps", 0, gpus=4) == ""
    assert [local.visible_devices("worker", i, gpus=4) for i in range(3)] == ["0", "1", "2"]
    assert local.visible_devices("chief", 0, gpus=4) == "0"
    assert local.visible_devices("worker", 1, gpus=4, gpus_per_worker=2) == "2,3"
    assert local.visible_devices("worker", 0, gpus=0) is None  # no GPUs: leave it unset


def test_cluster_layout_and_tf_config():
    c = local.LocalCluster(["x.gin"], "/tmp/l", num_ps=2, num_workers=2, chief=True, evaluator=True)
    assert [t.name for t in c.tasks] == [
        "/job:ps/task:0",
        "/job:ps/task:1",
        "/job:chief/task:0",
        "/job:worker/task:0",
        "/job:worker/task:1",
        "/job:evaluator/task:0",
    ]
    assert set(c.cluster) == {"ps", "chief", "worker"}  # the evaluator serves nothing
    assert all(a.startswith("127.0.0.1:") for job in c.cluster.values() for a in job)  # loopback only
    assert c.chief_task.name == "/job:chief/task:0"


def test_settings_are_given_whole_or_as_keywords_and_a_misspelt_one_is_refused():
    """LocalSettings' fields are keywords of LocalCluster too; a keyword overrides `settings`'s field."""
    at = lambda job, i: f"{job}.example:{2222 + i}"
    whole = local.LocalSettings(max_restarts=2, addresses=at, env={"A": "1"})
    c = local.LocalCluster(["x.gin"], "/tmp/l", settings=whole, restart_delay_secs=3.0)
    assert (c.settings.max_restarts, c.settings.restart_delay_secs, c.env) == (2, 3.0, {"A": "1"})
    assert c.cluster == {"ps": ["ps.example:2222"], "worker": ["worker.example:2222", "worker.example:2223"]}
    by_keyword = local.LocalCluster(["x.gin"], "/tmp/l", max_restarts=2)
    assert by_keyword.settings == local.LocalSettings(max_restarts=2)
    with pytest.raises(TypeError, match="max_restart"):
        local.LocalCluster(["x.gin"], "/tmp/l", max_restart=2)


def test_log_follower(tmp_path):
    path = tmp_path / "log"
    follower = local.LogFollower(str(path))
    assert follower.new_lines() == []
    path.write_text("a\nb")
    assert follower.new_lines() == ["a"]
    with open(path, "a") as f:
        f.write("c\n")
    assert follower.new_lines() == ["bc"]


def test_summary_table():
    results = {
        "worker_0": dict(
            local_steps=10,
            examples_per_sec=100.0,
            final_loss=0.5,
            cluster_examples_per_sec=190.0,
            chief=True,
            global_step=20,
        ),
        "worker_1": dict(
            local_steps=10,
            examples_per_sec=90.0,
            final_loss=0.4,
            cluster_examples_per_sec=0.0,
            global_step=20,
        ),
    }
    text = cli.summary(results, {"/job:ps/task:0": 0}, "/tmp/l")
    assert "cluster examples/sec 190.0" in text and "sum over tasks: 190.0" in text


def sleeper_popen(seconds: dict):
    """LocalCluster's popen: each task a plain Python process that logs a line and sleeps."""

    def popen(task, argv, env, log_file):
        code = (
            "import time; print('W0000 00:00:00.1 1 x.cc:1] noise'); "
            f"print('{task.name} waits for something'); "
            "print('I0000 00:00:00.2 1 x.cc:2] more noise', flush=True); "
            f"time.sleep({seconds.get(task.name, 0)})"
        )
        return subprocess.Popen([sys.executable, "-c", code], stdout=log_file, stderr=subprocess.STDOUT)

    return popen


def test_a_task_that_outlives_the_others_is_reported_once_with_where_it_waits(tmp_path):
    c = local.LocalCluster(
        ["x.gin"], str(tmp_path), num_ps=1, num_workers=2, popen=sleeper_popen({"/job:worker/task:1": 4})
    )
    codes = c.start().wait(timeout=60, outlive_secs=1)
    assert set(codes.values()) == {0}  # reported, not stopped: it ended by itself
    assert len(c.events) == 1, c.events
    event = c.events[0]
    assert event.startswith("/job:worker/task:1 is still running")
    assert "'/job:worker/task:1 waits for something'" in event and c.tasks[2].log_path in event


def test_an_outliving_task_is_stopped_only_by_the_timeout(tmp_path):
    c = local.LocalCluster(
        ["x.gin"], str(tmp_path), num_ps=1, num_workers=1, popen=sleeper_popen({"/job:worker/task:0": 60})
    )
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        c.start().wait(timeout=3, outlive_secs=1)
    assert time.monotonic() - started < 30
    assert [e.split(" is still")[0] for e in c.events] == ["/job:worker/task:0"]
    assert c.tasks[1].proc.poll() is not None  # stopped by the timeout


def test_ctrl_c_during_wait_stops_every_task_from_a_safe_point(tmp_path):
    """SIGINT becomes KeyboardInterrupt between the wait loop's ticks, never inside Popen.poll().

    Raised inside poll() just after it takes the Popen's lock, it left the lock held
    and stopping that task then blocked for ever (a launcher hung on Ctrl-C so).
    """
    c = local.LocalCluster(
        ["x.gin"],
        str(tmp_path),
        num_ps=1,
        num_workers=2,
        popen=sleeper_popen(
            dict.fromkeys(["/job:ps/task:0", "/job:worker/task:0", "/job:worker/task:1"], 60)
        ),
    )
    c.start()
    strays = []  # Ctrl-C that lands after wait() has given SIGINT back lands here, not in pytest

    def stray(signum, frame):
        strays.append(signum)

    previous = signal.signal(signal.SIGINT, stray)
    for k in range(20):  # a burst of Ctrl-C while the loop polls, and while it stops the tasks
        threading.Timer(0.5 + 0.05 * k, os.kill, (os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        c.wait(timeout=60)
    assert time.monotonic() - started < 20
    assert all(t.proc.poll() is not None for t in c.tasks)
    time.sleep(1.5)  # every timer has fired
    handler = signal.signal(signal.SIGINT, previous)
    assert handler is stray  # wait() gave SIGINT back to whoever had it


def test_drop_checkpoints_deletes_a_savers_files_and_keeps_logs_and_events(tmp_path):
    """A real saver's files (two steps, sharded), a save cut short, beside the run's logs and events."""
    import tensorflow as tf

    v1 = tf.compat.v1
    run = tmp_path / "run"
    run.mkdir()
    with tf.Graph().as_default():
        v1.get_variable("w", [256, 64])
        saver = v1.train.Saver(sharded=True)
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            for step in (0, 7):
                saver.save(session, str(run / "model.ckpt"), global_step=step)
            v1.summary.FileWriter(str(run), session.graph).close()
    (run / "model.ckpt-9_temp").mkdir()
    (run / "model.ckpt-9_temp" / "part-00000-of-00001.data-00000-of-00001.tempstate1").write_bytes(b"x" * 10)
    (run / "logs").mkdir()
    (run / "logs" / "worker_0.log").write_text("step 7\n")
    (run / "checkpoint_notes.txt").write_text("not a checkpoint")
    written = sum(f.stat().st_size for f in run.rglob("*") if f.is_file() and "model.ckpt" in str(f))
    assert v1.train.latest_checkpoint(str(run)) and written > 2 * 256 * 64 * 4

    freed = local.drop_checkpoints(str(run))

    assert v1.train.latest_checkpoint(str(run)) is None
    left = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    assert not [p for p in left if "model.ckpt" in p or p == "checkpoint"], left
    assert "logs/worker_0.log" in left and "checkpoint_notes.txt" in left
    assert any(p.startswith("events.out.tfevents") for p in left), left
    assert freed >= written


def test_free_ports_are_outside_the_range_outgoing_connections_take():
    # A task restarted on its port must find it free; the kernel gives ports of its ephemeral
    # range to any process's outgoing connections, so a dead task's port there can be taken.
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = (int(x) for x in f.read().split())
    ports = [local.free_port() for _ in range(100)]
    assert len(set(ports)) == 100  # never the same port twice to one process
    assert all(not low <= p <= high for p in ports), [p for p in ports if low <= p <= high]
    for p in ports[:10]:  # each one free to listen on
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
            s.listen()
