"""SIGTERM as a preemption, in real processes: the flag, the bound, and Ctrl-C left alone."""

import os
import signal
import subprocess
import sys
import time

import pytest

from disttrain.base.config import RunSettings
from disttrain.base.errors import EXIT_TRANSIENT, ConfigError
from disttrain.runtime.recovery import checkpoint_step
from tests import REPO

# A task that never reaches a step boundary: only the bound can end it.
STUCK = """
import sys, time
from disttrain.base import preemption
notice = preemption.PROCESS.install(grace_secs=1.0)
try:  # "ready" inside: a Ctrl-C sent the moment it is read may land while it is printed
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
        if notice.requested():
            print("flag set:", notice.reason, flush=True)
            while True:
                time.sleep(0.05)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    sys.exit(130)
"""


def start():
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # As in a terminal: a CI job started in the background inherits SIGINT ignored, and Python
        # then installs no KeyboardInterrupt handler (the task hung for 30 s).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_sigterm_sets_the_flag_and_the_bound_ends_the_task_with_the_transient_code():
    proc = start()
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == EXIT_TRANSIENT, out
    assert "flag set: SIGTERM" in out
    assert "preempted (SIGTERM) and still running after 1 s (RunSettings.preempt_secs): exiting now" in out
    assert 0.9 < took < 10, took


def test_ctrl_c_is_left_alone():
    proc = start()
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "KeyboardInterrupt" in out, out


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="preempt_secs must be > 0 seconds, got 0"):
        RunSettings.of(preempt_secs=0)
    with pytest.raises(ConfigError, match="wait_log_secs must be > 0 seconds"):
        RunSettings.of(wait_log_secs=-1)


def test_checkpoint_step():
    assert checkpoint_step("/tmp/run/model.ckpt-5332") == 5332
    assert checkpoint_step(None) is None and checkpoint_step("/tmp/run/model.ckpt") is None
