"""Time to accuracy: train to a held-out target in one process and under disttrain's strategies.

    disttrain-accuracy --tasks=digits --workers=2 --out=/tmp/accuracy/digits.json
    disttrain-accuracy --tasks=teacher --workers=2,4 --systems=one_process,async,sync_ps,allreduce \\
        --examples=40000 --out=/tmp/accuracy/teacher.json

Every system trains the task's zoo model on the same examples (a budget of
--examples for all) on a local cluster of real processes; the chief measures
held-out accuracy every --eval_every_steps global steps. Prints one row per
system (start-up, seconds and examples to the target, final held-out
accuracy and its difference from one process's), writes the JSON report
(--out) and a plot of held-out accuracy against time next to it. Tasks:
digits (UCI's, as scikit-learn ships them; inside the package), teacher (CIFAR-shaped, labels
from a fixed teacher). `python bin/accuracy.py ...` is the same from a checkout.
Exits non-zero if a run failed or did not train.

--seeds=0,1,2 repeats every run per seed (initial weights and shuffles; the
held-out split stays) and adds two tables: each system's end figures (the
last evaluation, the mean of the last 3) as mean ± standard error over seeds,
and each 16-bit system's seed-paired difference from its float32 twin (and
accumulation's from one step of the same global batch, --batch_scale).
"""

import itertools
import json
import os
import time

from absl import flags

from disttrain import scripts
from disttrain.bench import accuracy
from disttrain.edges import cli

flags.DEFINE_list("tasks", ["digits"], f"Tasks, of {sorted(accuracy.TASKS)}.")
flags.DEFINE_list(
    "systems",
    ["one_process", "async", "async_overlap", "sync_ps", "allreduce"],
    f"Systems, of {sorted(accuracy.SYSTEMS)}.",
)
flags.DEFINE_list("workers", ["2"], "Worker counts (one_process runs once per task).")
flags.DEFINE_list(
    "steps_per_run",
    ["1"],
    "Training steps per session.run of disttrain's systems (RunSettings.steps_per_run); each value is "
    "a run of every disttrain system. TF 2's peers run their own tf.function of up to 10 steps.",
)
flags.DEFINE_list(
    "accumulate_steps",
    ["1"],
    "Micro-batches per update of disttrain's systems (RunSettings.accumulate_steps; the rate scales "
    "with the global batch as for sync systems); each value is a run of every disttrain system.",
)
flags.DEFINE_list(
    "batch_scale",
    ["1"],
    "The task's per-replica batch times this, for disttrain's systems (the rate scales as for "
    "accumulation): --accumulate_steps=2 beside --batch_scale=2 compares accumulation with the same "
    "global batch in one step. Each value is a run of every disttrain system.",
)
flags.DEFINE_list(
    "seeds",
    ["0"],
    "Seeds of the initial weights and input shuffles (the held-out split stays); each seed repeats "
    "every run. With several, the report adds each system's mean and standard error over seeds and "
    "16-bit systems' seed-paired differences from float32.",
)
flags.DEFINE_integer("examples", None, "Training examples per run (default: the task's budget).")
flags.DEFINE_integer(
    "eval_every_steps", None, "Global steps between held-out evaluations (default: the task's)."
)
flags.DEFINE_float("target", None, "Held-out accuracy target (default: the task's).")
flags.DEFINE_float("run_timeout", 600, "Seconds before a run fails.")
flags.DEFINE_string(
    "logdir", None, "Every run's logs (default: a new directory under /tmp/disttrain_accuracy)."
)
flags.DEFINE_boolean(
    "keep_checkpoints", False, "Keep each run's checkpoints (by default deleted once it has finished)."
)
flags.DEFINE_string("out", None, "JSON report path (the plot goes next to it as .png).")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag")
    for name, values, known in (
        ("tasks", FLAGS.tasks, accuracy.TASKS),
        ("systems", FLAGS.systems, accuracy.SYSTEMS),
    ):
        unknown = [v for v in values if v not in known]
        if unknown:
            cli.fail(f"--{name}: unknown {unknown}; known: {', '.join(sorted(known))}")
    workers = _counts("workers", FLAGS.workers)
    per_run, accumulate, scale = (
        _counts("steps_per_run", FLAGS.steps_per_run),
        _counts("accumulate_steps", FLAGS.accumulate_steps),
        _counts("batch_scale", FLAGS.batch_scale),
    )
    seeds = _counts("seeds", FLAGS.seeds, minimum=0)
    logdir = FLAGS.logdir or os.path.join("/tmp/disttrain_accuracy", time.strftime("%Y%m%d-%H%M%S"))
    rows = []
    for seed in seeds:  # outermost: a stopped run still has whole seeds of every system
        for task in FLAGS.tasks:
            for system in FLAGS.systems:
                peer = accuracy.SYSTEMS[system].peer is not None
                settings = (
                    [(per_run[0], 1, 1)] if peer else list(itertools.product(per_run, accumulate, scale))
                )
                for n in [1] if system == "one_process" else workers:
                    for steps_per_run, accumulate_steps, batch_scale in settings:
                        rows.append(
                            _run(
                                task,
                                system,
                                n,
                                seed,
                                steps_per_run,
                                accumulate_steps,
                                batch_scale,
                                peer,
                                logdir,
                            )
                        )
                        _write(rows, logdir, plot=False)
    print()
    print(accuracy.table(rows))
    if len(seeds) > 1:
        print()
        print(accuracy.seeds_table(rows))
        print()
        print(accuracy.paired_table(rows))
    _write(rows, logdir, plot=True)
    return 1 if any("failed" in r for r in rows) else 0


def _run(task, system, n, seed, steps_per_run, accumulate_steps, batch_scale, peer, logdir) -> dict:
    """One run's row, announced before and summed up after on the console."""
    named = "" if peer else f", {steps_per_run} step(s) per run, {accumulate_steps} accumulated"
    named += f", batch x{batch_scale}" if batch_scale != 1 else ""
    print(f"{task}: {system}, {n} worker(s){named}, seed {seed} ...", flush=True)
    name = f"{system}_{n}_s{steps_per_run}_a{accumulate_steps}" + (
        f"_b{batch_scale}" if batch_scale != 1 else ""
    )
    row = accuracy.run_system(
        task,
        system,
        n,
        examples=FLAGS.examples,
        eval_every_steps=FLAGS.eval_every_steps,
        target=FLAGS.target,
        logdir=os.path.join(logdir, task, f"{name}_seed{seed}"),
        timeout=FLAGS.run_timeout,
        steps_per_run=steps_per_run,
        accumulate_steps=accumulate_steps,
        seed=seed,
        batch_scale=batch_scale,
        keep_checkpoints=FLAGS.keep_checkpoints,
    )
    print("  " + accuracy.one_line(row), flush=True)
    return row


def _write(rows: list[dict], logdir: str, plot: bool) -> None:
    """The JSON report so far (after each run: a stopped tool keeps its finished runs); then the plot."""
    if not FLAGS.out:
        return
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    report = {"logdir": logdir, "rows": rows}
    if len({r.get("seed", 0) for r in rows}) > 1:
        report.update(seeds=accuracy.over_seeds(rows), paired=accuracy.paired_differences(rows))
    with open(FLAGS.out, "w") as f:
        json.dump(report, f, indent=1)
    if plot:
        print(f"report: {FLAGS.out}")
        png = accuracy.plot(rows, os.path.splitext(FLAGS.out)[0] + ".png")
        print(f"plot: {png}" if png else "plot: none (matplotlib missing: install the bench extra)")


def _counts(name: str, values: list[str], minimum: int = 1) -> list[int]:
    """The integers >= `minimum` of a list flag, each once, in order; one line and exit 2 otherwise."""
    try:
        counts = [int(v) for v in values]
    except ValueError:
        counts = []
    if not counts or min(counts) < minimum or len(set(counts)) < len(counts):
        example = "0,1,2" if minimum == 0 else "2,4"
        cli.fail(
            f"--{name}={','.join(values)}: expected distinct integers >= {minimum}, e.g. --{name}={example}"
        )
    return counts


def run():
    scripts.run(main)


if __name__ == "__main__":
    run()
