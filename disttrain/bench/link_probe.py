"""How close transports get to an emulated link's rate: plain TCP, TF's ring, an all-to-all over TF.

The bound (bound.py) counts a link at its nominal rate. No transport reaches
it: TCP over 1500-byte frames carries ~0.95 of the rate as payload, and a
framework's transport loses more to its own copies, hand-offs and waits. This
probe measures those ceilings on the same emulated hosts the benchmark uses,
with no model step around them, so that a benchmark figure "x of the bound"
can be read against what the transport alone achieves:

    tcp_ring        every host streams `bytes` to the next, plain sockets
    tcp_all_to_all  every host streams `bytes` split over all the others
    tf_ring         TF's collective all-reduce (ring) of a float32 tensor of
                    `bytes`, `pieces` = max_subdivs
    tf_all_to_all   a reduce-scatter then all-gather of the same tensor built
                    from queues on each host, over TF's gRPC transfers, in
                    `pieces` pipelined pieces

Each method's link time is what its busiest link must carry at the nominal
rate: `bytes` for tcp_*, 2(N-1)/N x `bytes` for tf_* (the ring's count, which
the all-to-all matches). share = link time / measured time of the round (the
slowest host's), per timed round. Needs root (network namespaces).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import threading

from disttrain.bench import bound as bound_lib
from disttrain.bench import netem
from disttrain.plan import traffic

METHODS = ("tcp_ring", "tcp_all_to_all", "tf_ring", "tf_all_to_all")
TASK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_task.py")


@dataclasses.dataclass(frozen=True)
class Result:
    method: str
    pieces: int
    seconds: list[float]  # per timed round, the slowest host's
    link_seconds: float  # the busiest link's bytes at the nominal rate

    @property
    def shares(self) -> list[float]:
        return [self.link_seconds / t for t in self.seconds]


def link_seconds(method: str, hosts: int, nbytes: int, link_mbit: float) -> float:
    carried = nbytes if method.startswith("tcp") else traffic.ring_host_bytes(hosts, nbytes)
    return carried / bound_lib.link_rate_bytes(link_mbit)


def measure(
    hosts: netem.EmulatedHosts,
    method: str,
    nbytes: int,
    pieces: int = 1,
    repeats: int = 3,
    timeout: float = 600,
) -> Result:
    """One method on every host at once; `repeats` timed rounds; all killed after `timeout` s."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}: expected one of {', '.join(METHODS)}")
    n = hosts.num_hosts
    addrs = ",".join(hosts.address(i) for i in range(n))
    argv = [addrs, method, str(nbytes), str(pieces), str(repeats)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    # Errors to files, not pipes: a full pipe would block a task.
    errs = [tempfile.TemporaryFile("w+") for _ in range(n)]
    procs = [
        hosts.popen(
            i,
            [sys.executable, TASK, str(i), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errs[i],
            text=True,
            env=env,
        )
        for i in range(n)
    ]
    # A task waiting for a dead peer would wait for ever: past `timeout`, all are killed.
    watchdog = threading.Timer(timeout, lambda: [p.kill() for p in procs])
    watchdog.start()
    try:
        for step in ("ready", "seconds"):
            lines = [p.stdout.readline().split() for p in procs]
            if any(not line or line[0] != step for line in lines):
                for p in procs:
                    p.kill()
                    p.wait()
                tails = []
                for err in errs:
                    err.seek(0)
                    tails += err.read().strip().splitlines()[-1:]
                raise RuntimeError(f"probe {method}: a host did not answer {step!r}: {tails}")
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
        for p in procs:
            p.wait()
    finally:
        watchdog.cancel()
        for p in procs:
            if p.poll() is None:
                p.kill()
        for err in errs:
            err.close()
    per_host = [[float(t) for t in line[1].split(",")] for line in lines]
    slowest = [max(times) for times in zip(*per_host, strict=True)]
    return Result(method, pieces, slowest, link_seconds(method, n, nbytes, hosts.link_mbit))


def format_result(r: Result) -> str:
    shares = r.shares
    pieces = f" pieces={r.pieces}" if r.method.startswith("tf") else ""
    return (
        f"{r.method + pieces:24s} link {r.link_seconds:6.3f} s  rounds "
        + " ".join(f"{t:6.3f}" for t in r.seconds)
        + f" s  share best {max(shares):.3f}, mean {len(shares) / sum(1 / s for s in shares):.3f}"
    )
