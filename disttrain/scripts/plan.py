"""Scaling planner: predict a cluster before renting it, and say what to change.

    disttrain-plan --gin_file=inception_v3_sync.gin --hosts=8 --gpus_per_host=16 --ps=8 \\
        --link_gbit=20 --step_time_ms=1826 --gin_param=TrainConfig.batch_size=32
    disttrain-plan --gin_file=bench/mlp_b32.gin --hosts=4 --ps=4 --link_gbit=0.5 --measure --speed_factor=1
    disttrain-plan --from_report=/tmp/bench/run.json      # a benchmark report: predicted beside measured
    disttrain-plan --published                            # the published runs, predicted from their inputs
    disttrain-plan --gin_file=mlp_async.gin --hosts=4 --link_file=links.json  # disttrain-link-probe's file

Reads the model's variables from the gin experiment's graph (built once, no
training), predicts bytes per link, PS balance, step time, throughput,
scaling efficiency (low, middle and high: the transport's least and most
favourable environment, published or measured) and the bottleneck, and
ranks what to change by the low end. Prints a table; --out writes the same
as JSON. `python bin/plan.py ...` is the same
command from a checkout.
"""

import dataclasses
import json
import os

import gin
from absl import flags

from disttrain import scripts, strategies
from disttrain.base.errors import ConfigError
from disttrain.bench import report as bench_report
from disttrain.bench import runner
from disttrain.edges import cli
from disttrain.plan import advice, cost, interval, links, measured, models, published, transports
from disttrain.plan import report as plan_report

flags.DEFINE_multi_string("gin_file", [], "Gin experiment files, in order (e.g. inception_v3_sync.gin).")
flags.DEFINE_multi_string("gin_param", [], "Gin bindings (e.g. TrainConfig.batch_size=32).")
flags.DEFINE_integer("hosts", 1, "Worker hosts.")
flags.DEFINE_integer("gpus_per_host", 1, "GPUs per worker host.")
flags.DEFINE_boolean(
    "towers", True, "One worker per host with a tower per GPU (--notowers: a worker per GPU)."
)
flags.DEFINE_integer("ps", None, "PS tasks (default: one per host for PS strategies, 0 for all-reduce).")
flags.DEFINE_enum("ps_hosts", "colocated", ["colocated", "dedicated"], "PS on the worker hosts or their own.")
flags.DEFINE_float("link_gbit", 10.0, "Link rate per host, Gbit/s, each direction (full duplex).")
flags.DEFINE_float("latency_ms", 0.0, "One-way latency per message, ms.")
flags.DEFINE_float("host_cores", None, "Cores a host gives gRPC transfers (default: no CPU limit per host).")
flags.DEFINE_enum(
    "host_bus",
    "pcie",
    [*transports.HOST_BUSES, "none"],
    "What joins a host's GPUs when they sum gradients (none: no host term).",
)
flags.DEFINE_enum(
    "transport",
    None,
    list(transports.TRANSPORTS),
    "grpc (TF's gRPC on CPU, measured here), nccl_tcp or nccl_rdma (published figures). Default: "
    "what disttrain uses for the strategy on GPUs (gRPC; nccl_tcp for SyncAllReduce.communication_hint="
    "'nccl').",
)
flags.DEFINE_enum("strategy", None, list(cost.STRATEGIES), "Strategy (default: the gin config's).")
flags.DEFINE_enum(
    "placement",
    "disttrain",
    list(cost.PLACEMENTS),
    "disttrain's plan, TF's round robin, or TF 1's greedy by bytes.",
)
flags.DEFINE_boolean("overlap", None, "AsyncParameterServer overlap (default: the gin config's).")
flags.DEFINE_float("bucket_mib", None, "SyncAllReduce bucket size, MiB (default: the gin config's).")
flags.DEFINE_integer("transfer_bits", None, "16 or 32 bits on the wire (default: the gin config's).")
flags.DEFINE_integer("backup_workers", None, "SyncParameterServer backup workers (default: the config's).")
flags.DEFINE_float("step_time_ms", None, "One GPU's step time at the config's batch size, ms.")
flags.DEFINE_boolean("measure", False, "Measure one step here on CPU instead, divided by --speed_factor.")
flags.DEFINE_float("speed_factor", 1.0, "How many times faster one GPU is than this machine's measurement.")
flags.DEFINE_integer("measure_steps", 5, "Steps timed by --measure (after 2 warm-up steps).")
flags.DEFINE_integer("top", 8, "Changes shown in the table.")
flags.DEFINE_string("from_report", None, "A benchmark JSON report: predict each run and show the error.")
flags.DEFINE_boolean(
    "published", False, "Predict the published runs: calibration and held-out sets apart, with sources."
)
flags.DEFINE_string(
    "link_file",
    None,
    "Constants measured on your own hosts (disttrain-link-probe --out): gRPC's and TCP's share of the link, "
    "latency, gRPC's CPU per MB and per message, in place of the published ones. Its link rate and "
    "latency hold unless --link_gbit / --latency_ms are given.",
)
flags.DEFINE_string("out", None, "Write the plan as JSON here.")
FLAGS = flags.FLAGS


def load_config(gin_files, gin_params):
    gin.clear_config()
    return cli.train_config(gin_files, list(gin_params))


def config_kind(config) -> str:
    """The strategy the gin config trains with, as the cost model names it."""
    for kind, cls in strategies.by_kind().items():
        if isinstance(config.strategy, type) and issubclass(config.strategy, cls):
            return kind
    raise ConfigError(f"the config's strategy {config.strategy!r} is unknown here: pass --strategy")


def _strategy(config, kind: str) -> cost.Strategy:
    found = models.strategy_from_config(config, kind, FLAGS.placement)
    changes = {}
    if FLAGS.overlap is not None:
        changes["overlap"] = FLAGS.overlap
    if FLAGS.bucket_mib is not None:
        changes["bucket_bytes"] = int(FLAGS.bucket_mib * 2**20)
    if FLAGS.transfer_bits is not None:
        changes["transfer_bits"] = FLAGS.transfer_bits
    if FLAGS.backup_workers is not None:
        changes["backup_workers"] = FLAGS.backup_workers
    if FLAGS.transport is not None:
        changes["transport"] = transports.TRANSPORTS[FLAGS.transport]
    return dataclasses.replace(found, **changes)


def _step_time(config) -> float:
    if FLAGS.step_time_ms is not None and FLAGS.measure:
        raise ConfigError("--step_time_ms and --measure both given: pass one")
    if FLAGS.step_time_ms is not None:
        if not FLAGS.step_time_ms > 0:
            raise ConfigError(f"--step_time_ms={FLAGS.step_time_ms}: must be > 0")
        return FLAGS.step_time_ms / 1e3
    if not FLAGS.measure:
        raise ConfigError(
            "no step time: pass --step_time_ms (one GPU's step at the config's batch size), "
            "or --measure --speed_factor=F (a step measured here on CPU, divided by F)"
        )
    if not FLAGS.speed_factor > 0:
        raise ConfigError(f"--speed_factor={FLAGS.speed_factor}: must be > 0")
    return models.measure_step_time(config, FLAGS.measure_steps) / FLAGS.speed_factor


def _given(name: str) -> bool:
    return bool(FLAGS[name].present)


def plan() -> int:
    if not FLAGS.gin_file:
        cli.fail("no --gin_file given: pass one, e.g. --gin_file=inception_v3_sync.gin")
    link_file = links.load(FLAGS.link_file) if FLAGS.link_file else None
    config = load_config(FLAGS.gin_file, FLAGS.gin_param)
    kind = FLAGS.strategy or config_kind(config)
    if FLAGS.strategy:
        config = load_config(FLAGS.gin_file, [*FLAGS.gin_param, runner.STRATEGIES[kind].binding])
    ps = FLAGS.ps if FLAGS.ps is not None else (0 if kind == cost.ALLREDUCE else FLAGS.hosts)
    measured_links = link_file is not None
    shape = cost.Shape(
        hosts=FLAGS.hosts,
        gpus_per_host=FLAGS.gpus_per_host,
        towers=FLAGS.towers,
        ps=ps,
        ps_hosts=FLAGS.ps_hosts,
        link_gbit=link_file.link_gbit if measured_links and not _given("link_gbit") else FLAGS.link_gbit,
        latency_ms=link_file.latency_ms.median
        if measured_links and not _given("latency_ms")
        else FLAGS.latency_ms,
        host_cores=FLAGS.host_cores,
        host_bus=None if FLAGS.host_bus == "none" else transports.HOST_BUSES[FLAGS.host_bus],
    )
    strategy = _strategy(config, kind)
    if measured_links:
        strategy = dataclasses.replace(strategy, transport=links.transport_for(link_file, strategy))
    cost.check(shape, strategy)  # before anything is built or measured
    model = models.model_from_config(config, _step_time(config))
    spreads, constants = links.spreads_with(link_file), links.constants_with(link_file)
    prediction = interval.predict(model, shape, strategy, spreads, constants)
    ranked = advice.changes(model, shape, strategy, constants, prediction, spreads)
    described = link_file.describe() if measured_links else ""
    print(plan_report.table(prediction, model, ranked, FLAGS.top, described), flush=True)
    if FLAGS.out:
        bench_report.write_json(plan_report.as_json(prediction, model, ranked), FLAGS.out)
        print(f"plan: {FLAGS.out}")
    return 0


def from_report(path: str) -> int:
    """Each measured run of a benchmark report beside its prediction."""
    if not os.path.isfile(path):
        raise ConfigError(
            f"--from_report={path}: no such file; pass a benchmark report (--out of bin/benchmark.py)"
        )
    with open(path) as f:
        report = json.load(f)
    link_file = links.load(FLAGS.link_file) if FLAGS.link_file else None
    if link_file is not None:
        print(f"transport constants: {link_file.describe()}", flush=True)
    cfg = report["config"]
    checks = []
    for run in report["runs"]:
        if run.get("counted_steps_per_sec") is None:
            continue
        config = load_config(
            cfg["gin_files"], [*cfg["gin_params"], runner.STRATEGIES[run["strategy"]].binding]
        )
        model = models.model_from_config(config, 1.0)
        strategy = models.strategy_from_config(config, run["strategy"])
        if link_file is not None:
            strategy = dataclasses.replace(strategy, transport=links.transport_for(link_file, strategy))
        checks.append(
            measured.check_run(
                report, run, model, strategy, links.constants_with(link_file), links.spreads_with(link_file)
            )
        )
    print(measured.table(checks), flush=True)
    if FLAGS.out:
        bench_report.write_json({"checks": [measured.as_json(c) for c in checks]}, FLAGS.out)
    return 0


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag")
    with cli.errors_to_exit():  # a PlanError is a ConfigError: one line, exit 2
        if FLAGS.published:
            results = published.predict_all(load_config)
            print(published.table(results) + "\n\n" + published.answers_table(results), flush=True)
            return 0
        if FLAGS.from_report:
            return from_report(FLAGS.from_report)
        return plan()


def run():
    scripts.run(main)


if __name__ == "__main__":
    run()
