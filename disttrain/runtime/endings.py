"""Every way a task ends: who decides it, how its peers learn it, and its exit code, in one table.

docs/design.md's table "How a task ends" is generated from ENDINGS
(`disttrain-tables`, table `endings`), and tests/unit/test_endings.py checks
it against the code: every code name a row gives (`trainer._StopAtStep`,
`ps_serving.signal_done`, ...) exists, and every exit code it names is one
of `disttrain.base.errors`' codes (or Ctrl-C's 130). A new way to end a task
is a row here, with the code that makes it true named in the row.

The codes: 1-127 are permanent, 128-255 retryable (TFJob's `ExitCode`
policy; `disttrain-launch-local --max_restarts` restarts the same).
"""

from __future__ import annotations

import dataclasses

from disttrain.base import errors


@dataclasses.dataclass(frozen=True)
class Ending:
    """One way a task ends, as docs/design.md's table shows it (markdown, code names in backticks)."""

    what: str  # what ends it
    decides: str  # who decides, in which code
    peers_learn: str  # how the peers learn it
    exit: str  # the exit code(s)


ENDINGS: tuple[Ending, ...] = (
    Ending(
        what="a replica's global step reaches `steps`",
        decides="the replica: `trainer._StopAtStep.after_run`",
        peers_learn=(
            "it posts its index to every PS's done queue (`ps_serving.signal_done`, from `launch.session`); "
            "under async PS a worker also posts to the finished queue (`trainer._ReportFinished`); under "
            "sync PS the chief's aggregator closes the token queues at the end (`_Aggregator.end`), so a "
            "replica still waiting stops"
        ),
        exit="0",
    ),
    Ending(
        what="the async chief's own training ends first",
        decides=(
            "the chief: `trainer._AwaitReplicas` waits for N-1 posts to the finished queue, or until the "
            "global step has not moved for `peer_wait_secs`, saving checkpoints meanwhile; then the final "
            "checkpoint"
        ),
        peers_learn="as above",
        exit="0",
    ),
    Ending(
        what="a replica's input has ended (Join)",
        decides=(
            "async PS: the replica (`trainer._InputEnded`, all its pipelines); all-reduce: the group, whose "
            "count of towers with data rides in the all-reduce (`SyncAllReduce.summed`); sync PS and hybrid:"
            " the aggregator, once every replica's input has ended (`_Aggregator._ended_input`)"
        ),
        peers_learn="the all-reduce's count; the closed token queues; the done queues",
        exit="0",
    ),
    Ending(
        what="a task started after training ended (latest checkpoint at `steps`)",
        decides=(
            "the task: `launch._over_at`; a replica gets `launch._Over` (it stops before any step), a PS "
            "returns from `launch.serve`; `_StopAtStep.after_create_session` for a session already at the "
            "end"
        ),
        peers_learn="a replica tells the PS tasks still up (`launch._training_over`)",
        exit="0",
    ),
    Ending(
        what="a PS: every replica is done",
        decides=(
            "the PS: `ps_serving.serve_until_done` returns once all N replicas posted, or `ps_linger_secs` "
            "after the chief (replica 0) did"
        ),
        peers_learn="nobody waits for it",
        exit="0",
    ),
    Ending(
        what="the evaluator: the last checkpoint is measured",
        decides=(
            "`evaluation.evaluate_checkpoints`: the checkpoint at `steps`, or the newest once the chief's "
            "result.json says it finished, or none new within `peer_wait_secs`"
        ),
        peers_learn="nobody waits for it",
        exit="0",
    ),
    Ending(
        what="SIGTERM to a replica (PS strategies)",
        decides=(
            "the replica: `Notice.request` sets the notice; `recovery.PreemptionHook` stops it at the next"
            " step boundary; the chief's `end` waits for the global step to settle, then checkpoints; "
            "`launch.session` raises `PreemptedError`"
        ),
        peers_learn=(
            "not told: it posts neither done nor finished; a preempted sync chief's aggregator releases the "
            "waiting replicas and leaves the queues open for its restart"
        ),
        exit="150",
    ),
    Ending(
        what="SIGTERM to a PS",
        decides=(
            "the PS: `ps_serving._count_reports` posts to its preemption queue, then leaves once the chief "
            "has posted done, or after `preempt_secs` less 3 s"
        ),
        peers_learn=(
            "every replica's `PreemptionHook` polls the queue's size (every 0.25 s) and stops at a step "
            "boundary; the chief checkpoints; each tells only that PS it is done"
        ),
        exit="150 (all)",
    ),
    Ending(
        what="SIGTERM to a replica under all-reduce or hybrid",
        decides=(
            "the group: `allreduce._PreemptionVote` feeds the flag into a run's first step; the vote rides "
            "in the first gradient bucket (or an all-reduce of its own)"
        ),
        peers_learn="every replica sees the vote after that same step and stops; the chief checkpoints it",
        exit="150 (all)",
    ),
    Ending(
        what="preempted and still running after `preempt_secs`",
        decides="the task: `Notice._exit_after`",
        peers_learn="TF's errors or the peers' watchdogs",
        exit="150",
    ),
    Ending(
        what=(
            "a configuration error: flags, TF_CONFIG, gin, a port in use, a checkpoint of another model, a "
            "refused setting"
        ),
        decides=(
            "the task at start: `cluster.py`, `cli.train_config`, `peers.check_port_free`, "
            "`trainer.check_restorable`, `RunSettings.validate`; a PS refuses what its replicas refuse "
            "(`launch.refuse_what_replicas_refuse`)"
        ),
        peers_learn="each task refuses the same input itself",
        exit="2",
    ),
    Ending(
        what="tasks started with different cluster specs",
        decides="the task: `peers.check_cluster_agrees` against the first spec registered",
        peers_learn="each compares with the same table",
        exit="2",
    ),
    Ending(
        what="a NaN or Inf in a gradient or the loss",
        decides=(
            "the replica: `check_numerics` on every gradient in the step (`Strategy._guarded`), which"
            " fails the step before the bad update and which `trainer._ending_errors` reads; or the loss "
            "`metrics.ThroughputHook` logs: `DivergedError`"
        ),
        peers_learn="not told: under all-reduce the others lose it in a collective (150)",
        exit="3",
    ),
    Ending(
        what="the global step has not moved in `stall_steps` of a replica's steps",
        decides="the replica: `trainer._StallGuard`: `StalledError`",
        peers_learn="not told",
        exit="4",
    ),
    Ending(
        what="a peer unreachable at start-up",
        decides=(
            "the task: `peers.wait_for_peers`, or a worker's `trainer._WorkerSessionCreator` waiting for the"
            " chief's variables, after `peer_wait_secs`: `TransientError`"
        ),
        peers_learn="-",
        exit="150",
    ),
    Ending(
        what="TF reports a lost peer (Unavailable, Aborted, a collective aborted by a peer)",
        decides=(
            "PS strategies: `trainer._Reconnecting` recovers the session once the peers answer again "
            "(`launch._connect`'s `on_reconnect`), else `TransientError`; all-reduce and hybrid do not "
            "recover in-process; `launch.errors_to_exit` names the peers (`peers.probe_lost`)"
        ),
        peers_learn="the peers see the same from their side",
        exit="150",
    ),
    Ending(
        what="a PS left after the last step (an async drain, a replica's close)",
        decides=(
            "the replica: `trainer._ending_errors` (quiet), `async_ps._DrainHook` (a worker whose close does"
            " not return within 15 s exits 0)"
        ),
        peers_learn="-",
        exit="0",
    ),
    Ending(
        what=(
            "a wait past its threshold: a needed peer unreachable for `peer_wait_secs`, or a call that never"
            " returns with every peer reachable"
        ),
        decides=(
            "the task's `watchdog.Watchdog`, told the phase by `trainer.StepWatch` (a PS's: no replica "
            "reachable)"
        ),
        peers_learn="the peers' own watchdogs",
        exit=(
            "150; 0 when the latest checkpoint (or the chief's result.json) is at `steps`, or for a "
            "replica's close after a normal end"
        ),
    ),
    Ending(
        what="Ctrl-C",
        decides="`launch.errors_to_exit`, `cli._run_local`",
        peers_learn="`launch_local` stops every task",
        exit="130",
    ),
    Ending(
        what="a task of a local cluster fails",
        decides=(
            "`local.LocalCluster`: the first failure stops the rest (SIGTERM, then SIGKILL); "
            "`--max_restarts` restarts 128-255 and deaths by a signal"
        ),
        peers_learn="SIGTERM",
        exit="the failed task's code",
    ),
)

# The exit codes a row may name: the errors' own, and Ctrl-C's.
EXIT_CODES = {
    errors.EXIT_OK: "training ended",
    errors.DisttrainError.exit_code: "any other error",
    errors.EXIT_CONFIG: "configuration",
    errors.EXIT_DIVERGED: "diverged",
    errors.EXIT_STALLED: "stalled",
    errors.EXIT_TRANSIENT: "transient: retry",
    130: "interrupted (Ctrl-C)",
}


def table() -> str:
    """docs/design.md's table of endings, in markdown."""
    lines = ["| what ends it | who decides | how the peers learn it | exit |", "| --- | --- | --- | --- |"]
    lines += [f"| {e.what} | {e.decides} | {e.peers_learn} | {e.exit} |" for e in ENDINGS]
    return "\n".join(lines)
