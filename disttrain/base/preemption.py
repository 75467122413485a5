"""Preemption: a notice that the training loop reads at step boundaries, with a bound on the exit.

Kubernetes and spot instances send SIGTERM, then SIGKILL after a grace
period (30 s by default). A `Notice` is requested once: by SIGTERM (once
`install`ed, in the main thread; SIGINT is left alone), by a replica's PS
(its preemption queue) or by the all-reduce group's vote. The replica's
session hooks and the PS's serve loop read it, and the first request starts
a timer that ends the process with the transient code if it has not ended
by itself within the grace.

A signal belongs to the process, so the process has one notice, `PROCESS`:
`disttrain.fit`, `disttrain.session` and the zoo's run install it, and hand
it to the runtime that reads it (the session's hooks, a PS's serve loop).
The strategies' hooks, made by the public `Strategy.hooks(last_step)`, read
`PROCESS` itself. A test makes a `Notice` of its own. Nothing here touches
TensorFlow.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from disttrain.base.errors import EXIT_TRANSIENT

log = logging.getLogger("disttrain")


class Notice:
    """One task's preemption notice: asked for once, read at step boundaries, its exit bounded."""

    def __init__(self, grace_secs: float = 20.0):
        self._requested = threading.Event()
        self._why = ""
        self._peer: str | None = None
        self.grace_secs = grace_secs

    def install(self, grace_secs: float) -> Notice:
        """Take SIGTERM as this notice, to end within `grace_secs`; returns the notice.

        Only the main thread can take a signal over; elsewhere (a test's
        thread) the handler is left as it is. Idempotent; the latest
        `grace_secs` wins.
        """
        self.grace_secs = grace_secs
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda signum, frame: self.request("SIGTERM"))
        return self

    def request(self, why: str, peer: str | None = None) -> None:
        """Ask this task to end for a preemption: at the next step boundary, within the grace.

        `peer`: the PS task that asked (it got SIGTERM); this replica tells it
        when it is done, as at the end of training. The first request wins.
        """
        if self._requested.is_set():
            return
        self._why, self._peer = why, peer
        self._requested.set()
        grace = self.grace_secs
        log.warning(f"preempted ({why}): ending at the next step boundary, within {grace:.0f} s")
        threading.Thread(
            target=self._exit_after, args=(grace,), name="disttrain-preempt-bound", daemon=True
        ).start()

    def _exit_after(self, secs: float) -> None:
        time.sleep(secs)
        print(
            f"disttrain: error: preempted ({self._why}) and still running after {secs:.0f} s "
            "(RunSettings.preempt_secs): exiting now",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_TRANSIENT)

    def requested(self) -> bool:
        return self._requested.is_set()

    @property
    def peer(self) -> str | None:
        """The PS task whose preemption this is, None for this task's own SIGTERM (or none)."""
        return self._peer if self._requested.is_set() else None

    @property
    def reason(self) -> str:
        return self._why


# The process's notice: SIGTERM is the process's.
PROCESS = Notice()


def given(notice: Notice | None) -> Notice:
    """The notice a caller handed in, else the process's (`PROCESS`)."""
    return PROCESS if notice is None else notice
