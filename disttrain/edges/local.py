"""A whole cluster on this machine: one `disttrain-train` process per task, on free loopback ports.

Used by bin/launch_local.py, the cluster tests and the benchmark. Every task
logs to its own file; the first task to fail stops the rest; nothing outlives
the launcher (each child gets SIGTERM if the launcher dies).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from disttrain.base.cluster import CHIEF, EVALUATOR, PS, WORKER, task_name

# Every task runs this disttrain's training entry (the same one whether installed or a checkout).
TRAIN_COMMAND = (sys.executable, "-m", "disttrain.scripts.train")
# The directory above the disttrain package (this file is disttrain/edges/local.py).
_IMPORT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# TF's C++ log lines ("W0000 00:00:1795434058.537775   16892 file.cc:432] ...") and absl's preamble.
_TF_CPP_LOG = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d|WARNING: All log messages before absl)")


_LOWEST_PORT = 20000  # below: ports services are commonly configured on
_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port no one listens on, outside the kernel's ephemeral range.

    A task restarted on its port must find it free. A port from `bind(0)` is
    one the kernel also gives to outgoing connections: once its task dies,
    any process's next gRPC connection may take it, and the restart fails
    with "already in use" (seen under two test files at a time). Ports
    outside the ephemeral range are never chosen for outgoing connections.
    """
    low, high = _ephemeral_range()
    choices = [p for p in range(_LOWEST_PORT, 65536) if (p < low or p > high) and p not in _handed_out]
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(choices)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # the range is crowded: any free port, as the kernel picks it
        s.bind((host, 0))
        return s.getsockname()[1]


# A checkpoint's files as TF's savers name them: <prefix>-<step>.index/.meta/.data-i-of-n, the
# <prefix>-<step>_temp directory of a save cut short, and the `checkpoint` state file.
_CHECKPOINT_FILE = re.compile(r"^(checkpoint|.+-\d+(\.index|\.meta|\.data-\d+-of-\d+|_temp))$")


def drop_checkpoints(logdir: str) -> int:
    """Deletes the checkpoints under `logdir` (a finished run's), keeping logs and events; bytes freed.

    For measuring tools whose runs are never resumed: each run's checkpoints
    (a DLRM run's hold its tables and their slots twice) would otherwise
    fill the disk over a few invocations.
    """
    freed = 0
    for root, dirs, files in os.walk(logdir, topdown=True):
        for name in [d for d in dirs if _CHECKPOINT_FILE.match(d)]:
            path = os.path.join(root, name)
            freed += sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
            shutil.rmtree(path, ignore_errors=True)
            dirs.remove(name)
        for name in files:
            if _CHECKPOINT_FILE.match(name):
                path = os.path.join(root, name)
                with contextlib.suppress(OSError):
                    freed += os.path.getsize(path)
                    os.remove(path)
    return freed


def die_with_parent() -> None:
    """In the child: get SIGTERM when the launcher dies, so no task is orphaned."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def task_env(env: dict) -> dict:
    """`env` for a task process: it imports the disttrain this launcher runs, wherever it lives."""
    path = env.get("PYTHONPATH")
    return dict(env, PYTHONPATH=_IMPORT_ROOT + (os.pathsep + path if path else ""))


def task_process_options(log_file) -> dict:
    """Popen options for one task: output to its log, ended with the launcher.

    Tasks inherit the launcher's working directory, so relative gin paths
    mean the same to both.
    """
    return dict(stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)


def gpu_count() -> int:
    """GPUs on this machine, without importing TensorFlow in the launcher."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def visible_devices(job: str, index: int, gpus: int, gpus_per_worker: int = 1) -> str | None:
    """CUDA_VISIBLE_DEVICES for a task: PS none, each replica its own GPUs.

    None leaves the variable unset (no GPUs on this machine).
    """
    if job == PS:
        return ""
    if not gpus:
        return None
    first = (index * gpus_per_worker) % gpus
    return ",".join(str((first + k) % gpus) for k in range(gpus_per_worker))


def stop_processes(procs: Sequence[subprocess.Popen], grace_secs: float = 5.0) -> None:
    """SIGTERM, then SIGKILL what is left after `grace_secs`; reaps every process."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.terminate()
    deadline = time.monotonic() + grace_secs
    for p in live:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@dataclasses.dataclass
class Task:
    job: str
    index: int
    address: str | None
    log_path: str
    proc: subprocess.Popen | None = None
    started: float = 0.0  # time.monotonic() at its latest start

    @property
    def name(self) -> str:
        return task_name(self.job, self.index)


@dataclasses.dataclass(frozen=True)
class LocalSettings:
    """How a local cluster's tasks run, whatever its shape: where they listen, how they start and restart.

    host: the address whose free ports the tasks listen on, unless `addresses` is given.
    env: the tasks' environment (None: this process's, when the cluster is made).
    addresses(job, index): each task's address, for tasks started elsewhere.
    popen(task, argv, env, log_file): starts a task elsewhere (the benchmark: in its own network
      namespace); None: a local process.
    gpus_per_worker: the GPUs each replica sees (CUDA_VISIBLE_DEVICES; PS tasks see none).
    max_restarts: how often a task that died of a signal or a transient exit code is restarted, as
      an orchestrator would (0: the first death stops the cluster).
    restart_delay_secs: how long a dead task waits before its restart (an orchestrator's back-off).
    on_event(message): called with each event (a death, a restart, a task outliving the others).
    """

    host: str = "127.0.0.1"
    env: dict | None = None
    addresses: Callable[[str, int], str] | None = None
    popen: Callable | None = None
    gpus_per_worker: int = 1
    max_restarts: int = 0
    restart_delay_secs: float = 0.0
    on_event: Callable[[str], None] | None = None


def _tasks(
    logdir: str,
    num_ps: int,
    num_workers: int,
    chief: bool,
    evaluator: bool,
    address: Callable[[str, int], str],
) -> list[Task]:
    """The cluster's tasks, PS first, each with its address (the evaluator has none) and its log file."""
    jobs = [(PS, num_ps), (CHIEF, 1 if chief else 0), (WORKER, num_workers)]
    tasks = [
        Task(job, i, address(job, i), os.path.join(logdir, "logs", f"{job}_{i}.log"))
        for job, count in jobs
        for i in range(count)
    ]
    if evaluator:
        tasks.append(Task(EVALUATOR, 0, None, os.path.join(logdir, "logs", "evaluator_0.log")))
    return tasks


class LocalCluster:
    """Start, watch and stop a cluster of `disttrain-train` processes.

    The constructor takes the cluster's shape and what its tasks run; how
    they run (ports, environment, restarts, events) is a `LocalSettings`,
    given as `settings=` or as its fields' keywords (`max_restarts=1`, which
    override those of `settings`).
    """

    def __init__(
        self,
        gin_files: Sequence[str],
        logdir: str,
        num_ps: int = 1,
        num_workers: int = 2,
        chief: bool = False,
        evaluator: bool = False,
        gin_params: Sequence[str] = (),
        settings: LocalSettings | None = None,
        **options,
    ):
        self.settings = dataclasses.replace(settings or LocalSettings(), **options)
        host = self.settings.host
        self.gin_files, self.gin_params, self.logdir = list(gin_files), list(gin_params), logdir
        self.env = dict(os.environ if self.settings.env is None else self.settings.env)
        self._popen = self.settings.popen or self._local_popen
        self.gpus = gpu_count()
        address = self.settings.addresses or (lambda job, i: f"{host}:{free_port(host)}")
        self.tasks = _tasks(logdir, num_ps, num_workers, chief, evaluator, address)
        self.failed: list[Task] = []  # tasks that had failed when wait() stopped the cluster
        self._due: dict[str, tuple[Task, float]] = {}  # tasks waiting to be restarted
        self.restarts: dict[str, int] = {}
        self.events: list[str] = []
        self.cluster = {}
        for t in self.tasks:
            if t.address:
                self.cluster.setdefault(t.job, []).append(t.address)

    def tf_config(self, task: Task) -> str:
        return json.dumps({"cluster": self.cluster, "task": {"type": task.job, "index": task.index}})

    def argv(self, task: Task) -> list[str]:
        argv = [*TRAIN_COMMAND, f"--logdir={self.logdir}"]
        argv += [f"--gin_file={f}" for f in self.gin_files]
        argv += [f"--gin_param={p}" for p in self.gin_params]
        return argv

    @staticmethod
    def _local_popen(task: Task, argv, env, log_file) -> subprocess.Popen:
        return subprocess.Popen(argv, env=env, **task_process_options(log_file))

    def start(self) -> LocalCluster:
        os.makedirs(os.path.join(self.logdir, "logs"), exist_ok=True)
        for task in self.tasks:
            self._start_task(task, mode="w")
        return self

    def _start_task(self, task: Task, mode: str) -> None:
        env = task_env(dict(self.env, TF_CONFIG=self.tf_config(task), PYTHONUNBUFFERED="1"))
        devices = visible_devices(task.job, task.index, self.gpus, self.settings.gpus_per_worker)
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices
        with open(task.log_path, mode) as log_file:
            task.proc = self._popen(task, self.argv(task), env, log_file)
        task.started = time.monotonic()

    def _event(self, message: str) -> None:
        self.events.append(message)
        if self.settings.on_event:
            self.settings.on_event(message)

    def _restart_or_fail(self, task: Task) -> bool:
        """Restart a task that died of a signal or a transient code, as an orchestrator would.

        Returns False when the task must be treated as failed: a permanent
        exit code (1-127: configuration), or no restarts left.
        """
        code = task.proc.returncode
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        transient = code < 0 or code >= 128
        used = self.restarts.get(task.name, 0)
        if not transient or used >= self.settings.max_restarts:
            self._event(f"{task.name} died ({how}); stopping the cluster; log: {task.log_path}")
            return False
        self.restarts[task.name] = used + 1
        self._event(f"{task.name} died ({how}); restarting it ({used + 1}/{self.settings.max_restarts})")
        self._due[task.name] = (task, time.monotonic() + self.settings.restart_delay_secs)
        return True

    def wait(
        self,
        timeout: float | None = None,
        on_tick: Callable[[], None] | None = None,
        outlive_secs: float = 60.0,
    ) -> dict[str, int]:
        """Wait for every task to exit; stop the rest at the first failure or on timeout.

        A task still running `outlive_secs` after another exited 0 (training is
        over: it should be ending too) is reported once as an event, with the
        last line of its log, where it waits; it is left running (a PS lingers
        `ps_linger_secs` for late replicas). Only `timeout` stops it.
        Returns each task's exit code (negative: killed by that signal).
        Raises TimeoutError (after stopping everything) if `timeout` passes.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with interrupt_between_ticks() as interrupted:  # stopping the tasks is not interrupted either
            try:
                self._wait_loop(deadline, timeout, on_tick, outlive_secs, interrupted)
            finally:
                self.failed = [t for t in self.tasks if t.proc.poll() not in (None, 0)]
                self.stop()
        if on_tick:
            on_tick()
        return {t.name: t.proc.returncode for t in self.tasks}

    def _wait_loop(self, deadline, timeout, on_tick, outlive_secs, interrupted: Callable[[], bool]) -> None:
        ended: tuple[Task, float] | None = None  # the first task to exit 0, and when it was seen
        reported: set[str] = set()
        while not interrupted():
            for name, (task, when) in list(self._due.items()):
                if time.monotonic() >= when:
                    del self._due[name]
                    self._start_task(task, mode="a")
            failed = [t for t in self.tasks if t.name not in self._due and t.proc.poll() not in (None, 0)]
            if any(not self._restart_or_fail(t) for t in failed):
                return
            if all(t.proc.poll() == 0 for t in self.tasks):
                return
            if ended is None:
                first = next((t for t in self.tasks if t.proc.poll() == 0), None)
                ended = (first, time.monotonic()) if first else None
            if ended is not None:
                self._report_outliving(*ended, outlive_secs, reported)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"cluster still running after {timeout:.0f} s; logs in {self.logdir}/logs")
            if on_tick:
                on_tick()
            time.sleep(0.2)
        raise KeyboardInterrupt

    def _report_outliving(self, first: Task, when: float, outlive_secs: float, reported: set[str]) -> None:
        now = time.monotonic()
        for task in self.tasks:
            if task.name in reported or task.name in self._due or task.proc.poll() is not None:
                continue
            running = now - max(when, task.started)
            if running > outlive_secs:
                reported.add(task.name)
                self._event(
                    f"{task.name} is still running {running:.0f} s after {first.name} exited 0; "
                    f"its last log line: {self.last_log_line(task)!r} (log: {task.log_path})"
                )

    def last_log_line(self, task: Task) -> str:
        """The task's last log line that is not TF's C++ logging: where it is, or waits."""
        for line in reversed(self.log_tail(task, 200).splitlines()):
            if line.strip() and not _TF_CPP_LOG.match(line):
                return line.strip()
        return ""

    def stop(self, grace_secs: float = 5.0) -> None:
        """SIGTERM every live task, then SIGKILL what is left after `grace_secs`."""
        stop_processes([t.proc for t in self.tasks if t.proc is not None], grace_secs)

    @property
    def chief_task(self) -> Task:
        return next(t for t in self.tasks if t.job == CHIEF or (t.job == WORKER and t.index == 0))

    def log_tail(self, task: Task, lines: int = 5) -> str:
        try:
            with open(task.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


@contextlib.contextmanager
def interrupt_between_ticks():
    """Ctrl-C as a flag the wait loop reads, instead of KeyboardInterrupt wherever it lands.

    Python raises KeyboardInterrupt between any two bytecodes; landing inside
    `Popen.poll()` just after it takes the Popen's internal lock leaves that
    lock held, and the `wait()` that stopping the task needs then blocks for
    ever (a launcher hung on Ctrl-C that way). Yields `interrupted()`; only
    the main thread can take over SIGINT, elsewhere nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    flag = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: flag.set())
    try:
        yield flag.is_set
    finally:
        signal.signal(signal.SIGINT, previous)


class LogFollower:
    """Yields the lines appended to a log file since the last call."""

    def __init__(self, path: str):
        self.path, self._offset, self._partial = path, 0, ""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self._offset)
                text = f.read()
                self._offset = f.tell()
        except OSError:
            return []
        text = self._partial + text
        lines = text.split("\n")
        self._partial = lines.pop()
        return lines
