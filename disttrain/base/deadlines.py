"""Every deadline of a task in one place: how long each wait may last, and why.

`Deadlines.of(settings)` derives the bounds that follow from the run's
settings (most from `peer_wait_secs`, the one knob for how patient a task is
with its peers); the upper-case names are the fixed bounds no setting
changes. No module of the runtime or the strategies derives a timeout from
the settings or writes one as a number: each reads its bound here
(tests/unit/test_deadlines.py checks that no module but this one and
config.py reads `peer_wait_secs`, beside the analysis tools, which pass it
on to the runs they start). docs/design.md's "Deadlines" lists them.

Not here, because they bound nothing: poll periods and logging cadences (how
often a loop looks; `wait_log_secs`). Where a threshold grows with measured
times at run time (`trainer.StepWatch`: `STEP_FACTOR` x the longest recent
step; a worker's polling round, at most `wait_log_secs`), the code that
measures applies the rule to the values here. The local launcher's bounds
on the processes it starts (`disttrain.edges.local`, `private_network`) are its
own, and so is `quiet`'s wait for its helper (run by path, no disttrain).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from disttrain.base.config import RunSettings


@dataclasses.dataclass(frozen=True)
class Deadlines:
    """One task's deadlines, in seconds, from the three settings they come from.

    Each property is one wait: what it bounds, and why it has its value.
    """

    peer_wait_secs: float
    ps_linger_secs: float
    preempt_secs: float

    # ---- fixed bounds: no setting changes them --------------------------------------------------

    # One TCP connect to a peer (`peers.probe`, each try of `peers.wait_for_peers`, the
    # watchdog's probes): a listening peer answers in milliseconds.
    PROBE_SECS: ClassVar[float] = 1.0
    # A replica telling a PS that its training has ended: the done queue (`ps_serving.signal_done`) and,
    # async, PS 0's finished queue (`trainer._ReportFinished`). The PS is up (probed first) or
    # leaving: either way the replica's exit must not wait for it.
    TELL_PS_SECS: ClassVar[float] = 10.0
    # A waiting worker's read of which variables are not initialised yet, for its log line only.
    READY_READ_SECS: ClassVar[float] = 2.0
    # The shortest of a worker's rounds of waiting for the chief's variables (the last one, when
    # less of `chief_variables_secs` is left): SessionManager's own poll is 0.5 s.
    LEAST_ROUND_SECS: ClassVar[float] = 0.5
    # MonitoredSession's `stop_grace_period_secs`: its close waits this for the threads registered
    # with its coordinator (the sync aggregator, the overlap's transfer loop) to stop.
    STOP_THREADS_SECS: ClassVar[float] = 5.0
    # A PS leaving `ps_serving.serve_until_done`: the join of its done-queue thread, ended by the
    # queue's close (a daemon: the exit does not wait longer).
    DONE_QUEUE_CLOSE_SECS: ClassVar[float] = 5.0
    # `recovery.PreemptionHook`'s read of the PS tasks' preemption queues (every 0.25 s): a slow PS
    # makes the watch retry, not hang.
    PREEMPT_NOTICE_READ_SECS: ClassVar[float] = 5.0
    # A preempted chief, before its final checkpoint, waits at most this for the global step to stop
    # moving (the others' last steps), well inside `preempted_secs`.
    PREEMPT_SETTLE_SECS: ClassVar[float] = 3.0
    # The async overlap's drain at the end of training (`async_ps._DrainHook`): the transfer loop
    # applies the gradients still queued; after this it warns and leaves them.
    DRAIN_SECS: ClassVar[float] = 120.0
    # A worker whose drain found its PS gone after the last step (training is over) exits 0 if its
    # session's close, which may wait for that PS for ever (decision 0016), has not returned by then.
    DRAIN_CLOSE_GRACE_SECS: ClassVar[float] = 15.0
    # The sync chief's aggregator's own calls to the queues (waking it, closing or releasing the
    # token queues): best effort at a stop, so a gone PS must not hold the stop up.
    AGGREGATOR_CALL_SECS: ClassVar[float] = 5.0
    # After a stop that is not the end, the sync aggregator goes on releasing the steps left in the
    # chief's run while a replica takes a token at least this often (a slower step: the watchdog).
    RELEASE_IDLE_SECS: ClassVar[float] = 60.0
    # A step after the first of its session is judged after STEP_FACTOR x the longest of its last
    # 100 (and the hooks after a step after STEP_FACTOR x the longest they took), at least
    # `step_min_secs` (`hooks_after_step_secs`): a step ten times slower than any before is stuck.
    STEP_FACTOR: ClassVar[float] = 10.0

    @classmethod
    def of(cls, settings: RunSettings) -> Deadlines:
        """The deadlines of a run with `settings` (a RunSettings or TrainConfig, validated)."""
        return cls(settings.peer_wait_secs, settings.ps_linger_secs, settings.preempt_secs)

    # ---- peers ----------------------------------------------------------------------------------

    @property
    def peer_secs(self) -> float:
        """A peer unreachable this long is gone: `peer_wait_secs`.

        Bounds `peers.wait_for_peers` at start-up and after a lost session
        (then TransientError, exit 150), and is the watchdog's bound on a
        needed peer that stops answering during a phase; a phase that may
        hang (a step, a replica's close) with every peer reachable is taken
        for hung this long past its threshold.
        """
        return self.peer_wait_secs

    @property
    def cluster_check_secs(self) -> float:
        """Each call of `peers.check_cluster_agrees` to its anchor's spec table: `peer_wait_secs`.

        The anchor just answered `wait_for_peers`; a call waits only while
        its server is still coming up.
        """
        return self.peer_wait_secs

    @property
    def chief_variables_secs(self) -> float:
        """A worker waiting for the chief to initialise the variables: `peer_wait_secs`, then TransientError.

        `trainer._WorkerSessionCreator` waits in rounds (at most
        `wait_log_secs` each, to say whom it waits for); the watchdog judges
        a round hung this long past the round's own length.
        """
        return self.peer_wait_secs

    # ---- the watchdog's phases (`watchdog.Watchdog.enter`): judged after ... -------------------

    @property
    def creating_session_secs(self) -> float:
        """Creating the session (the chief's restore, a worker's wait): `peer_wait_secs`."""
        return self.peer_wait_secs

    @property
    def recovering_session_secs(self) -> float:
        """Re-creating a session after a lost peer: 2 x `peer_wait_secs`.

        The peers are waited for again first (`peer_secs`), then the session
        is created as at start-up.
        """
        return 2 * self.peer_wait_secs

    @property
    def first_step_secs(self) -> float:
        """The first step of a session (start-up, graph optimisation, a recovery): `peer_wait_secs`.

        It has no earlier step to be judged by; the sync PS chaos soak once
        hung there for good, unseen.
        """
        return self.peer_wait_secs

    @property
    def step_min_secs(self) -> float:
        """The least a later step is given (else STEP_FACTOR x its recent longest): min(60, `peer_wait_secs`).

        A minute keeps a slow step from being judged early; a shorter
        `peer_wait_secs` judges steps sooner as well.
        """
        return min(60.0, self.peer_wait_secs)

    @staticmethod
    def hooks_after(first_step_secs: float) -> float:
        """The rule of `hooks_after_step_secs`, from a StepWatch's first-step threshold: 5 x it."""
        return 5 * first_step_secs

    @property
    def hooks_after_step_secs(self) -> float:
        """The least the hooks after a step are given (checkpoints, summaries): 5 x `peer_wait_secs`.

        A chief's save of a large model may take minutes with every peer
        well (10 min at the default) before it is taken for hung on a frozen
        PS; else STEP_FACTOR x the longest they took.
        """
        return self.hooks_after(self.first_step_secs)

    @property
    def closing_session_secs(self) -> float:
        """A session's close, after its loop ended or after an error: min(60, `peer_wait_secs`).

        A replica's close (hooks' ends, the overlap's drain) is quick when
        its peers are well; the chief's writes the final checkpoint and is
        not judged as hung, only by a lost peer.
        """
        return min(60.0, self.peer_wait_secs)

    @property
    def serving_secs(self) -> float:
        """A PS serving, while its replicas start: `peer_wait_secs`.

        Then it ends once no replica has been reachable for `peer_secs`:
        nobody would ever report to it.
        """
        return self.peer_wait_secs

    # ---- the end of training ---------------------------------------------------------------------

    @property
    def replicas_idle_secs(self) -> float:
        """An async chief waiting for the other replicas to finish: until the global step stays this long.

        `peer_wait_secs`: a replica that died and was not restarted trains no
        more (`trainer._AwaitReplicas`); the final checkpoint is then written
        without it.
        """
        return self.peer_wait_secs

    @property
    def evaluator_secs(self) -> float:
        """The evaluator stops when no new checkpoint comes within this: `peer_wait_secs`."""
        return self.peer_wait_secs

    @property
    def linger_secs(self) -> float:
        """A PS waits this for the other replicas once the chief has reported done: `ps_linger_secs`.

        (0: it leaves with the chief.) The chief reports last in its life,
        so a replica that never comes back cannot keep the PS for ever.
        """
        return self.ps_linger_secs

    @property
    def preempted_secs(self) -> float:
        """A preempted task (SIGTERM) ends within this: `preempt_secs` (`preemption`'s timer, exit 150).

        Kept below the orchestrator's grace period, so the task ends with its
        own line rather than a SIGKILL.
        """
        return self.preempt_secs

    @property
    def ps_preempted_secs(self) -> float:
        """A preempted PS waits at most this for the chief's report: `preempt_secs` less 3 s, at least 1 s.

        It leaves by itself, naming the replicas that never reported, before
        `preempted_secs` would end it (`ps_serving._count_reports`).
        """
        return max(1.0, self.preempt_secs - 3.0)
