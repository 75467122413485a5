"""Why is this run slow? Read a run's log directory, name what binds its step with the evidence, and
rank the changes that would remove it by the gain each should bring.

It reads what every run writes: the chief's `run.json` (the cluster's shape,
the strategy and its knobs, the bytes of variables on each PS task) and each
replica's `result.json` (its throughput and where its step went:
`disttrain.runtime.breakdown`, which also names what binds the step, as
the chief's verdict does at the end of a run). A run of TF's default layout
(the benchmark's `tf_default` system) writes the same, so it is read the
same way, and what disttrain's layout would change shows among the changes.

A change of the transfers (16 bits, overlap, placement, disttrain's
layout) gets its gain from the planner's cost model of the slowest
replica's step, fed with that step's own figures (`_ModelOfStep`); the
other changes' gains are first order, from the run's own seconds: a change
removes or shrinks one part of the measured step and leaves the others as
they were (`Finding.gain`: the step before over the step after). They say
which change to try first, not the speed it will reach; a run after the
change measures that. When the replica waited for the machine's cores
(every task of a cluster on one machine, as the benchmark's emulated hosts
are), that comes first: a change of layout then moves the same work onto
the same cores, so no gain is predicted above what the idle cores allow
(cores / busy cores), and one below `NOTHING` is not named.
"""

from __future__ import annotations

import dataclasses
import json
import os

from disttrain.launch import read_results
from disttrain.plan import cost
from disttrain.runtime import breakdown
from disttrain.runtime.breakdown import Breakdown


class RunError(ValueError):
    """The directory holds no run that can be read (its message says what is missing)."""


# A change expected to gain less than this (step before / after) is not worth naming.
NOTHING = 1.05


@dataclasses.dataclass(frozen=True)
class Finding:
    """A cause, its evidence, the change that removes it, and the gain expected (before / after).

    gain None: not predicted from this run (cores of their own: one machine cannot measure what
    hosts of their own would do).
    """

    cause: str
    change: str
    gain: float | None

    def line(self) -> str:
        expected = "" if self.gain is None else f" (expected {100 * (self.gain - 1):.0f}% faster)"
        return f"{self.cause}: {self.change}{expected}"


@dataclasses.dataclass(frozen=True)
class Run:
    """What `read_run` found: run.json's fields, and each replica's result with a breakdown."""

    logdir: str
    run: dict
    results: dict[str, dict]

    @property
    def strategy(self) -> dict:
        return self.run.get("strategy", {})

    def replicas(self) -> dict[str, dict]:
        """Each replica's breakdown (seconds per step by part, ...), for those that traced a step."""
        return {name: r["breakdown"] for name, r in self.results.items() if r.get("breakdown")}


def read_run(logdir: str) -> Run:
    """The run in `logdir`; RunError naming what is missing."""
    path = os.path.join(logdir, "run.json")
    if not os.path.isdir(logdir):
        raise RunError(f"{logdir}: no such directory")
    if not os.path.exists(path):
        raise RunError(
            f"{logdir}: no run.json (a run's log directory has one, written by its chief at start)"
        )
    with open(path) as f:
        run = json.load(f)
    results = read_results(logdir)
    if not results:
        raise RunError(f"{logdir}: no replica's result.json under tasks/ (a replica writes one when it ends)")
    if not any(r.get("local_steps") for r in results.values()):
        raise RunError(f"{logdir}: its last run trained nothing (every replica's local steps: 0)")
    return Run(logdir, run, results)


def _gain(step: float, saved: float) -> float:
    return step / max(step - saved, 1e-9) if saved > 0 else 1.0


def _slowest(run: Run) -> tuple[str, dict]:
    """The replica whose step is longest (the one a synchronous step waits for; async: the least)."""
    replicas = run.replicas()
    name = max(replicas, key=lambda n: replicas[n]["step_secs"])
    return name, replicas[name]


def findings(run: Run) -> list[Finding]:
    """Every cause found in the run, each with its change, best expected gain first.

    The causes are the runtime's (`breakdown.causes`: what binds the slowest
    replica's step, with the evidence); this adds the changes and their gains.
    """
    if not run.replicas():
        return []
    name, where = _slowest(run)
    measured = Breakdown.of(where)
    found, cores = [], None
    for cause in breakdown.causes(measured, name, run.run.get("ps_loads") or []):
        if cause.part == breakdown.CORES:
            cores = Finding(cause.text, _own_cores(run, measured), None)
            continue
        changes = CHANGES[cause.part](run, cause, measured)
        if cause.part == "framework" and (run.run.get("steps_per_run") or 1) > 1:
            changes = []
        for change, saved in changes:
            gain = _gain(measured.step_secs, saved)
            if cores is not None:
                # The same work on the same busy cores: no more steps than the idle cores allow.
                gain = min(gain, 1 / measured.busy_share)
            if gain >= NOTHING:
                found.append(Finding(cause.text, change, gain))
    return ([cores] if cores else []) + sorted(found, key=lambda f: -f.gain)


def _own_cores(run: Run, where: Breakdown) -> str:
    if where.cores_limited:
        return (
            f"raise the CPU limit of its container or host ({where.machine_cores:g} core(s), all used): its "
            "quota throttles every part of the step"
        )
    tasks = run.run.get("cluster", {})
    count = tasks.get("ps", 0) + tasks.get("replicas", 1)
    return (
        f"give the tasks cores of their own (hosts of their own, or fewer than this run's {count} task(s) "
        "per machine): a change of layout moves the same work onto the same busy cores"
    )


def _input(run: Run, cause: breakdown.Cause, where: Breakdown) -> list[tuple[str, float]]:
    return [
        ("read in parallel and prefetch (dataset.map(..., num_parallel_calls), .prefetch())", cause.seconds)
    ]


def _transfer(run: Run, cause: breakdown.Cause, where: Breakdown) -> list[tuple[str, float]]:
    """The changes that shrink the transfers, each with the seconds the planner's model says it saves
    (first order where the run's trace gave no bytes)."""
    strategy, moving, out = run.strategy, cause.seconds, []
    model = _ModelOfStep.of(run, where)
    compute = where.seconds.get("compute", 0.0)

    def saved(first_order: float, **change) -> float:
        return first_order if model is None else model.saved(**change)

    balanced = moving * (1 - 1 / cause.ps_balance)  # first order: the busiest PS's excess gone
    if cause.ps_balance >= breakdown.UNBALANCED:
        change = (
            "balance them: disttrain's PS strategies place variables by bytes and split large ones"
            if strategy.get("baseline")
            else "balance them: plan placement from the loss (minimize(loss_fn)) or set piece_bytes"
        )
        out.append((change, saved(balanced, placement=cost.DISTTRAIN)))
    if not strategy.get("transfer_dtype") and "transfer_dtype" in strategy:
        change = f"send 16 bits: {strategy['class']}(transfer_dtype='bfloat16') halves the bytes"
        out.append((change, saved(moving / 2, transfer_bits=16)))
    if strategy.get("kind") == cost.ASYNC_PS and strategy.get("overlap") is False:
        change = "overlap the transfers with compute: AsyncParameterServer(overlap=True)"
        out.append((change, saved(min(moving, compute), overlap=True)))
    if strategy.get("baseline"):
        # Placed by bytes, then what is left moves while the next step computes.
        change = (
            "train with disttrain's AsyncParameterServer(overlap=True): it places variables by bytes "
            "and moves them while the next step computes"
        )
        first_order = balanced + min(moving - balanced, compute)
        out.append((change, saved(first_order, kind=cost.ASYNC_PS, overlap=True, placement=cost.DISTTRAIN)))
    return out


PS_KINDS = (cost.ASYNC_PS, cost.SYNC_PS)  # the strategies whose transfers the model of one step carries


@dataclasses.dataclass(frozen=True)
class _ModelOfStep:
    """The planner's cost model of the slowest replica's step, fed with what the run measured.

    Its compute seconds, the model's bytes and their layout on the PS tasks
    (run.json), and the rate its transfers saw: the bytes its traced steps
    moved over the seconds in which any transfer ran (`Breakdown.moving_secs`).
    That rate already holds the link, gRPC's CPU and the PS tasks' other
    clients as this run met them, so the model's own CPU terms are off and
    the replica is modelled alone on its link.
    """

    model: cost.Model
    shape: cost.Shape
    strategy: cost.Strategy

    CONSTANTS = cost.Constants(goodput=1.0, rpc_cpu_s_per_byte=0.0, per_message_s=0.0, ps_cores=None)

    @classmethod
    def of(cls, run: Run, where: Breakdown) -> _ModelOfStep | None:
        """None where the model has no terms to feed: no bytes traced, no PS, or not a PS strategy."""
        moved, dense = sum(where.bytes_by_ps.values()), run.run.get("model_bytes") or 0
        loads = run.run.get("ps_loads") or []
        kind = run.strategy.get("kind")
        if not moved or where.moving_secs <= 0 or not dense or not loads or kind not in PS_KINDS:
            return None
        tensors = max(run.run.get("variables") or len(loads), len(loads))
        placement = cost.ROUND_ROBIN if run.strategy.get("baseline") else cost.DISTTRAIN
        shares = tuple(x / sum(loads) for x in loads)
        measured = cost.PsLayout(
            shares,
            tuple(max(1, round(tensors * f)) for f in shares),
            max(loads) / (sum(loads) / len(loads)),
        )

        def layout(ps: int, how: str) -> cost.PsLayout:
            return measured if (ps, how) == (len(loads), placement) else cost.even_layout(tensors)(ps, how)

        compute = where.seconds.get("compute", 0.0)
        model = cost.Model("this run", dense, compute, run.run.get("batch_size") or 1, layout, tensors)
        towers = (run.run.get("cluster") or {}).get("towers") or 1
        rate_gbit = moved / where.moving_secs * 8 / 1e9  # both ways, one after the other
        shape = cost.Shape(
            hosts=1, gpus_per_host=towers, ps=len(loads), ps_hosts=cost.DEDICATED, link_gbit=rate_gbit
        )
        strategy = cost.Strategy(
            kind=kind,
            overlap=bool(run.strategy.get("overlap")),
            piece_bytes=run.strategy.get("piece_bytes"),
            transfer_bits=16 if run.strategy.get("transfer_dtype") else 32,
            placement=placement,  # no backup_workers: one replica alone has no straggler to drop
        )
        return cls(model, shape, strategy)

    def saved(self, **change) -> float:
        """Seconds a step `change` (cost.Strategy's fields) saves, by the model: before less after."""
        before = cost.predict(self.model, self.shape, self.strategy, self.CONSTANTS)
        after = cost.predict(
            self.model, self.shape, dataclasses.replace(self.strategy, **change), self.CONSTANTS
        )
        return max(0.0, before.round_time - after.round_time)


def _peers(run: Run, cause: breakdown.Cause, where: Breakdown) -> list[tuple[str, float]]:
    strategy = run.strategy
    if strategy.get("kind") == "sync_ps" and not strategy.get("backup_workers"):
        change = (
            "go on without the slowest replica at the sync barrier: SyncParameterServer(backup_workers=1)"
        )
        return [(change, cause.seconds / 2)]
    if strategy.get("kind") == "allreduce" and not strategy.get("transfer_dtype"):
        return [("send 16 bits over the ring: SyncAllReduce(transfer_dtype='bfloat16')", cause.seconds / 2)]
    return []


def _framework(run: Run, cause: breakdown.Cause, where: Breakdown) -> list[tuple[str, float]]:
    return [("make several steps per session.run: steps_per_run=10", cause.seconds * 0.9)]


# Per part of the step that binds (breakdown.causes): the changes that shrink it, and the seconds each saves.
CHANGES = {"input": _input, "transfer": _transfer, "peers": _peers, "framework": _framework}


def verdict(run: Run) -> str:
    """One line: the first cause and its change, or that nothing binds beside compute and the scaling
    that leaves."""
    if not run.replicas():
        return "no replica traced a step (a run shorter than its first trace, or breakdown_budget=0)"
    found = findings(run)
    if found:
        return found[0].line()
    name, where = _slowest(run)
    measured = Breakdown.of(where)
    cluster = run.run.get("cluster") or {}
    replicas = (cluster.get("replicas") or 1) * (cluster.get("towers") or 1)
    share = measured.seconds.get("compute", 0.0) / measured.step_secs if measured.step_secs else 0.0
    # Each replica computes `share` of its step: at most that times N of one computing alone.
    scaling = f"scaling at most {replicas * share:.2f}x one replica alone ({replicas} replica(s))"
    return f"{breakdown.verdict(measured, name)}: {scaling}"


def report(run: Run) -> str:
    """Every replica's breakdown, then the verdict and every change, ranked."""
    lines = [
        f"run: {run.logdir}",
        f"  strategy: {run.strategy.get('class', '?')}  cluster: {run.run.get('cluster')}",
    ]
    loads = run.run.get("ps_loads") or []
    if loads:
        lines.append("  bytes of variables per PS: " + ", ".join(f"{b / 2**20:.1f} MiB" for b in loads))
    lines.append("where the step went:")
    for name, where in run.replicas().items():
        lines.append(f"  {name:12s} {Breakdown.of(where).summary()}")
    lines.append(f"verdict: {verdict(run)}")
    for rank, finding in enumerate(findings(run), 1):
        lines.append(f"  {rank}. {finding.line()}")
    return "\n".join(lines)
