"""The planner against the benchmark: predict a measured run from its own report's inputs.

A benchmark report (`bench.runner`, `--out`) holds what the planner needs
as input, measured in the same session: one process's step (the reference:
C, its CPU seconds per step), the link rate, the layout, and how many cores other processes
kept busy during the run (emulated hosts share this machine's cores with
them). The prediction is then set against the run's measured throughput
(N x the slowest worker for async, the cluster's rate for sync).

`recorded_checks` predicts the runs of `data/benchmark_emulated_hosts.json`:
benchmark runs whose reports were not kept, held as the inputs and rates
recorded from them, laid out here as the reports `check_run` reads.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping

from disttrain import strategies
from disttrain.plan import cost, interval, transports

MIN_CORES = 0.25  # what is left of the machine is never taken as less than this


@dataclasses.dataclass(frozen=True)
class Check:
    """A measured run beside its prediction."""

    label: str
    measured: float  # counted replica steps per second
    predicted: float
    prediction: cost.Prediction
    interval: interval.Interval | None = None

    @property
    def predicted_range(self) -> tuple[float, float]:
        """(low, high) replica steps per second; the middle at both ends without an interval."""
        iv = self.interval
        if iv is None:
            return self.predicted, self.predicted
        return iv.low.replica_steps_per_sec, iv.high.replica_steps_per_sec

    @property
    def error(self) -> float:
        """Predicted over measured, minus 1."""
        return self.predicted / self.measured - 1


def shape_of(report: dict, run: dict) -> cost.Shape:
    """The cluster a report's run measured: one worker per emulated host, PS dedicated or colocated."""
    cfg = report["config"]
    link = run.get("link_mbit") or cfg.get("link_mbit")
    busy = run.get("other_busy_cores") or 0.0
    return cost.Shape(
        hosts=run["workers"],
        ps=run["ps"],
        ps_hosts=run["layout"] if run["ps"] else cost.COLOCATED,
        link_gbit=link / 1000 if link else None,
        latency_ms=cfg.get("latency_ms") or 0.0,
        shared_cores=max(MIN_CORES, cfg["cpus"] - busy),
        compute_on_cpu=True,
    )


def check_run(
    report: dict,
    run: dict,
    model: cost.Model,
    strategy: cost.Strategy,
    constants: cost.Constants = cost.DEFAULTS,
    spreads: Mapping[str, transports.Spread] | None = None,
) -> Check:
    """Predict `run` of `report` with `model` (its step time is replaced by the report's reference).

    With `spreads`, the run is predicted as an interval too (its middle is the same prediction).
    """
    reference = (report.get("reference") or {}).get("steps_per_sec")
    if not reference:
        raise cost.PlanError("the report has no reference run (one process alone): re-run with --reference")
    if run.get("counted_steps_per_sec") is None:
        raise cost.PlanError(f"run {run['system']} N={run['workers']} P={run['ps']} has no measurement")
    # One compute thread's step is the reference's CPU per step: its wall time also counts the
    # cores other processes took in its window, which the run's own window need not share. With
    # more than one inter-op thread the reference may compute on two cores at once: then its
    # wall time is the step, and its CPU seconds are still what it takes from the machine.
    cpu = report["reference"].get("cpu_seconds_per_step") or 1.0 / reference
    model = model.replace(step_time=min(cpu, 1.0 / reference), compute_cpu=cpu)
    system = run["system"]
    # TF's round robin: TF 1's default and TF 2's PSS default; MinSizePartitioner balances by size.
    placement = cost.ROUND_ROBIN if system in ("tf_default", "tf2_pss") else cost.DISTTRAIN
    strategy = dataclasses.replace(strategy, kind=run["strategy"], placement=placement)
    # disttrain: 'disttrain' or 'disttrain:<strategy>'; neither TF's default nor TF 2 overlaps or cuts pieces
    if system.split(":")[0] != "disttrain":
        strategy = dataclasses.replace(strategy, overlap=False, piece_bytes=None)
    elif run["strategy"] != cost.ASYNC_PS:
        strategy = dataclasses.replace(strategy, overlap=False)
    shape = shape_of(report, run)
    iv = interval.predict(model, shape, strategy, spreads, constants) if spreads is not None else None
    p = iv.middle if iv is not None else cost.predict(model, shape, strategy, constants)
    label = (
        f"{report['config']['model']} b{report['config']['batch_size']}, {run['system']} {run['strategy']}"
        + (" overlap" if strategy.overlap else "")
        + f", {run['workers']} worker host(s)"
        + (f", {run['ps']} PS {run['layout']}" if run["ps"] else "")
        + f", {run.get('link_mbit') or report['config'].get('link_mbit'):g} Mbit/s"
    )
    return Check(label, run["counted_steps_per_sec"], p.replica_steps_per_sec, p, iv)


def table(checks: list[Check]) -> str:
    """Measured beside predicted (and its range, when predicted as one), one run a line."""
    lines = [
        f"{'run':84s} {'measured':>9s} {'predicted':>9s} {'error':>6s} {'range':>15s}  bottleneck (predicted)"
    ]
    for c in checks:
        error = f"{100 * c.error:+5.0f}%"
        low, high = c.predicted_range
        span = f"{low:.3f}-{high:.3f}" if c.interval is not None else "-"
        values = f"{c.measured:9.3f} {c.predicted:9.3f} {error} {span:>15s}"
        lines.append(f"{c.label:84s} {values}  {c.prediction.bottleneck}")
    lines.append("steps/s = replica steps (batches) per second, counted as the benchmark counts them")
    return "\n".join(lines)


def as_json(c: Check) -> dict:
    return {
        "run": c.label,
        "measured_steps_per_sec": c.measured,
        "predicted_steps_per_sec": c.predicted,
        "predicted_range_steps_per_sec": list(c.predicted_range),
        "error": c.error,
        "prediction": c.prediction.as_dict(),
        "interval": c.interval.as_dict() if c.interval is not None else None,
    }


RECORDED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "benchmark_emulated_hosts.json")
RECORDED_FORMAT = "disttrain.plan.measured"


def recorded() -> dict:
    """`data/benchmark_emulated_hosts.json`: its provenance, the commands, and the runs as recorded."""
    with open(RECORDED) as f:
        doc = json.load(f)
    if doc.get("format") != RECORDED_FORMAT or doc.get("version") != 1:
        raise ValueError(f"{RECORDED}: expected format {RECORDED_FORMAT!r} version 1")
    return doc


def recorded_runs(doc: dict | None = None) -> list[tuple[dict, dict]]:
    """Each recorded run as (report, run), the shape of a benchmark report that `check_run` reads.

    The reference's step is its recorded CPU seconds per step, both as its
    CPU and as its wall step: with one compute thread the wall step is at
    least the CPU step, and `check_run` takes the smaller.
    """
    doc = recorded() if doc is None else doc
    out = []
    for r in doc["runs"]:
        cpu = r["reference_cpu_ms"] / 1e3
        report = {
            "config": {
                "model": r["model"],
                "batch_size": r["batch_size"],
                "gin_files": [r["gin_file"]],
                "gin_params": [*doc["gin_params"][r["gin_file"]], *r.get("gin_params", ())],
                "link_mbit": r["link_mbit"],
                "latency_ms": 0.0,
                "cpus": doc["cpus"],
            },
            "reference": {"steps_per_sec": 1.0 / cpu, "cpu_seconds_per_step": cpu},
        }
        run = {
            "system": "disttrain",
            "strategy": r["strategy"],
            "workers": r["workers"],
            "ps": r["ps"],
            "layout": r.get("layout", "ring"),
            "link_mbit": r["link_mbit"],
            "other_busy_cores": r["other_busy_cores"],
            "counted_steps_per_sec": r["measured_steps_per_sec"],
        }
        out.append((report, run))
    return out


def recorded_checks(load_config: Callable) -> list[Check]:
    """The recorded runs predicted as `disttrain-plan --from_report` predicts a report's runs.

    load_config(gin_files, bindings) parses gin (the script's edge does it).
    """
    from disttrain.plan import models  # TensorFlow: only when runs are predicted

    checks = []
    for report, run in recorded_runs():
        cfg, kind = report["config"], run["strategy"]
        binding = f"TrainConfig.strategy=@{strategies.by_kind()[kind].__name__}"
        config = load_config(cfg["gin_files"], [*cfg["gin_params"], binding])
        model, strategy = models.model_from_config(config, 1.0), models.strategy_from_config(config, kind)
        checks.append(check_run(report, run, model, strategy, spreads=transports.SPREADS))
    return checks
