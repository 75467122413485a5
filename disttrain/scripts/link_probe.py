"""Transport ceilings on emulated hosts: plain TCP, TF's ring all-reduce, an all-to-all over TF.

    disttrain-link-probe --hosts=4 --link_mbit=500 --mbytes=68          # as root

Builds the benchmark's emulated hosts (shaped links, no model) and times each
--methods entry (method[:pieces]) over the same bytes, printing per round the
share of the nominal link rate it reached: what "x of the bound" in a
benchmark report can at most be with that transport. See
disttrain/bench/link_probe.py. `python bin/link_probe.py ...` is the same
command from a checkout.
"""

from absl import flags

from disttrain import cli, scripts
from disttrain.bench import link_probe, netem
from disttrain.errors import ConfigError

flags.DEFINE_integer("hosts", 4, "Emulated hosts.")
flags.DEFINE_float("link_mbit", 500, "Link rate per direction, Mbit/s.")
flags.DEFINE_float("mbytes", 68, "MB per host per direction (tcp_*), or of the all-reduced tensor (tf_*).")
flags.DEFINE_list(
    "methods",
    ["tcp_ring", "tcp_all_to_all", "tf_ring:8", "tf_all_to_all:16"],
    f"method[:pieces], methods {', '.join(link_probe.METHODS)}; "
    "pieces: TF ring's max_subdivs, or all-to-all pieces.",
)
flags.DEFINE_integer("repeats", 3, "Timed rounds per method.")
FLAGS = flags.FLAGS


def _methods() -> list[tuple[str, int]]:
    out = []
    for entry in FLAGS.methods:
        method, _, pieces = entry.partition(":")
        if method not in link_probe.METHODS or (pieces and not pieces.isdigit()) or pieces == "0":
            raise ConfigError(
                f"--methods entry {entry!r}: expected method[:pieces] with method one of "
                f"{', '.join(link_probe.METHODS)} and pieces >= 1"
            )
        out.append((method, int(pieces or 1)))
    return out


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag")
    with cli.errors_to_exit():
        methods = _methods()
        if FLAGS.hosts < 2 or FLAGS.repeats < 1 or not FLAGS.mbytes > 0:
            raise ConfigError("--hosts must be >= 2, --repeats >= 1 and --mbytes > 0")
        reason = netem.check_permitted()
        if reason:
            raise ConfigError(f"cannot build emulated hosts: {reason}")
        nbytes = int(FLAGS.mbytes * 1e6)
        print(
            f"link probe: {FLAGS.hosts} emulated hosts at {FLAGS.link_mbit:g} Mbit/s, "
            f"{FLAGS.mbytes:g} MB, {FLAGS.repeats} rounds each",
            flush=True,
        )
        with netem.EmulatedHosts(FLAGS.hosts, FLAGS.link_mbit) as hosts:
            for method, pieces in methods:
                result = link_probe.measure(hosts, method, nbytes, pieces, FLAGS.repeats)
                print(link_probe.format_result(result), flush=True)
    return 0


def run():
    scripts.run(main)


if __name__ == "__main__":
    run()
