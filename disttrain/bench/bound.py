"""The physical bound on data-parallel throughput: link bytes per step and compute time.

Pure functions on numbers (no graph, no session), used by the benchmark to say how far
a measured run is from what its hosts and links could do at best.

D, R, S, N, P, B and C, rounds, and the bytes each host link carries per
round in each layout are defined in `disttrain.plan.traffic`, which the planner
shares.

With communication overlapped with compute, a round takes at least

    T = max(C, busiest link's bytes per round / B)

(every worker computes its step in parallel, so compute contributes C once
per round). The bound on throughput is N / T replica steps per second; in
async terms that is, per global step, min over links of B / (bytes the link
carries per global step), capped by N / C. Bound step time / measured step
time is the efficiency against the bound. With B unlimited (loopback) the
bound is N / C: N x one process alone, the ideal line.

Not in the bound: per-message and header overhead (plain TCP carries
0.95-0.96 of a tbf link's rate as payload, TF's ring all-reduce 0.85-0.90 on
4 hosts: link_probe.py measures both, so a network-bound run cannot exceed
about those), imbalance
between PS tasks (reported separately: the bound is for the balanced layout),
CPU that the transfers themselves cost, hosts sharing one machine's cores
(emulated hosts do: see the report's `cpus`), and R's variation from step to
step (R is a mean over batches: `traffic.model_bytes` measures it).
"""

from __future__ import annotations

import dataclasses
import math

from disttrain.plan.traffic import busiest_bytes_per_round


def link_mbit_for_ratio(nbytes: float, step_secs: float, ratio: float) -> float:
    """The link rate (Mbit/s each way) that moves `nbytes` in `ratio` x a step of `step_secs`.

    A case defined by its link-to-compute ratio means the same on a machine
    of any speed: seed 000's 1 GbE moved its CIFAR-10 model's bytes in about
    one step of its GPU (ratio 1.0), whatever that step took.
    """
    if not (nbytes > 0 and step_secs > 0 and ratio > 0):
        raise ValueError(f"need bytes, a step and a ratio > 0, got {nbytes!r}, {step_secs!r}, {ratio!r}")
    return nbytes * 8 / (ratio * step_secs) / 1e6


def link_rate_bytes(link_mbit: float | None) -> float:
    """Bytes per second per direction of a link of `link_mbit` Mbit/s (None: unlimited)."""
    if link_mbit is None:
        return math.inf
    if not link_mbit > 0:
        raise ValueError(f"link_mbit must be > 0, got {link_mbit!r}")
    return link_mbit * 1e6 / 8


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
    dense_bytes: float,
    workers: int,
    ps: int,
    link_bytes_per_sec: float,
    compute_time: float,
    sparse_bytes: float = 0.0,
    dense_over_ring: bool = False,
) -> Bound:
    """The physical bound of `layout` (see the module docstring for the derivation).

    `dense_bytes` is D, `sparse_bytes` R, `link_bytes_per_sec` B (math.inf
    for no limit), `compute_time` C; `dense_over_ring`: as `traffic.link_loads`.
    """
    if not compute_time > 0:
        raise ValueError(f"compute_time must be > 0, got {compute_time!r}")
    if not link_bytes_per_sec > 0:
        raise ValueError(f"link_bytes_per_sec must be > 0, got {link_bytes_per_sec!r}")
    busiest = busiest_bytes_per_round(layout, dense_bytes, workers, ps, sparse_bytes, dense_over_ring)
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
