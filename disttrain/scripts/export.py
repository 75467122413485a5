"""Export a model_zoo run's checkpoint as a SavedModel for serving (TF Serving, tf.saved_model.load).

    disttrain-export --logdir=/tmp/run --export_dir=/tmp/served
    disttrain-export --gin_file=mlp_async.gin --logdir=/tmp/run --export_dir=/tmp/served

Writes <export_dir>/<global step>/ from the newest checkpoint in --logdir (or
--checkpoint), whatever the layout it was trained in, with the model's own
serving signature (inputs and outputs: docs/export.md). The model comes from
the gin files (the training run's: the same model and sizes); without
--gin_file, from the operative config the run wrote to <logdir>. Prints the
directory written. `python bin/export.py ...` is the same command from a checkout.
"""

import os

from absl import flags

from disttrain import scripts
from disttrain.edges import cli
from disttrain.launch import errors_to_exit
from disttrain.runtime import exporting

flags.DEFINE_multi_string("gin_file", [], "The training run's gin files (default: its operative config).")
flags.DEFINE_multi_string("gin_param", [], "Gin bindings, e.g. 'mlp.num_classes=10'.")
flags.DEFINE_string("logdir", None, "The training run's log directory (its checkpoints).")
flags.DEFINE_string("export_dir", None, "Where the versions go: <export_dir>/<version>/.")
flags.DEFINE_string("checkpoint", None, "A checkpoint path or name in --logdir (default: the newest).")
flags.DEFINE_integer("version", None, "The version's number (default: the checkpoint's global step).")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag")
    for name in ("logdir", "export_dir"):
        if not FLAGS[name].value:
            cli.fail(f"--{name} is required: e.g. --logdir=/tmp/run --export_dir=/tmp/served")
    gin_files = FLAGS.gin_file or [os.path.join(FLAGS.logdir, cli.OPERATIVE_CONFIG)]
    if not FLAGS.gin_file and not os.path.isfile(gin_files[0]):
        cli.fail(f"no --gin_file given and no {gin_files[0]}: give the training run's gin files")
    model = cli.train_config(gin_files, FLAGS.gin_param).model
    with errors_to_exit():
        try:
            written = exporting.export(
                FLAGS.logdir,
                model.serve,
                FLAGS.export_dir,
                inputs=model.serving_inputs(),
                checkpoint=FLAGS.checkpoint,
                version=FLAGS.version,
            )
        except exporting.MismatchError as e:
            hint = f"the model came from {', '.join(gin_files)}: give the run's gin files"
            raise exporting.MismatchError(f"{e}; {hint}") from None
    print(written)
    return 0


def run():
    scripts.run(main)


if __name__ == "__main__":
    run()
