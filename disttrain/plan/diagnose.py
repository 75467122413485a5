"""Why is this run slow? Read a run's log directory, name what binds its step with the evidence, and
rank the changes that would remove it by the gain each should bring.

It reads what every run writes: the chief's `run.json` (the cluster's shape,
the strategy and its knobs, the bytes of variables on each PS task) and each
replica's `result.json` (its throughput and where its step went:
`disttrain.runtime.breakdown`). A run of TF's default layout (the
benchmark's `tf_default` system) writes the same, so it is read the same way,
and what disttrain's layout would change shows among the changes.

The gains are first order, from the run's own seconds: a change removes or
shrinks one part of the measured step and leaves the others as they were
(`Finding.gain`: the step before over the step after). They say which change
to try first, not the speed it will reach; a run after the change measures
that.
"""

from __future__ import annotations

import dataclasses
import json
import os

from disttrain.launch import read_results
from disttrain.runtime.breakdown import Breakdown

# A part of the step is a cause worth naming above this share of it.
BINDS = 0.2
# One PS task carrying this much more than the mean of the bytes is unbalanced.
UNBALANCED = 1.3


class RunError(ValueError):
    """The directory holds no run that can be read (its message says what is missing)."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """A cause, its evidence, the change that removes it, and the gain expected (before / after)."""

    cause: str
    change: str
    gain: float

    def line(self) -> str:
        return f"{self.cause}: {self.change} (expected {100 * (self.gain - 1):.0f}% faster)"


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


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.0f} ms"


def findings(run: Run) -> list[Finding]:
    """Every cause found in the run, each with its change, best expected gain first."""
    if not run.replicas():
        return []
    name, where = _slowest(run)
    step, parts = where["step_secs"], where["seconds"]
    found = (
        _input(name, step, parts)
        + _transfer(run, step, parts, where)
        + _peers(run, name, step, parts)
        + _framework(run, step, parts)
    )
    return sorted(found, key=lambda f: -f.gain)


def _input(name: str, step: float, parts: dict) -> list[Finding]:
    waited = parts.get("input", 0.0)
    if waited < BINDS * step:
        return []
    cause = f"most of {name}'s step waits for its input pipeline ({_ms(waited)} of a {_ms(step)} step)"
    change = "read in parallel and prefetch (dataset.map(..., num_parallel_calls), .prefetch())"
    return [Finding(cause, change, _gain(step, waited))]


def _transfer(run: Run, step: float, parts: dict, where: dict) -> list[Finding]:
    moving = parts.get("transfer", 0.0)
    if moving < BINDS * step:
        return []
    strategy, out = run.strategy, []
    moved = sum(where.get("bytes_by_ps", {}).values())
    cause = f"moving variables and gradients takes {_ms(moving)} of a {_ms(step)} step"
    if moved:
        cause += f" ({moved / 2**20:.1f} MiB a step)"
    loads = run.run.get("ps_loads") or []
    ratio = max(loads) / (sum(loads) / len(loads)) if len(loads) > 1 and sum(loads) else 1.0
    balanced = 0.0  # what balancing the PS tasks would save
    if ratio >= UNBALANCED:
        cause = f"one PS holds most of the bytes (busiest/mean {ratio:.1f}); {cause}"
        balanced = moving * (1 - 1 / ratio)
        change = (
            "balance them: disttrain's PS strategies place variables by bytes and split large ones"
            if strategy.get("baseline")
            else "balance them: plan placement from the loss (minimize(loss_fn)) or set piece_bytes"
        )
        out.append(Finding(cause, change, _gain(step, balanced)))
    if not strategy.get("transfer_dtype") and "transfer_dtype" in strategy:
        change = f"send 16 bits: {strategy['class']}(transfer_dtype='bfloat16') halves the bytes"
        out.append(Finding(cause, change, _gain(step, moving / 2)))
    if strategy.get("kind") == "async_ps" and strategy.get("overlap") is False:
        hidden = min(moving, parts.get("compute", 0.0))
        change = "overlap the transfers with compute: AsyncParameterServer(overlap=True)"
        out.append(Finding(cause, change, _gain(step, hidden)))
    if strategy.get("baseline"):
        # Placed by bytes, then what is left moves while the next step computes.
        saved = balanced + min(moving - balanced, parts.get("compute", 0.0))
        change = (
            "train with disttrain's AsyncParameterServer(overlap=True): it places variables by bytes "
            "and moves them while the next step computes"
        )
        out.append(Finding(cause, change, _gain(step, saved)))
    return out


def _peers(run: Run, name: str, step: float, parts: dict) -> list[Finding]:
    waited = parts.get("peers", 0.0)
    if waited < BINDS * step:
        return []
    strategy = run.strategy
    cause = f"{name} waits for its peers {_ms(waited)} of a {_ms(step)} step"
    out = []
    if strategy.get("kind") == "sync_ps" and not strategy.get("backup_workers"):
        change = "let the slowest replica's gradients go: SyncParameterServer(backup_workers=1)"
        out.append(Finding(cause + " (the sync barrier)", change, _gain(step, waited / 2)))
    if strategy.get("kind") == "allreduce" and not strategy.get("transfer_dtype"):
        change = "send 16 bits over the ring: SyncAllReduce(transfer_dtype='bfloat16')"
        out.append(Finding(cause + " (the ring)", change, _gain(step, waited / 2)))
    return out


def _framework(run: Run, step: float, parts: dict) -> list[Finding]:
    own = parts.get("framework", 0.0)
    if own < BINDS * step or (run.run.get("steps_per_run") or 1) > 1:
        return []
    cause = f"the framework's own time (Python, hooks, session.run) is {_ms(own)} of a {_ms(step)} step"
    change = "make several steps per session.run: steps_per_run=10"
    return [Finding(cause, change, _gain(step, own * 0.9))]


def verdict(run: Run) -> str:
    """One line: the first cause and its change, or that nothing binds beside compute."""
    if not run.replicas():
        return "no replica traced a step (a run shorter than its first trace, or breakdown_budget=0)"
    found = findings(run)
    if found:
        return found[0].line()
    name, where = _slowest(run)
    share = where["seconds"].get("compute", 0.0) / where["step_secs"]
    return f"no bottleneck: compute is {100 * share:.0f}% of {name}'s step ({_ms(where['step_secs'])})"


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
