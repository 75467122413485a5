"""Who a task lost, read from TensorFlow's error texts: pure text, no TensorFlow.

TF's gRPC errors name the task each failed call went to; `lost_peers` joins
them with a probe of who answers now (`disttrain.runtime.peers.probe_lost`),
and `first_error_line` is the one line of TF's error a log or an exit shows.
The strategies use it too, so it sits in the base layer.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

# TF's gRPC errors name the task each failed call went to: "Additional GRPC error information from
# remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/RecvTensor:", then
# that task's answer on the next line (after an escaped "\n" when nested in another task's answer).
# A task whose answer names another remote target only passed that task's failure on.
_REMOTE_TARGET = re.compile(
    r"remote target (/job:\w+/replica:\d+/task:\d+) while calling [\w./]*:(?:\n|\\n)(.*)"
)
_FROM_LINE = re.compile(r"^(?:([A-Z_]+): )?From /job:\S+:$")
_STATUS_LINE = re.compile(r"^([A-Z_]+): (.+)$")
_FRAMING = ("Graph execution error:", "Detected at node ", "File ", "Node: ")


def _short(task: str) -> str:
    return re.sub(r"/replica:\d+", "", task)


def _task_order(task: str) -> tuple[str, int]:
    job, _, index = task.rpartition("/task:")
    return (job, int(index)) if index.isdigit() else (task, -1)


def _error_part(text: str) -> str:
    """The error in a MonitoredSession log record ("... may be due to a preemption ... Error: <error>")."""
    return text.split("Error:", 1)[1] if "may be due to a preemption" in text else text


def failed_in_tf_text(texts: Iterable[str]) -> list[str]:
    """Tasks TF's error texts show failing to answer, not those that only passed a failure on.

    If every named task only relayed (TF's format changed?), every named task.
    """
    direct, named = set(), set()
    for text in texts:
        for m in _REMOTE_TARGET.finditer(_error_part(text)):
            task, answer = _short(m.group(1)), m.group(2)
            named.add(task)
            if "remote target" not in answer:
                direct.add(task)
    return sorted(direct or named, key=_task_order)


# What TF raises when an op is built in a graph its session has finalized (ops.Graph._check_not_finalized).
_FINALIZED = "Graph is finalized and cannot be modified."


def built_after_start(error: BaseException) -> bool:
    """True for TF's error when an op is built once training has started (the graph is finalized)."""
    return isinstance(error, RuntimeError) and str(error).strip() == _FINALIZED


_PEER_FAILED = re.compile(r"^(ABORTED|UNAVAILABLE): From /job:", re.M)


def failed_with_a_peer(text: str) -> bool:
    """Whether the text of a TF InternalError, CancelledError or FailedPreconditionError is a lost peer.

    TF raises a step whose parts failed together as one of their errors. A
    peer that tore down its side of a collective (aborted itself, or
    restarted) answers with InternalError ("Collective ops is aborted by:
    Delete called on non-empty BufRendezvous ... from remote target ...");
    a part of this task cancelled beside a peer's ABORTED or UNAVAILABLE
    comes up as CancelledError. A replica restarted while the group's leader
    still holds the group of its previous life is refused with
    FailedPreconditionError ("Collective ops is aborted by: Device ...
    current incarnation doesn't match ... from remote target ..."). All are a
    lost or restarted peer, transient like the Unavailable and Aborted errors
    themselves. A mismatch between the members of a collective (shapes,
    group sizes) is the run's own fault and stays an error.
    """
    if "mismatch" in text:
        return False
    collective = "Collective ops is aborted by" in text and "from remote target" in text
    return collective or bool(_PEER_FAILED.search(text))


def first_error_line(texts: Iterable[str]) -> str:
    """TF's first error line, e.g. "UNAVAILABLE: recvmsg:Connection reset by peer".

    Skips TF's framing ("Graph execution error:", "=====", where the failed op was built)
    and its "From <task>:" lines, which name the task that reported the error (often this
    task), not the one that failed.
    """
    for text in texts:
        status = ""
        for line in _error_part(text).splitlines():
            line = line.strip()
            if not line or set(line) == {"="} or line.startswith(_FRAMING):
                continue
            framing = _FROM_LINE.match(line)
            if framing:
                status = framing.group(1) or status
                continue
            if status and not _STATUS_LINE.match(line):
                line = f"{status}: {line}"
            return line[:200]
    return ""


@dataclasses.dataclass(frozen=True)
class LostPeers:
    """Who this task lost, as far as a probe and TF's error texts tell."""

    gone: tuple[str, ...] = ()  # unreachable when probed
    restarted: tuple[str, ...] = ()  # TF's errors name them, but they answer again
    unprobed: tuple[str, ...] = ()  # TF's errors name them; not probed
    error: str = ""  # TF's first error line

    def __str__(self) -> str:
        def tasks(names, one, many):
            return f"{', '.join(names)} {one if len(names) == 1 else many}"

        parts = []
        if self.gone:
            parts.append(tasks(self.gone, "is gone", "are gone"))
        if self.restarted:
            parts.append(tasks(self.restarted, "restarted", "restarted"))
        if self.unprobed:
            parts.append(tasks(self.unprobed, "is gone or restarted", "are gone or restarted"))
        if not parts:
            return f"a peer is gone or restarted (TF: {self.error or 'no error text'})"
        return " and ".join(parts)


def lost_peers(me: str | None, tf_texts: Iterable[str], reachable: Mapping[str, bool]) -> LostPeers:
    """Name the peers this task lost: never itself; the probe decides, TF's texts add detail.

    `tf_texts`: what TF raised or logged about the failure; `reachable`: a probe
    of peers (task name -> accepts connections now). Probed peers that do not
    answer are gone, whatever TF said. Tasks TF's texts show failing that answer
    again were restarted (a restarted task keeps its address). TF's text often
    names this task too (it relayed a peer's failure): it is never reported.
    """
    tf_texts = list(tf_texts)
    me = _short(me) if me else None
    reachable = {_short(task): up for task, up in reachable.items()}
    gone = [task for task, up in reachable.items() if not up and task != me]
    named = [task for task in failed_in_tf_text(tf_texts) if task != me and task not in gone]
    return LostPeers(
        gone=tuple(sorted(gone, key=_task_order)),
        restarted=tuple(task for task in named if task in reachable),
        unprobed=tuple(task for task in named if task not in reachable),
        error=first_error_line(tf_texts),
    )
