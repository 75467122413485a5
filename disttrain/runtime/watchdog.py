"""Every wait of a task ends within a bound: a thread beside the loop that ends a task that cannot go on.

A task's main thread waits inside TensorFlow, in a `session.run`, a
session's creation or its close, for whatever its graph reads from peers.
TF raises an error when it finds a peer gone, but not always: a call to a
peer that died or restarted mid-call can wait for ever (decisions 0015 and
0016: the sync PS chaos hang, the overlap drain to a PS that left), and
nothing in TF bounds it. The watchdog knows what the loop is waiting in (a
phase, since when) and, once that has run past its threshold, probes the
peers this task needs every `say_every_secs`, says whom it waits for, and
ends the task with one line and the documented exit code:

- a needed peer unreachable for `peer_wait_secs` (a PS: every replica):
  "lost contact: ... is gone", exit 150, or 0 when training is over (the
  chief's last checkpoint, or without checkpoints its result.json, is at
  the last step: the peer finished);
- a phase that may hang (a step, a session's close) that outlasts its
  threshold by `peer_wait_secs` with every peer reachable: TF's runtime
  did not return, exit 150 (a close after training ended normally: 0).

The process ends with `os._exit`: the main thread is stuck in TensorFlow's
C++ and nothing else would end it. Peers are probed by TCP connect only
while a phase is past its threshold, so a healthy run costs nothing.
Each phase's threshold and the peer wait come from `disttrain.base.deadlines.Deadlines`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from disttrain.base.errors import EXIT_TRANSIENT
from disttrain.runtime import peers

log = logging.getLogger("disttrain")


@dataclasses.dataclass
class _Phase:
    what: str  # "step 12", "closing the session", ...
    since: float  # time.monotonic() when it started
    threshold_secs: float  # how long it may run before the watchdog looks at the peers
    may_hang: bool  # past threshold + peer_wait_secs with every peer reachable, it is hung
    hung_code: int  # the exit code if it is hung


class Watchdog:
    """Ends this task when its current phase waits on a peer that is gone, or hangs.

    `peers`: (task name, address) of the tasks this task cannot go on
    without; `all_needed`: False for a PS, which goes on while any replica
    is there. `training_over()`: whether the run has finished (its exit is
    then 0).
    """

    def __init__(
        self,
        task: str,
        peers: list[tuple[str, str]],
        peer_wait_secs: float,
        say_every_secs: float,
        training_over: Callable[[], bool] = lambda: False,
        all_needed: bool = True,
    ):
        self._task, self._peers, self._wait = task, list(peers), peer_wait_secs
        self._every, self._over, self._all_needed = say_every_secs, training_over, all_needed
        self._phase: _Phase | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._down_since: dict[str, float] = {}  # peer -> when it was first found unreachable
        self.exit = _exit_now  # replaced in tests that must not end their own process

    def start(self) -> Watchdog:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="disttrain-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def enter(
        self, what: str, threshold_secs: float, may_hang: bool = False, hung_code: int = EXIT_TRANSIENT
    ):
        """The loop now waits in `what`; judged once it has run `threshold_secs`."""
        with self._lock:
            self._phase = _Phase(what, time.monotonic(), threshold_secs, may_hang, hung_code)
            self._down_since.clear()

    @contextlib.contextmanager
    def bounded(self, what: str, threshold_secs: float):
        """A call that returns within `threshold_secs` unless it hung; then the phase before it is back."""
        with self._lock:
            before = self._phase
        self.enter(what, threshold_secs, may_hang=True)
        try:
            yield
        finally:
            with self._lock:
                self._phase = before
                self._down_since.clear()

    def leave(self) -> None:
        """The loop is not waiting on anything the watchdog judges."""
        with self._lock:
            self._phase = None

    def _watch(self) -> None:
        said = 0.0
        while not self._stop.wait(min(1.0, self._every)):
            with self._lock:
                phase = self._phase
            if phase is None:
                continue
            now = time.monotonic()
            ran = now - phase.since
            if ran < phase.threshold_secs:
                continue
            down = self._probe(now)
            if not self._all_needed and len(down) < len(self._peers):
                down = []  # a PS goes on while any replica is there
            if down:
                longest = min(self._down_since[name] for name in down)
                if now - longest >= self._wait:
                    gone = ", ".join(down)
                    self._end(
                        f"lost contact: {gone} {'is' if len(down) == 1 else 'are'} gone "
                        f"({phase.what} waited {ran:.0f} s; unreachable for {now - longest:.0f} s, "
                        f"peer_wait_secs={self._wait:.0f})",
                        EXIT_TRANSIENT,
                    )
                    return
            elif phase.may_hang and ran >= phase.threshold_secs + self._wait:
                self._end(
                    f"{phase.what} has waited {ran:.0f} s with every peer reachable: TensorFlow's runtime "
                    f"did not return (a call to a peer that restarted mid-call?); ending this task",
                    phase.hung_code,
                )
                return
            if (down or phase.may_hang) and now - said >= self._every:
                said = now
                whom = f"{', '.join(down)} unreachable" if down else "every peer reachable"
                log.warning(f"{self._task}: {phase.what} has run for {ran:.0f} s; {whom}")

    def _probe(self, now: float) -> list[str]:
        """The needed peers unreachable now (noting since when each has been)."""
        up = peers.probe(self._peers)
        for name, ok in up.items():
            if ok:
                self._down_since.pop(name, None)
            else:
                self._down_since.setdefault(name, now)
        return [name for name, _ in self._peers if not up.get(name, True)]

    def _end(self, message: str, code: int) -> None:
        if code != 0 and self._over():
            code = 0
            message += "; training is over (the last checkpoint, or the chief's result, is at the last step)"
        if code == 0:
            log.info(f"{self._task}: {message}: exiting")
        else:
            print(f"disttrain: error: {message}", file=sys.stderr, flush=True)
        self.exit(code)


def _exit_now(code: int) -> None:
    """End the process now, logs flushed: the main thread may be stuck in TensorFlow."""
    logging.shutdown()
    os._exit(code)
