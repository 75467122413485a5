"""Preemption: SIGTERM as a flag that the training loop reads at step boundaries, with a bound.

Kubernetes and spot instances send SIGTERM, then SIGKILL after a grace
period (30 s by default). `install` takes SIGTERM over in the main thread
(SIGINT is left alone); `request` (the handler, or a replica told by its PS)
sets a flag that the replica's session hook and the PS's serve loop read,
and starts a timer that ends the process with the transient code if it has
not ended by itself within the bound. Nothing here touches TensorFlow.
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

_requested = threading.Event()
_state = {"why": "", "peer": None, "grace_secs": 20.0}


def install(grace_secs: float) -> None:
    """Handle SIGTERM in this process as a preemption to end within `grace_secs`.

    Only the main thread can take a signal over; elsewhere (a test's thread)
    nothing changes. Idempotent; the latest `grace_secs` wins.
    """
    _state["grace_secs"] = grace_secs
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: request("SIGTERM"))


def request(why: str, peer: str | None = None) -> None:
    """Ask this task to end for a preemption: at the next step boundary, within the grace.

    `peer`: the PS task that asked (it got SIGTERM); this replica tells it
    when it is done, as at the end of training. The first request wins.
    """
    if _requested.is_set():
        return
    _state.update(why=why, peer=peer)
    _requested.set()
    grace = _state["grace_secs"]
    log.warning(f"preempted ({why}): ending at the next step boundary, within {grace:.0f} s")
    threading.Thread(target=_exit_after, args=(grace,), name="disttrain-preempt-bound", daemon=True).start()


def _exit_after(secs: float) -> None:
    time.sleep(secs)
    print(
        f"disttrain: error: preempted ({_state['why']}) and still running after {secs:.0f} s "
        "(RunSettings.preempt_secs): exiting now",
        file=sys.stderr,
        flush=True,
    )
    os._exit(EXIT_TRANSIENT)


def requested() -> bool:
    return _requested.is_set()


def peer() -> str | None:
    """The PS task whose preemption this is, None for this task's own SIGTERM (or none)."""
    return _state["peer"] if _requested.is_set() else None


def reason() -> str:
    return _state["why"]
