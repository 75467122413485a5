"""Traffic: what crosses each host link per step, for a layout and a model. Shared arithmetic.

The benchmark's bound (`bench.bound`) and the planner's cost model
(`plan.cost`) both count bytes per link with these functions; neither
imports the other for them. Two parts:

- pure functions on numbers: the bytes each host link carries per round in
  a PS layout of any shape (`ps_host_bytes`) or a ring (`ring_host_bytes`),
  and in the benchmark's three layouts (`link_loads`);
- a model's bytes (`model_bytes`): D and R read from a config's model,
  built in a scratch graph, and its input pipeline (no server, no training).

It does not say how long a step takes: that is `bench.bound` (the
physical bound) and `plan.cost` (a model of the step).

Symbols:

    D  dense bytes: the trainable variables other than embedding tables, which
       every replica step reads whole and for which it produces a gradient of
       the same size
    R  row bytes per replica step: the embedding tables' rows one step looks
       up, each distinct row once (a step deduplicates its ids), with its int64
       index: sum over tables of rows x (row bytes + 8). A step pulls these
       rows and pushes a sparse gradient of the same rows. 0 for a model
       without tables; the tables' other rows never move
    D and R count float32 values. A strategy with a 16-bit `transfer_dtype`
    sends half of D and of the rows' values (`ModelBytes.on_wire`).
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
  gradient a strategy sends dense instead (SyncAllReduce and SyncHybrid do below
  `densify_below_bytes`) moves as D, which R does not know.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tensorflow as tf

from disttrain.base.config import TrainConfig
from disttrain.base.errors import ConfigError
from disttrain.graph import placement

v1 = tf.compat.v1

DEDICATED, COLOCATED, RING = "dedicated", "colocated", "ring"
LAYOUTS = (DEDICATED, COLOCATED, RING)

INDEX_BYTES = 8  # the int64 index that travels with every looked-up row and its gradient
FLOAT32_BYTES = 4  # a model's variables, as D and R count them


def transfer_itemsize(strategy) -> int:
    """Bytes a built strategy sends per float32 value: its `transfer_dtype`'s size (16 bits: 2), else 4."""
    dtype = getattr(strategy, "transfer_dtype", None)
    return dtype.size if dtype is not None else FLOAT32_BYTES


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

    def on_wire(self, itemsize: int) -> ModelBytes:
        """These bytes as a strategy sends them with floats of `itemsize` bytes (2: 16-bit transfer).

        D and the rows' values scale by itemsize / 4; each row's int64 index
        does not. Assumes float32 variables, as the zoo's are.
        """
        if itemsize == FLOAT32_BYTES:
            return self
        scale = itemsize / FLOAT32_BYTES
        tables = tuple(
            dataclasses.replace(t, nbytes=round(t.nbytes * scale), row_bytes=round(t.row_bytes * scale))
            for t in self.tables
        )
        return ModelBytes(dense=round(self.dense * scale), tables=tables)

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
    layout: str,
    dense_bytes: float,
    workers: int,
    ps: int,
    sparse_bytes: float = 0.0,
    dense_over_ring: bool = False,
) -> list[LinkLoad]:
    """Every kind of host link in `layout` and its bytes per round each way (see module doc).

    `dense_bytes` is D, `sparse_bytes` R (0: a model without tables, whose D is all its bytes).
    `dense_over_ring` (SyncHybrid, a PS layout): the PS tasks move the rows alone, R/P each, and
    every worker host's link also carries the workers' ring of D, 2D(N-1)/N.
    """
    _check(layout, dense_bytes, sparse_bytes, workers, ps)
    d, r, n, p = float(dense_bytes), float(sparse_bytes), workers, ps
    if layout == RING:
        return [LinkLoad("worker", n, ring_host_bytes(n, d, r))]
    share = [(r if dense_over_ring else d + r) / p] * p
    ring = ring_host_bytes(n, d) if dense_over_ring else 0.0
    if layout == DEDICATED:
        hosts = ps_host_bytes([1] * n + [0] * p, [n + j for j in range(p)], share)
        return [LinkLoad("worker", n, hosts[0] + ring), LinkLoad("ps", p, hosts[n])]
    hosts = ps_host_bytes([1] * n, list(range(p)), share)  # colocated: PS j on worker j's host
    loads = [LinkLoad("worker+ps", p, hosts[0] + ring)]
    if n > p:
        loads.append(LinkLoad("worker", n - p, hosts[p] + ring))
    return loads


def busiest_bytes_per_round(
    layout: str, dense_bytes: float, workers: int, ps: int, sparse_bytes: float = 0.0, dense_over_ring=False
) -> float:
    loads = link_loads(layout, dense_bytes, workers, ps, sparse_bytes, dense_over_ring)
    return max(x.bytes_per_round for x in loads)


def least_bytes_per_round(
    layout: str, dense_bytes: float, workers: int, ps: int, sparse_bytes: float = 0.0, dense_over_ring=False
) -> float:
    loads = link_loads(layout, dense_bytes, workers, ps, sparse_bytes, dense_over_ring)
    return min(x.bytes_per_round for x in loads)


LOOKUP_BATCHES = 20  # batches over which the rows a step looks up are averaged


def model_bytes(config: TrainConfig, batches: int = LOOKUP_BATCHES) -> ModelBytes:
    """D and R: the trainable bytes a step moves whole, and the tables' rows it looks up.

    A model with embedding tables (variables its graph reads by rows) says
    which ids a batch looks up in each (`model.lookups(features)`); R is the
    mean over `batches` of the input pipeline's batches of the distinct ids
    per table, times the table's row bytes plus the 8-byte index. A table not
    in `lookups`, and every variable of a model without tables, counts whole
    in D.
    """
    with tf.Graph().as_default() as graph:
        config.model.build_variables()
        trainable = {v.op.name for v in v1.trainable_variables()}
        specs = {s.name: s for s in placement.variable_specs(graph) if s.name in trainable}
    rows = distinct_rows_per_step(config, batches) if any(s.table for s in specs.values()) else {}
    unknown = sorted(set(rows) - set(specs))
    if unknown:
        known = sorted(name for name, s in specs.items() if s.table)
        raise ConfigError(
            f"{type(config.model).__name__}.lookups names {unknown[0]!r}, which is not a trainable variable "
            f"of the model: expected the variable op name of a table, one of {', '.join(known)}"
        )
    tables = tuple(
        Table(name, specs[name].nbytes, specs[name].nbytes // specs[name].shape[0], rows[name])
        for name in sorted(rows)
    )
    dense = sum(s.nbytes for name, s in specs.items() if name not in rows)
    return ModelBytes(dense=dense, tables=tables)


def distinct_rows_per_step(config: TrainConfig, batches: int = LOOKUP_BATCHES) -> dict[str, float]:
    """Table name -> mean distinct ids one replica's batch looks up, over `batches` batches.

    Runs replica 0's input pipeline in a scratch graph and session; no model
    variable is built. Empty when `model.lookups` is.
    """
    if batches < 1:
        raise ValueError(f"batches must be >= 1, got {batches}")
    model = config.model
    with tf.Graph().as_default():
        dataset = config.input_fn(model, config.batch_size, 0, 1)
        features, _ = v1.data.make_one_shot_iterator(dataset).get_next()
        lookups = model.lookups(features)
        if not lookups:
            return {}
        distinct = {name: tf.size(tf.unique(tf.reshape(ids, [-1])).y) for name, ids in lookups.items()}
        totals = dict.fromkeys(distinct, 0)
        with v1.Session() as session:
            for _ in range(batches):
                for name, count in session.run(distinct).items():
                    totals[name] += int(count)
    return {name: total / batches for name, total in totals.items()}
