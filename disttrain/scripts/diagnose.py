"""Why is my training slow? Read a run's log directory and say what binds its step and what to change.

    disttrain-diagnose /tmp/disttrain_local        # a run of disttrain's, or of TF's default layout
    python bin/diagnose.py /tmp/disttrain_local    # the same from a checkout

It reads the run's run.json (cluster, strategy, bytes per PS) and each
replica's result.json (throughput, and where its step went), prints where
each replica's step went, a verdict naming what binds it with the evidence,
and the changes that would remove it, ranked by the gain each should bring
(disttrain/plan/diagnose.py; docs/diagnose.md walks from each verdict to
its fix). Exit 2 when the directory holds no run it can read.
"""

from absl import flags

from disttrain import scripts
from disttrain.edges import cli
from disttrain.plan import diagnose

FLAGS = flags.FLAGS


def main(argv):
    if len(argv) != 2:
        cli.fail("give one log directory: disttrain-diagnose LOGDIR (e.g. /tmp/disttrain_local)")
    try:
        run = diagnose.read_run(argv[1])
    except diagnose.RunError as e:
        cli.fail(f"{e}")
    print(diagnose.report(run))
    return 0


def run():
    scripts.run(main)


if __name__ == "__main__":
    run()
