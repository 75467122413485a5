"""Measure links: your own hosts' constants for the planner, or transport ceilings on emulated hosts.

    # On every host of your cluster, one task each (as disttrain-train starts them):
    disttrain-link-probe --mode=hosts --worker_hosts=h0:7300,h1:7300,h2:7300 --task=I \\
        --link_gbit=25 --out=links.json           # task 0 measures and writes links.json
    disttrain-link-probe --mode=hosts --job=worker --task=I --link_gbit=25 --out=links.json  # TF_CONFIG
    disttrain-plan --gin_file=... --hosts=3 --link_file=links.json

    disttrain-link-probe --mode=emulated --hosts=2 --link_mbit=100 --out=links.json  # as root: the same
    disttrain-link-probe --hosts=4 --link_mbit=500 --mbytes=68                     # as root: ceilings

--mode=hosts: this process is one task; task 0 measures every other host
(latency, plain TCP's and TF gRPC's share of the declared --link_gbit,
gRPC's CPU per MB and per message) and writes a link file for
`disttrain-plan --link_file` (disttrain/bench/link_hosts.py). Each task uses
its address's port for TF's server and the next port for the probe's own
control connection. --mode=emulated builds the benchmark's emulated hosts
and runs the hosts mode in each. --mode=methods (the default) times each
--methods entry (method[:pieces]) over the same bytes on emulated hosts,
printing the share of the nominal link rate each reached
(disttrain/bench/link_probe.py). `python bin/link_probe.py ...` is the same
command from a checkout.
"""

import dataclasses
import os
import subprocess
import sys
import tempfile
import threading

from absl import flags

from disttrain import scripts
from disttrain.base import cluster as cluster_lib
from disttrain.base.errors import ConfigError
from disttrain.bench import link_hosts, link_probe, netem
from disttrain.edges import cli
from disttrain.plan import links

METHODS, HOSTS, EMULATED = "methods", "hosts", "emulated"
EMULATED_PORT = 7300

flags.DEFINE_enum("mode", METHODS, [METHODS, HOSTS, EMULATED], "What to measure (see above).")
flags.DEFINE_integer("hosts", 4, "Emulated hosts (--mode=methods or emulated).")
flags.DEFINE_float("link_mbit", 500, "Emulated link rate per direction, Mbit/s.")
flags.DEFINE_float("latency_ms", 0.0, "Emulated one-way latency, ms (--mode=emulated; needs sch_netem).")
flags.DEFINE_float(
    "mbytes", 68, "MB per host per direction (tcp_*, hosts), or of the all-reduced tensor (tf_*)."
)
flags.DEFINE_list(
    "methods",
    ["tcp_ring", "tcp_all_to_all", "tf_ring:8", "tf_all_to_all:16"],
    f"method[:pieces], methods {', '.join(link_probe.METHODS)}; "
    "pieces: TF ring's max_subdivs, or all-to-all pieces.",
)
flags.DEFINE_integer("repeats", 3, "Timed rounds per method (or per measurement).")
flags.DEFINE_string("job", None, "--mode=hosts: this task's job (default: worker with --worker_hosts).")
flags.DEFINE_integer("task", None, "--mode=hosts: this task's index within its job.")
flags.DEFINE_list("ps_hosts", [], "--mode=hosts: host:port of each PS task (instead of TF_CONFIG).")
flags.DEFINE_list("worker_hosts", [], "--mode=hosts: host:port of each worker task (instead of TF_CONFIG).")
flags.DEFINE_string("chief_host", None, "--mode=hosts: host:port of the chief task (instead of TF_CONFIG).")
flags.DEFINE_float(
    "link_gbit", None, "--mode=hosts: each host's link rate as rented, Gbit/s (shares are of it)."
)
flags.DEFINE_string("out", None, "--mode=hosts or emulated: where task 0 writes the link file (JSON).")
flags.DEFINE_float(
    "timeout_s", 900, "--mode=hosts or emulated: give up (every task) after this many seconds."
)
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


def _check_sizes() -> None:
    if FLAGS.repeats < 1 or not FLAGS.mbytes > 0:
        raise ConfigError("--repeats must be >= 1 and --mbytes > 0")


def _emulated_hosts_permitted() -> None:
    reason = netem.check_permitted(latency=FLAGS.latency_ms > 0)
    if reason:
        raise ConfigError(f"cannot build emulated hosts: {reason}")


def methods() -> int:
    chosen = _methods()
    _check_sizes()
    if FLAGS.hosts < 2:
        raise ConfigError("--hosts must be >= 2")
    _emulated_hosts_permitted()
    nbytes = int(FLAGS.mbytes * 1e6)
    print(
        f"link probe: {FLAGS.hosts} emulated hosts at {FLAGS.link_mbit:g} Mbit/s, "
        f"{FLAGS.mbytes:g} MB, {FLAGS.repeats} rounds each",
        flush=True,
    )
    with netem.EmulatedHosts(FLAGS.hosts, FLAGS.link_mbit) as hosts:
        for method, pieces in chosen:
            result = link_probe.measure(hosts, method, nbytes, pieces, FLAGS.repeats)
            print(link_probe.format_result(result), flush=True)
    return 0


def _addresses() -> tuple[list[str], int]:
    """Every task's address (chief, workers, PS) as the cluster names them, and this task's position."""
    job = FLAGS.job or ("worker" if FLAGS.worker_hosts and not FLAGS.chief_host else None)
    cluster = cluster_lib.resolve(job, FLAGS.task, FLAGS.ps_hosts, FLAGS.worker_hosts, FLAGS.chief_host)
    if cluster.is_local:
        raise ConfigError("--mode=hosts needs a cluster: --worker_hosts=h0:port,... --task=I, or TF_CONFIG")
    order = [*cluster.replica_jobs, *((cluster_lib.PS, i) for i in range(cluster.num_ps))]
    addresses = [cluster.jobs[job][i] for job, i in order]
    if len(set(addresses)) < 2:
        raise ConfigError(f"--mode=hosts needs at least 2 tasks at different addresses, got {addresses}")
    return addresses, order.index((cluster.task_type, cluster.task_index))


def hosts() -> int:
    _check_sizes()
    if FLAGS.link_gbit is None or not FLAGS.link_gbit > 0:
        raise ConfigError("--mode=hosts needs --link_gbit > 0: each host's link rate as rented, in Gbit/s")
    addresses, me = _addresses()
    if me == 0 and not FLAGS.out:
        raise ConfigError("--mode=hosts: task 0 writes the link file; pass --out=links.json")
    nbytes = int(FLAGS.mbytes * 1e6)
    found = link_hosts.run_task(addresses, me, FLAGS.link_gbit, nbytes, FLAGS.repeats, FLAGS.timeout_s)
    if found is None:
        print(f"link probe task {me}: served task 0, done", flush=True)
        return 0
    found = dataclasses.replace(found, path=FLAGS.out)
    links.write(found, FLAGS.out)
    print(f"link probe: {found.describe()}", flush=True)
    print(f"link file: {FLAGS.out}", flush=True)
    return 0


def emulated() -> int:
    """Build emulated hosts and run one --mode=hosts task in each, as on real hosts."""
    _check_sizes()
    if FLAGS.hosts < 2 or not FLAGS.out:
        raise ConfigError("--mode=emulated needs --hosts >= 2 and --out=links.json")
    _emulated_hosts_permitted()
    out = os.path.abspath(FLAGS.out)
    with netem.EmulatedHosts(FLAGS.hosts, FLAGS.link_mbit, FLAGS.latency_ms, prefix="dtlf") as emulated_hosts:
        addrs = ",".join(f"{emulated_hosts.address(i)}:{EMULATED_PORT}" for i in range(FLAGS.hosts))
        common = [
            sys.executable,
            "-m",
            "disttrain.scripts.link_probe",
            f"--mode={HOSTS}",
            f"--worker_hosts={addrs}",
            f"--link_gbit={FLAGS.link_mbit / 1e3}",
            f"--mbytes={FLAGS.mbytes}",
            f"--repeats={FLAGS.repeats}",
            f"--timeout_s={FLAGS.timeout_s}",
            f"--out={out}",
        ]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        logs = [tempfile.TemporaryFile("w+") for _ in range(FLAGS.hosts)]
        procs = [
            emulated_hosts.popen(
                i, [*common, f"--task={i}"], stdout=logs[i], stderr=subprocess.STDOUT, env=env
            )
            for i in range(FLAGS.hosts)
        ]
        # Every wait has a deadline: past it, all tasks are killed.
        watchdog = threading.Timer(FLAGS.timeout_s + 60, lambda: [p.kill() for p in procs])
        watchdog.start()
        try:
            codes = [p.wait() for p in procs]
        finally:
            watchdog.cancel()
        texts = []
        for log in logs:
            log.seek(0)
            texts.append(log.read())
            log.close()
    if any(codes):
        bad = next(i for i, c in enumerate(codes) if c)
        tail = " | ".join(texts[bad].strip().splitlines()[-3:])
        raise ConfigError(f"link probe task {bad} on emulated host {bad} exited {codes[bad]}: {tail}")
    print(
        "\n".join(line for line in texts[0].splitlines() if line.startswith(("link probe", "link file"))),
        flush=True,
    )
    return 0


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: every option is a --flag")
    with cli.errors_to_exit():
        return {METHODS: methods, HOSTS: hosts, EMULATED: emulated}[FLAGS.mode]()


def run():
    scripts.run(main)


if __name__ == "__main__":
    run()
