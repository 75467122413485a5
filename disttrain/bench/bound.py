"""The physical bound on data-parallel throughput: link bytes per step and compute time.

Pure functions on numbers (no TensorFlow), used by the benchmark to say how far
a measured run is from what its hosts and links could do at best.

Symbols:

    D  dense bytes: the trainable variables other than embedding tables, which
       every replica step reads whole and for which it produces a gradient of
       the same size
    R  row bytes per replica step: the embedding tables' rows one step looks
       up, each distinct row once (a step deduplicates its ids), with its int64
       index: sum over tables of rows x (row bytes + 8). A step pulls these
       rows and pushes a sparse gradient of the same rows. 0 for a model
       without tables; the tables' other rows never move
    S  D + R: what one replica step pulls, and pushes, through the PS
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
byte of variables or rows pulled is matched by a byte of gradient pushed):

- dedicated PS hosts (N worker hosts, P PS hosts, variables balanced S/P per
  PS): a worker pulls S (in) and pushes S (out) per step, so a worker link
  carries S. Each PS sends its S/P to, and receives S/P from, each of the N
  workers, so a PS link carries N*S/P.

- colocated PS (PS j on worker host j, P <= N): worker j finds S/P of the
  variables on its own host, so its link carries S - S/P of its own pull and
  push. PS j serves the N - 1 other workers S/P each: (N-1)*S/P. A host with
  a PS thus carries S - S/P + (N-1)*S/P = S + (N-2)*S/P; a host without one
  carries S. For P = N this is S + (N-2)*S/N = 2S(N-1)/N, as for ring
  all-reduce of a dense model, and 0 for N = 1 (everything is local).

  Both PS layouts count the rows as spread over the PS tasks as evenly as the
  dense bytes (S/P per PS): tables are split by rows, so that holds when the
  looked-up ids are spread over each table's rows, not when they crowd into
  the rows one PS holds.

- ring all-reduce (no PS): the dense gradients by reduce-scatter then
  all-gather, each of N-1 steps moving D/N per host per direction:
  2D(N-1)/N each way. The sparse gradients by an all-gather of (indices,
  values): each host receives the other N-1 replicas' R, and sends N-1
  blocks of R to the next host in the ring (its own and the N-2 it passes
  on): (N-1)*R each way. In all: 2D(N-1)/N + (N-1)*R each way, 0 for N = 1.
  Unlike a dense all-reduce, the rows' share grows with N: past a few hosts
  the gathered rows, not the dense bytes, load the link. A table whose
  gradient a strategy sends dense instead (SyncAllReduce does below
  `densify_below_bytes`) moves as D, which R does not know.

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
step (R is a mean over batches: `runner.model_bytes` measures it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

DEDICATED, COLOCATED, RING = "dedicated", "colocated", "ring"
LAYOUTS = (DEDICATED, COLOCATED, RING)


def link_rate_bytes(link_mbit: float | None) -> float:
    """Bytes per second per direction of a link of `link_mbit` Mbit/s (None: unlimited)."""
    if link_mbit is None:
        return math.inf
    if not link_mbit > 0:
        raise ValueError(f"link_mbit must be > 0, got {link_mbit!r}")
    return link_mbit * 1e6 / 8


INDEX_BYTES = 8  # the int64 index that travels with every looked-up row and its gradient


@dataclasses.dataclass(frozen=True)
class Table:
    """An embedding table and what one replica step reads of it."""

    name: str
    nbytes: int  # the whole table
    row_bytes: int  # one row
    rows_per_step: float  # distinct rows one replica step looks up (a mean over batches)

    @property
    def bytes_per_step(self) -> float:
        """This table's part of R: rows x (row bytes + the int64 index)."""
        return self.rows_per_step * (self.row_bytes + INDEX_BYTES)

    @property
    def fraction_per_step(self) -> float:
        """The share of the table's rows one step touches."""
        return self.rows_per_step * self.row_bytes / self.nbytes if self.nbytes else 0.0


@dataclasses.dataclass(frozen=True)
class ModelBytes:
    """A model's bytes as a replica step moves them: D whole, the tables by their rows."""

    dense: int  # D: trainable variables other than the tables
    tables: tuple[Table, ...] = ()

    @property
    def sparse(self) -> float:
        """R: bytes of rows (with their indices) one replica step pulls, and pushes as a gradient."""
        return sum(t.bytes_per_step for t in self.tables)

    @property
    def table_bytes(self) -> int:
        return sum(t.nbytes for t in self.tables)

    @property
    def total(self) -> int:
        """All trainable bytes, tables whole (what a step would move if it read the tables whole)."""
        return self.dense + self.table_bytes

    @property
    def table_fraction_per_step(self) -> float:
        """The share of all the tables' bytes one step looks up (indices not counted)."""
        looked_up = sum(t.rows_per_step * t.row_bytes for t in self.tables)
        return looked_up / self.table_bytes if self.table_bytes else 0.0


@dataclasses.dataclass(frozen=True)
class LinkLoad:
    """One kind of host in a layout: how many there are and what each link carries."""

    role: str  # "worker", "ps", "worker+ps"
    hosts: int
    bytes_per_round: float  # each way, per round (one step of every worker)


def _check(layout: str, dense_bytes: float, sparse_bytes: float, workers: int, ps: int) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if workers < 1:
        raise ValueError(f"need at least 1 worker, got {workers}")
    if dense_bytes < 0:
        raise ValueError(f"dense_bytes must be >= 0, got {dense_bytes}")
    if sparse_bytes < 0:
        raise ValueError(f"sparse_bytes must be >= 0, got {sparse_bytes}")
    if layout == RING and ps != 0:
        raise ValueError(f"ring all-reduce has no PS tasks, got ps={ps}")
    if layout != RING and ps < 1:
        raise ValueError(f"layout {layout!r} needs at least 1 PS task, got {ps}")
    if layout == COLOCATED and ps > workers:
        raise ValueError(f"colocated PS needs ps <= workers (one PS per worker host), got {ps} > {workers}")


def ps_host_bytes(
    workers_per_host: Sequence[int], ps_host: Sequence[int], per_ps_bytes: Sequence[float]
) -> list[float]:
    """Each host's link bytes per round, each way, in a PS layout of any shape.

    `workers_per_host[h]`: workers on host h (k_h); `ps_host[j]`: the host of PS
    task j; `per_ps_bytes[j]`: what one worker step pulls from PS j, and pushes
    back to it (s_j; balanced placement: S/P each). With W workers in all and
    F_h the bytes of the PS tasks on host h, host h's link carries its own
    workers' traffic with the other hosts' PS, k_h (S - F_h), and its PS tasks'
    traffic with the other hosts' workers, (W - k_h) F_h, each way. The layouts
    of `link_loads` are special cases; the planner (disttrain.plan) gives it
    several workers per host, several PS per host, and unequal PS.
    """
    if len(ps_host) != len(per_ps_bytes):
        raise ValueError(f"{len(ps_host)} PS hosts but {len(per_ps_bytes)} PS byte counts")
    if any(not 0 <= h < len(workers_per_host) for h in ps_host):
        raise ValueError(f"a PS host is out of range: {list(ps_host)} for {len(workers_per_host)} hosts")
    total_workers = sum(workers_per_host)
    total = float(sum(per_ps_bytes))
    on_host = [0.0] * len(workers_per_host)
    for h, s in zip(ps_host, per_ps_bytes, strict=True):
        on_host[h] += s
    return [k * (total - f) + (total_workers - k) * f for k, f in zip(workers_per_host, on_host, strict=True)]


def ring_host_bytes(workers: int, dense_bytes: float, sparse_bytes: float = 0.0) -> float:
    """A ring all-reduce host link's bytes per round, each way: 2D(N-1)/N + (N-1)R (module doc).

    `workers` are the ring's members, one per host; with several members on a
    host, only its one outgoing ring edge crosses its link, which carries the same.
    """
    n = workers
    return 2 * dense_bytes * (n - 1) / n + (n - 1) * sparse_bytes


def link_loads(
    layout: str, dense_bytes: float, workers: int, ps: int, sparse_bytes: float = 0.0
) -> list[LinkLoad]:
    """Every kind of host link in `layout` and its bytes per round each way (see module doc).

    `dense_bytes` is D, `sparse_bytes` R (0: a model without tables, whose D is all its bytes).
    """
    _check(layout, dense_bytes, sparse_bytes, workers, ps)
    d, r, n, p = float(dense_bytes), float(sparse_bytes), workers, ps
    if layout == RING:
        return [LinkLoad("worker", n, ring_host_bytes(n, d, r))]
    share = [(d + r) / p] * p
    if layout == DEDICATED:
        hosts = ps_host_bytes([1] * n + [0] * p, [n + j for j in range(p)], share)
        return [LinkLoad("worker", n, hosts[0]), LinkLoad("ps", p, hosts[n])]
    hosts = ps_host_bytes([1] * n, list(range(p)), share)  # colocated: PS j on worker j's host
    loads = [LinkLoad("worker+ps", p, hosts[0])]
    if n > p:
        loads.append(LinkLoad("worker", n - p, hosts[p]))
    return loads


def busiest_bytes_per_round(
    layout: str, dense_bytes: float, workers: int, ps: int, sparse_bytes: float = 0.0
) -> float:
    return max(x.bytes_per_round for x in link_loads(layout, dense_bytes, workers, ps, sparse_bytes))


def least_bytes_per_round(
    layout: str, dense_bytes: float, workers: int, ps: int, sparse_bytes: float = 0.0
) -> float:
    return min(x.bytes_per_round for x in link_loads(layout, dense_bytes, workers, ps, sparse_bytes))


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
) -> Bound:
    """The physical bound of `layout` (see the module docstring for the derivation).

    `dense_bytes` is D, `sparse_bytes` R, `link_bytes_per_sec` B (math.inf
    for no limit), `compute_time` C.
    """
    if not compute_time > 0:
        raise ValueError(f"compute_time must be > 0, got {compute_time!r}")
    if not link_bytes_per_sec > 0:
        raise ValueError(f"link_bytes_per_sec must be > 0, got {link_bytes_per_sec!r}")
    busiest = busiest_bytes_per_round(layout, dense_bytes, workers, ps, sparse_bytes)
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
