"""Scaling benchmark: disttrain, TF's default layout and TF 2's strategies side by side, against the bound.

    disttrain-benchmark --gin_file=bench/mlp.gin --workers=1,2 --ps=1 --out=/tmp/bench.json
    disttrain-benchmark --gin_file=bench/cifar10_b32.gin --workers=1 --ps=1 \\
        --network=emulated --link_mbit=1000 --out=/tmp/cifar.json          # as root

Runs every system x PS count x worker count as a real cluster (local
processes, or emulated hosts with shaped links), plus the same model and batch
in one process alone. Prints progress, a table and a summary; writes the JSON
report (--out) and a plot next to it. Exits non-zero if any run failed.
`python bin/benchmark.py ...` is the same command from a checkout.
"""

import os

import gin
from absl import flags

from disttrain import scripts, strategies
from disttrain.bench import report as report_lib
from disttrain.bench import runner
from disttrain.edges import cli

flags.DEFINE_multi_string("gin_file", [], "Gin config files, in order (e.g. gin/bench/mlp.gin).")
flags.DEFINE_multi_string("gin_param", [], "Gin bindings, applied to every run.")
flags.DEFINE_list("workers", ["1", "2"], "Worker counts to run.")
flags.DEFINE_list("ps", ["1"], "PS counts to run (ignored by all-reduce).")
flags.DEFINE_list(
    "systems",
    ["disttrain", "tf_default"],
    "disttrain (the config's strategy, or --strategy), disttrain:<strategy> (one run each, e.g. "
    "disttrain:hybrid,disttrain:sync_ps,disttrain:allreduce), tf_default (TF 1 round robin, async PS); "
    "TF 2's own, for the MLP: tf2_pss, tf2_pss_minsize (ParameterServerStrategy, async PS), tf2_mwms "
    "(MultiWorkerMirrored, ring).",
)
flags.DEFINE_enum(
    "strategy", None, list(strategies.by_kind()), "disttrain's strategy (default: the config's)."
)
flags.DEFINE_enum("network", "localhost", ["localhost", "emulated"], "Loopback, or emulated hosts (root).")
flags.DEFINE_float("link_mbit", None, "Emulated link rate per direction, Mbit/s.")
flags.DEFINE_float(
    "link_ratio",
    None,
    "Instead of --link_mbit: the emulated link moves the model's bytes each way in this many of one "
    "process's steps (measured first), so that the case means the same on any machine; 1.0 is seed 000's.",
)
flags.DEFINE_float(
    "host_cores",
    None,
    "Emulated: each host's CPU budget in cores (a cgroup per host pinned to its own cores; one process "
    "alone runs under the same budget), so that hosts do not share this machine's cores (root).",
)
flags.DEFINE_list(
    "budget_check",
    [],
    "Instead of the benchmark: is --host_cores fair here? K copies of one process, each on a budget of its "
    "own, together and alone, for each K given (e.g. 2,4,8); exits 1 if any spread exceeds 5%.",
)
flags.DEFINE_float("link_latency_ms", 0.0, "Emulated one-way latency per host link (needs sch_netem).")
flags.DEFINE_enum(
    "ps_placement", "dedicated", ["dedicated", "colocated"], "PS on own hosts, or PS i on worker i's host."
)
flags.DEFINE_integer("warmup_steps", 20, "Steps per replica dropped as warm-up.")
flags.DEFINE_integer("measure_steps", 50, "Steps per replica measured, at least.")
flags.DEFINE_boolean("reference", True, "Also run one process alone (needed for scaling and the bound).")
flags.DEFINE_integer("repeats", 1, "Run everything this many times, interleaved; keep each run's quietest.")
flags.DEFINE_float("quiet_cores", None, "Before each run, wait until other processes use fewer cores.")
flags.DEFINE_float("quiet_timeout", 600, "Seconds to wait for --quiet_cores at most, then go ahead.")
flags.DEFINE_float("run_timeout", 900, "Seconds before a run that has not finished measuring fails.")
flags.DEFINE_string(
    "logdir",
    None,
    "Where every run's task logs go, emptied run by run (default: a new directory under "
    "/tmp/disttrain_bench per invocation, so that benchmarks running at once keep their logs).",
)
flags.DEFINE_boolean(
    "keep_checkpoints", False, "Keep each run's checkpoints (by default deleted once it is measured)."
)
flags.DEFINE_string("out", None, "JSON report path (the plot goes next to it as .png).")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag")
    if not FLAGS.gin_file:
        cli.fail("no --gin_file given: pass one, e.g. --gin_file=gin/bench/mlp.gin")

    def load_config(bindings):
        gin.clear_config()
        return cli.train_config(FLAGS.gin_file, list(bindings))

    def ints(name, values):
        try:
            return tuple(int(v) for v in values)
        except ValueError:
            cli.fail(f"--{name}={','.join(values)}: expected integers, e.g. --{name}=1,2,4")

    out = FLAGS.out
    plot_path = os.path.splitext(out)[0] + ".png" if out else None
    config = runner.BenchConfig(
        gin_files=tuple(FLAGS.gin_file),
        load_config=load_config,
        gin_params=tuple(FLAGS.gin_param),
        workers=ints("workers", FLAGS.workers),
        ps=ints("ps", FLAGS.ps),
        systems=tuple(FLAGS.systems),
        strategy=FLAGS.strategy,
        network=FLAGS.network,
        link_mbit=FLAGS.link_mbit,
        link_ratio=FLAGS.link_ratio,
        latency_ms=FLAGS.link_latency_ms,
        host_cores=FLAGS.host_cores,
        ps_placement=FLAGS.ps_placement,
        warmup_steps=FLAGS.warmup_steps,
        measure_steps=FLAGS.measure_steps,
        reference=FLAGS.reference,
        repeats=FLAGS.repeats,
        quiet_cores=FLAGS.quiet_cores,
        quiet_timeout=FLAGS.quiet_timeout,
        run_timeout=FLAGS.run_timeout,
        logdir=FLAGS.logdir or runner.new_logdir(),
        keep_checkpoints=FLAGS.keep_checkpoints,
    )
    say = lambda line: print(line, flush=True)
    save = (lambda r: report_lib.write_json(r, out)) if out else None
    if FLAGS.budget_check:
        return _budget_check(config, ints("budget_check", FLAGS.budget_check), say, save, out)
    with cli.errors_to_exit():
        report = runner.Benchmark(config, log=say, on_update=save).run()
    say("")
    say(report_lib.table(report))
    say("")
    say(report_lib.summary(report))
    if out:
        report_lib.write_json(report, out)
        say(f"report: {out}")
        problem = report_lib.plot(report, plot_path)
        say(f"plot: {plot_path}" if problem is None else f"plot: {problem}")
    failed = [r for r in report["runs"] if r.get("error")] or (report.get("reference") or {}).get("error")
    return 1 if failed else 0


def _budget_check(config, counts, say, save, out) -> int:
    """--budget_check: the copies together and alone; 1 unless every check was fair."""
    with cli.errors_to_exit():
        report = runner.Benchmark(config, log=say, on_update=save).check_budget(counts)
    if out:
        report_lib.write_json(report, out)
        say(f"report: {out}")
    return 0 if all(check["fair"] for check in report["checks"]) else 1


def run():
    scripts.run(main)


if __name__ == "__main__":
    run()
