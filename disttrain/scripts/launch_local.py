"""Start a whole disttrain cluster on this machine, one process per task.

    disttrain-launch-local --gin_file=mlp_async.gin --num_ps=2 --num_workers=2

Each task logs to <logdir>/logs/<job>_<index>.log; the chief's progress is
echoed here. Ctrl-C or any task's failure stops every task. Ends with a
summary: steps, examples/sec per task and for the cluster, where the logs are.
Run as root, the tasks share a network namespace of their own with only a
loopback: TensorFlow's servers listen on every interface and run whatever
they are sent, and there nobody else can reach them.
`python bin/launch_local.py ...` is the same command from a checkout.
"""

from absl import flags

from disttrain import scripts
from disttrain.edges import cli
from disttrain.plan import diagnose

flags.DEFINE_multi_string("gin_file", [], "Gin config files, in order.")
flags.DEFINE_multi_string("gin_param", [], "Gin bindings.")
flags.DEFINE_integer("num_ps", 1, "Parameter server tasks.")
flags.DEFINE_integer("num_workers", 2, "Worker tasks (the chief comes in addition with --chief).")
flags.DEFINE_boolean("chief", False, "Add a separate chief task (else worker 0 is the chief).")
flags.DEFINE_boolean("evaluator", False, "Add an evaluator task.")
flags.DEFINE_string("logdir", "/tmp/disttrain_local", "Log directory shared by all tasks.")
flags.DEFINE_float("timeout", None, "Stop everything after this many seconds.")
flags.DEFINE_integer(
    "max_restarts", 0, "Restart a task that dies by a signal or a transient exit code this often."
)
flags.DEFINE_boolean(
    "private_network",
    True,
    "Run the tasks in a network namespace whose only interface is loopback, unreachable from "
    "elsewhere (needs root; without it they share this machine's network). --noprivate_network "
    "shares it anyway, e.g. for input read from remote storage.",
)
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag")
    code = cli.launch_local(
        FLAGS.gin_file,
        FLAGS.gin_param,
        FLAGS.num_ps,
        FLAGS.num_workers,
        FLAGS.chief,
        FLAGS.evaluator,
        FLAGS.logdir,
        FLAGS.timeout,
        FLAGS.max_restarts,
        FLAGS.private_network,
    )
    try:
        run = diagnose.read_run(FLAGS.logdir)
    except diagnose.RunError:
        return code  # nothing trained (a finished run's directory): the summary said so
    print(f"  verdict: {diagnose.verdict(run)}  (more: disttrain-diagnose {FLAGS.logdir})", flush=True)
    return code


def run():
    scripts.run(main)


if __name__ == "__main__":
    run()
