#!/usr/bin/env python
"""Start a whole disttrain cluster on this machine, one process per task.

    python bin/launch_local.py --gin_file=gin/mlp_async.gin --num_ps=2 --num_workers=2

Each task logs to <logdir>/logs/<job>_<index>.log; the chief's progress is
echoed here. Ctrl-C or any task's failure stops every task. Ends with a
summary: steps, examples/sec per task and for the cluster, where the logs are.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from disttrain import cli  # noqa: E402

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
FLAGS = flags.FLAGS


def main(argv):
    del argv
    return cli.launch_local(
        FLAGS.gin_file,
        FLAGS.gin_param,
        FLAGS.num_ps,
        FLAGS.num_workers,
        FLAGS.chief,
        FLAGS.evaluator,
        FLAGS.logdir,
        FLAGS.timeout,
        FLAGS.max_restarts,
    )


if __name__ == "__main__":
    app.run(main)
