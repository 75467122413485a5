"""Start any role of a disttrain cluster: ps, worker, chief or evaluator.

    disttrain-train --gin_file=mlp_async.gin --job=worker --task=1   # cluster in TF_CONFIG
    disttrain-train --gin_file=mlp_async.gin                          # no cluster: trains alone
    disttrain-train --gin_file=mlp_async.gin --dry_run                # what it would do

`python bin/train.py ...` is the same command from a checkout.
"""

from absl import flags, logging

from disttrain import scripts
from disttrain.edges import cli

flags.DEFINE_multi_string("gin_file", [], "Gin config files, in order (later ones override).")
flags.DEFINE_multi_string("gin_param", [], "Gin bindings, e.g. 'TrainConfig.train_steps=100'.")
flags.DEFINE_string("job", None, "This task's job: ps, worker, chief or evaluator (default: from TF_CONFIG).")
flags.DEFINE_integer("task", None, "This task's index within its job.")
flags.DEFINE_list("ps_hosts", [], "host:port of each PS task (instead of TF_CONFIG).")
flags.DEFINE_list("worker_hosts", [], "host:port of each worker task (instead of TF_CONFIG).")
flags.DEFINE_string("chief_host", None, "host:port of the chief task (instead of TF_CONFIG).")
flags.DEFINE_string("logdir", "/tmp/disttrain", "Checkpoints, TensorBoard events, operative config.")
flags.DEFINE_boolean("dry_run", False, "Print role, cluster, placement and gin config, then exit.")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag")
    cluster = cli.cluster(FLAGS.job, FLAGS.task, FLAGS.ps_hosts, FLAGS.worker_hosts, FLAGS.chief_host)
    config = cli.train_config(FLAGS.gin_file, FLAGS.gin_param)
    if FLAGS.dry_run:
        return cli.dry_run(cluster, config)
    logging.get_absl_handler().setFormatter(None)
    return cli.run(cluster, config, FLAGS.logdir)


def run():
    scripts.run(main)


if __name__ == "__main__":
    run()
