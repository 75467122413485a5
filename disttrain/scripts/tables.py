"""Regenerate the measurement tables of README.md and docs/ from the report files in the repository.

    disttrain-tables             # rewrite every table block from the reports
    disttrain-tables --check     # rewrite nothing; exit 1 naming each stale block or unknown table

A page holds a generated table between a `<!-- table: NAME -->` line and a
`<!-- /table -->` line; NAME is one of disttrain/bench/tables.py's TABLES,
each rendered from the benchmark's and time to accuracy's JSON reports
(docs/reports/bench/, docs/images/). A report the repository lacks renders as
"not measured". It also draws README's plot of the headline table
(docs/reports/bench/headline.png; the `bench` extra's matplotlib). Run it after
writing a report with `--out`, and commit the report, the pages and the plot
together. `python bin/tables.py ...` is the same command
from a checkout.
"""

import os

from absl import flags

from disttrain import scripts
from disttrain.bench import tables
from disttrain.edges import cli

flags.DEFINE_boolean("check", False, "Rewrite nothing: exit 1 if a block is stale or names an unknown table.")
flags.DEFINE_string(
    "root",
    None,
    "The repository whose README.md and docs/ to read (default: the checkout this disttrain is in, "
    "else the current directory).",
)
FLAGS = flags.FLAGS


def _root() -> str:
    if FLAGS.root:
        return FLAGS.root
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(tables.__file__))))
    if os.path.isdir(os.path.join(checkout, "docs")) and os.path.exists(os.path.join(checkout, "README.md")):
        return checkout
    return os.getcwd()


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag")
    root = _root()
    if not os.path.isdir(os.path.join(root, "docs")):
        cli.fail(f"--root={root}: no docs/ there; run from the repository's root or pass --root")
    changed, problems = tables.update(root, check=FLAGS.check)
    for line in problems:
        print(line)
    if FLAGS.check:
        for line in changed:
            print(f"{line} is stale: run python bin/tables.py")
        if not changed and not problems:
            print("every table is up to date")
        return 1 if changed or problems else 0
    for line in changed:
        print(f"{line} rewritten")
    unplotted = tables.headline_plot(root)
    print(f"plot: {unplotted}" if unplotted else f"plot: {tables.HEADLINE_PLOT}")
    for path in tables.scaling_plots(root):
        print(f"plot: {path}")
    if not changed:
        print("every table was up to date")
    return 1 if problems else 0


def run():
    scripts.run(main)


if __name__ == "__main__":
    run()
