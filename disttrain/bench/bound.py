"""The physical bound on data-parallel throughput: link bytes per step and compute time.

Pure functions on numbers (no TensorFlow), used by the benchmark to say how far
a measured run is from what its hosts and links could do at best.

Symbols:

    S  model bytes: the trainable variables, which every replica step reads
       whole and for which it produces a gradient of the same size
    N  workers (replicas), one per host
    P  parameter-server tasks
    B  link rate per host per direction, bytes/s (full duplex: a host can send
       and receive B at once; tbf shapes each direction separately)
    C  compute time of one replica step (one batch), measured by one process
       training alone at the same batch

A *round* is one step of every worker: N replica steps. In synchronous
training a round is one global step; in asynchronous training at equal worker
rates it is N global steps (the global step counts every worker's step). The
bound assumes equal worker rates, which is why async runs are measured as
N x the slowest worker (metrics.async_throughput): a run whose workers are
unequal is worth only what its slowest worker keeps up with.

Bytes each host link carries per round, each way (the same both ways: every
byte of variables pulled is matched by a byte of gradient pushed):

- dedicated PS hosts (N worker hosts, P PS hosts, variables balanced S/P per
  PS): a worker pulls S (in) and pushes S (out) per step, so a worker link
  carries S. Each PS sends its S/P to, and receives S/P from, each of the N
  workers, so a PS link carries N*S/P.

- colocated PS (PS j on worker host j, P <= N): worker j finds S/P of the
  variables on its own host, so its link carries S - S/P of its own pull and
  push. PS j serves the N - 1 other workers S/P each: (N-1)*S/P. A host with
  a PS thus carries S - S/P + (N-1)*S/P = S + (N-2)*S/P; a host without one
  carries S. For P = N this is S + (N-2)*S/N = 2S(N-1)/N, as for ring
  all-reduce, and 0 for N = 1 (everything is local).

- ring all-reduce (no PS): reduce-scatter then all-gather, each of N-1 steps
  moving S/N per host per direction: 2S(N-1)/N each way, 0 for N = 1.

With communication overlapped with compute, a round takes at least

    T = max(C, busiest link's bytes per round / B)

(every worker computes its step in parallel, so compute contributes C once
per round). The bound on throughput is N / T replica steps per second; in
async terms that is, per global step, min over links of B / (bytes the link
carries per global step), capped by N / C. Bound step time / measured step
time is the efficiency against the bound. With B unlimited (loopback) the
bound is N / C: N x one process alone, the ideal line.

Not in the bound: per-message and header overhead (TCP goodput is ~0.95 of a
tbf link's rate, so a network-bound run cannot exceed ~0.95), imbalance
between PS tasks (reported separately: the bound is for the balanced layout),
CPU that the transfers themselves cost, and hosts sharing one machine's cores
(emulated hosts do: see the report's `cpus`).
"""

from __future__ import annotations

import dataclasses
import math

DEDICATED, COLOCATED, RING = "dedicated", "colocated", "ring"
LAYOUTS = (DEDICATED, COLOCATED, RING)


def link_rate_bytes(link_mbit: float | None) -> float:
    """Bytes per second per direction of a link of `link_mbit` Mbit/s (None: unlimited)."""
    if link_mbit is None:
        return math.inf
    if not link_mbit > 0:
        raise ValueError(f"link_mbit must be > 0, got {link_mbit!r}")
    return link_mbit * 1e6 / 8


@dataclasses.dataclass(frozen=True)
class LinkLoad:
    """One kind of host in a layout: how many there are and what each link carries."""

    role: str  # "worker", "ps", "worker+ps"
    hosts: int
    bytes_per_round: float  # each way, per round (one step of every worker)


def _check(layout: str, model_bytes: float, workers: int, ps: int) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if workers < 1:
        raise ValueError(f"need at least 1 worker, got {workers}")
    if model_bytes < 0:
        raise ValueError(f"model_bytes must be >= 0, got {model_bytes}")
    if layout == RING and ps != 0:
        raise ValueError(f"ring all-reduce has no PS tasks, got ps={ps}")
    if layout != RING and ps < 1:
        raise ValueError(f"layout {layout!r} needs at least 1 PS task, got {ps}")
    if layout == COLOCATED and ps > workers:
        raise ValueError(f"colocated PS needs ps <= workers (one PS per worker host), got {ps} > {workers}")


def link_loads(layout: str, model_bytes: float, workers: int, ps: int) -> list[LinkLoad]:
    """Every kind of host link in `layout` and its bytes per round each way (see module doc)."""
    _check(layout, model_bytes, workers, ps)
    s, n, p = float(model_bytes), workers, ps
    if layout == DEDICATED:
        return [LinkLoad("worker", n, s), LinkLoad("ps", p, n * s / p)]
    if layout == COLOCATED:
        loads = [LinkLoad("worker+ps", p, s + (n - 2) * s / p)]
        if n > p:
            loads.append(LinkLoad("worker", n - p, s))
        return loads
    return [LinkLoad("worker", n, 2 * s * (n - 1) / n)]


def busiest_bytes_per_round(layout: str, model_bytes: float, workers: int, ps: int) -> float:
    return max(load.bytes_per_round for load in link_loads(layout, model_bytes, workers, ps))


def least_bytes_per_round(layout: str, model_bytes: float, workers: int, ps: int) -> float:
    return min(load.bytes_per_round for load in link_loads(layout, model_bytes, workers, ps))


@dataclasses.dataclass(frozen=True)
class Bound:
    """The best a layout can do: round time, throughput and what limits it."""

    compute_time: float  # C, seconds per replica step
    comm_time: float  # busiest link's bytes per round / B, seconds
    round_time: float  # max(C, comm_time)
    steps_per_sec: float  # replica steps (batches) per second, whole cluster: N / round_time
    limited_by: str  # "compute" or "network"
    busiest_bytes_per_round: float


def bound(
    layout: str,
    model_bytes: float,
    workers: int,
    ps: int,
    link_bytes_per_sec: float,
    compute_time: float,
) -> Bound:
    """The physical bound of `layout` (see the module docstring for the derivation).

    `link_bytes_per_sec` is B (math.inf for no limit), `compute_time` is C.
    """
    if not compute_time > 0:
        raise ValueError(f"compute_time must be > 0, got {compute_time!r}")
    if not link_bytes_per_sec > 0:
        raise ValueError(f"link_bytes_per_sec must be > 0, got {link_bytes_per_sec!r}")
    busiest = busiest_bytes_per_round(layout, model_bytes, workers, ps)
    comm = busiest / link_bytes_per_sec  # 0 when unlimited
    round_time = max(compute_time, comm)
    return Bound(
        compute_time=compute_time,
        comm_time=comm,
        round_time=round_time,
        steps_per_sec=workers / round_time,
        limited_by="network" if comm > compute_time else "compute",
        busiest_bytes_per_round=busiest,
    )


def global_steps_per_round(workers: int, synchronous: bool) -> int:
    """Global steps in one round: 1 when synchronous, N when every worker's step counts."""
    return 1 if synchronous else workers


def efficiency(measured_steps_per_sec: float, bound_steps_per_sec: float) -> float:
    """Measured throughput over the bound (= bound step time / measured step time)."""
    return measured_steps_per_sec / bound_steps_per_sec if bound_steps_per_sec > 0 else 0.0
