"""The planner's cost model: a cluster's step time from its shape, its links and one GPU's step.

Pure functions on numbers (no graph, no session). It carries the performance
model of docs/design.md, and what the benchmark measured on emulated hosts, to
shapes that cannot be measured here:

- bytes per host link per round (one step of every worker), each way, for
  any PS layout (workers and PS tasks on any hosts, unequal PS) or a ring
  (`traffic.ps_host_bytes`, `traffic.ring_host_bytes`, shared with
  the benchmark's bound);
- links are full duplex: a round's pushes and pulls of different workers
  share a link's two directions, so the busiest link costs its bytes once;
- what a strategy overlaps: async PS with `overlap` runs its transfers beside
  the step (push then pull, serially, in a loop; a table's rows are still
  looked up inside the step); plain async pulls before
  the step and pushes during backprop; sync PS pushes during backprop and
  pulls after every replica has pushed; all-reduce sends its buckets as
  backprop makes them, one bucket's ring after another;
- per-message cost: each tensor (PS) or ring hop (all-reduce) costs
  `per_message_s` of CPU, and each dependent round trip `2 x latency`;
- gRPC's CPU: `rpc_cpu_s_per_byte` at each end of every byte (the link's and
  between tasks on one host), against what one PS task gets done at once
  (`Constants.ps_cores`), the cores a host gives its transfers, or one
  machine's cores when emulated hosts share it;
- the transport (`Strategy.transport`): its reachable share of the link, its
  cost per message or ring hop and its CPU per byte replace gRPC's (the
  default, `Constants`) for every term above;
- the host's own term (`Shape.host_bus`): the GPUs of a host sum their
  gradients over PCIe or NVLink (`host_bytes`), half of it as backprop makes
  each chunk (before that chunk leaves the host), half after the last
  transfer (the result copied back to every GPU); a ring through every GPU
  moves its bytes at the slower of the link and the bus.

What it does not model: stragglers and step-time variance, TCP's slow start
and congestion between many flows beyond `Constants.goodput`, the PS's
optimizer updates and sparse work (unique, gathers, sparse applies),
stale-gradient effects on convergence.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

from disttrain import strategies
from disttrain.base.errors import ConfigError
from disttrain.plan import traffic as traffic_lib

# The strategy kinds this model has terms for, named as the classes declare them (Strategy.kind).
ASYNC_PS = strategies.AsyncParameterServer.kind
SYNC_PS = strategies.SyncParameterServer.kind
ALLREDUCE = strategies.SyncAllReduce.kind
HYBRID = strategies.SyncHybrid.kind
STRATEGIES = (ASYNC_PS, SYNC_PS, ALLREDUCE, HYBRID)
DISTTRAIN, ROUND_ROBIN, GREEDY = "disttrain", "round_robin", "greedy"
PLACEMENTS = (DISTTRAIN, ROUND_ROBIN, GREEDY)
COLOCATED, DEDICATED = traffic_lib.COLOCATED, traffic_lib.DEDICATED
PS_HOSTS = (COLOCATED, DEDICATED)


class PlanError(ConfigError):
    """An impossible cluster or strategy; the message names it and the fix."""


@dataclasses.dataclass(frozen=True)
class Constants:
    """What the model cannot derive, each measured on this project's machine (decision 0082).

    goodput: TCP's share of a shaped link's rate (tbf counts headers too;
      tests/netem measured ~0.95).
    rpc_cpu_s_per_byte: CPU of TF's gRPC per byte at each end: 1.4 ms per MB,
      from the tasks' CPU seconds per step in the benchmark's emulated runs
      (the first design's estimate, docs/design.md: ~2).
    per_message_s: CPU per tensor sent or received over gRPC (measured here:
      1,000 small variables read in one run, ~0.26 ms each).
    forward_fraction: the forward pass's share of a step (backprop ~2x forward).
    ps_cores: cores' worth of that gRPC work one PS task gets done at once
      (None: no limit): a PS serving many workers saturates its process
      before its link. 1.4 reproduces the one-host rows of the seed's report
      (8 and 16 workers, one PS, no network: 68% and 35% efficiency; the
      model gives 61% and 37%); decision 0082.
    """

    goodput: float = 0.95
    rpc_cpu_s_per_byte: float = 1.4e-3 / 1e6
    per_message_s: float = 2.6e-4
    forward_fraction: float = 1 / 3
    ps_cores: float | None = 1.4


DEFAULTS = Constants()

GRPC = "grpc"


@dataclasses.dataclass(frozen=True)
class Transport:
    """How a strategy's bytes cross the links: what a link gives it, and what each message and byte cost.

    link_share: its share of a link's nominal rate on large transfers.
    per_message_s: per gRPC message (PS: each tensor) or ring hop (all-reduce).
    cpu_s_per_byte: CPU at each end of a byte (0: the transfer takes no core
      the model counts, as NCCL's kernels and proxy threads).
    The default (`Strategy.transport=None`) is gRPC on CPU as `Constants`
    hold it; `transports.TRANSPORTS` holds the others, each with its source.
    """

    name: str
    link_share: float
    per_message_s: float
    cpu_s_per_byte: float


@dataclasses.dataclass(frozen=True)
class HostBus:
    """What joins a host's GPUs: an all-reduce of S bytes among its k GPUs takes 2 S (k-1)/k / busbw.

    busbw is bytes per second in nccl-tests' sense (the bus bandwidth of an
    all-reduce); `transports.HOST_BUSES` holds PCIe and NVLink, with sources.
    """

    name: str
    busbw: float


def host_bytes(dense: float, gpus_per_host: int) -> float:
    """Bytes one GPU's link to the host bus carries to sum `dense` over the host's GPUs and copy it back.

    An all-reduce among k GPUs: 2 D (k-1)/k (a reduce, then the copy back).
    0 for one GPU per host.
    """
    k = gpus_per_host
    return 2 * dense * (k - 1) / k if k > 1 else 0.0


@dataclasses.dataclass(frozen=True)
class Shape:
    """A cluster: hosts, GPUs, where workers and PS tasks run, the links.

    towers: one worker per host with a tower per GPU (gradients summed on the
      host before they cross the network); False: one worker per GPU.
    ps_hosts: 'colocated' (PS j on host j mod hosts) or 'dedicated' (each PS
      on a host of its own, in addition to `hosts`).
    link_gbit: per host, each direction (full duplex); None: unlimited.
    latency_ms: one way, per message.
    host_cores: cores a host's transfers may use (None: CPU is no limit).
    shared_cores: every host shares this many cores (emulated hosts on one
      machine); compute_on_cpu: the step computes on those cores too.
    host_bus: what joins a host's GPUs (None: no term for it; one GPU per
      host needs none).
    """

    hosts: int
    gpus_per_host: int = 1
    towers: bool = True
    ps: int = 0
    ps_hosts: str = COLOCATED
    link_gbit: float | None = 10.0
    latency_ms: float = 0.0
    host_cores: float | None = None
    shared_cores: float | None = None
    compute_on_cpu: bool = False
    host_bus: HostBus | None = None

    @property
    def workers_per_host(self) -> int:
        return 1 if self.towers else self.gpus_per_host

    @property
    def workers(self) -> int:
        return self.hosts * self.workers_per_host

    @property
    def towers_per_worker(self) -> int:
        return self.gpus_per_host if self.towers else 1

    @property
    def gpus(self) -> int:
        return self.hosts * self.gpus_per_host

    def describe(self) -> str:
        per = f"{self.gpus_per_host} GPU(s) per host" + (
            ", one worker per host with a tower per GPU" if self.towers else ", one worker per GPU"
        )
        ps = "no PS" if not self.ps else f"{self.ps} PS {self.ps_hosts}"
        link = "unlimited links" if self.link_gbit is None else f"{self.link_gbit:g} Gbit/s links"
        lat = f", {self.latency_ms:.3g} ms latency" if self.latency_ms else ""
        bus = f", GPUs joined by {self.host_bus.name}" if self.host_bus and self.gpus_per_host > 1 else ""
        return f"{self.hosts} host(s), {per}, {ps}, {link}{lat}{bus}"


@dataclasses.dataclass(frozen=True)
class Strategy:
    """A replica strategy and its settings, as the cost model sees it."""

    kind: str = ASYNC_PS
    overlap: bool = False  # AsyncParameterServer(overlap=True)
    piece_bytes: int | None = None  # PS strategies: variables cut into pieces moved in waves
    bucket_bytes: int = 4 * 2**20  # SyncAllReduce
    transfer_bits: int = 32  # 16: bfloat16/float16 on the wire
    backup_workers: int = 0  # SyncParameterServer
    densify_below_bytes: int = 2**18  # SyncAllReduce, SyncHybrid: tables this small are summed densely
    placement: str = DISTTRAIN  # or TF 1's round robin (replica_device_setter) or greedy by bytes
    transport: Transport | None = None  # None: gRPC on CPU, as Constants hold it

    @property
    def uses_ps(self) -> bool:
        """As the strategy class of this kind declares it (`Strategy.uses_ps`)."""
        return _declared(self.kind, "uses_ps")

    @property
    def synchronous(self) -> bool:
        """As the strategy class of this kind declares it (`Strategy.synchronous`)."""
        return _declared(self.kind, "synchronous")

    def describe(self) -> str:
        parts = [self.kind]
        if self.kind == ASYNC_PS and self.overlap:
            parts.append("overlap")
        if self.uses_ps and self.piece_bytes:
            parts.append(f"{self.piece_bytes / 2**20:g} MiB pieces")
        if self.kind in (ALLREDUCE, HYBRID):
            parts.append(f"{self.bucket_bytes / 2**20:g} MiB buckets")
        if self.transfer_bits == 16:
            parts.append("16-bit transfer")
        if self.backup_workers:
            parts.append(f"{self.backup_workers} backup worker(s)")
        if self.uses_ps:
            parts.append(f"{self.placement} placement")
        parts.append(f"over {self.transport.name if self.transport else GRPC}")
        return ", ".join(parts)


@functools.cache
def _declared(kind: str, attribute: str) -> bool:
    cls = strategies.by_kind().get(kind)
    if cls is None:
        raise PlanError(f"unknown strategy {kind!r}: expected one of {', '.join(STRATEGIES)}")
    return bool(getattr(cls, attribute))


@dataclasses.dataclass(frozen=True)
class PsLayout:
    """How a placement spreads a model over P PS tasks.

    shares[j]: PS j's part of the dense bytes a step moves; tensors[j]: the
    pieces on it (one message each per pull and per push); balance: the
    placement's busiest PS over the mean, all variable bytes counted (as the
    chief's placement report gives it).
    """

    shares: tuple[float, ...]
    tensors: tuple[int, ...]
    balance: float


@dataclasses.dataclass(frozen=True)
class Model:
    """What a step moves: D dense bytes whole, R bytes of table rows; one GPU's step time.

    `layout(P, placement)` gives the PS layout; `tensors` is the number of
    trainable pieces unsplit (all-reduce fuses them into buckets).
    """

    name: str
    dense_bytes: float
    step_time: float  # C: one GPU's step at `batch_size`, seconds
    batch_size: int
    layout: Callable[[int, str], PsLayout]
    tensors: int
    sparse_bytes: float = 0.0
    # Per embedding table: (its bytes whole, its part of R). A ring strategy sums a table of at most
    # `Strategy.densify_below_bytes` whole with the dense bytes, and moves no rows of it.
    tables: tuple[tuple[float, float], ...] = ()
    compute_cpu: float | None = None  # CPU seconds a step's compute takes when on the CPU (None: step_time)

    def replace(self, **changes) -> Model:
        return dataclasses.replace(self, **changes)


def even_layout(tensors: int) -> Callable[[int, str], PsLayout]:
    """A model of `tensors` equal pieces: every placement balances it exactly (tests, quick sketches)."""

    def layout(ps: int, placement: str) -> PsLayout:
        del placement
        counts = [tensors // ps + (j < tensors % ps) for j in range(ps)]
        return PsLayout(tuple(c / tensors for c in counts), tuple(counts), max(counts) * ps / tensors)

    return layout


@dataclasses.dataclass(frozen=True)
class Link:
    host: int
    roles: str  # "worker0-7+ps0"
    bytes_per_round: float  # each way


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The predicted run: per-link bytes, time terms, throughput and what limits it."""

    shape: Shape
    strategy: Strategy
    model: str
    links: tuple[Link, ...]
    ps_balance: float | None
    terms: dict  # seconds per round, by name: compute, worker path, busiest link, CPU, ...
    round_time: float  # seconds per round (one step of every worker)
    examples_per_sec: float
    replica_steps_per_sec: float  # batches per second, whole cluster
    efficiency: float  # against N x one GPU alone
    bottleneck: str

    @property
    def busiest_link(self) -> Link:
        return max(self.links, key=lambda link: link.bytes_per_round)

    @property
    def mean_link_bytes(self) -> float:
        return sum(x.bytes_per_round for x in self.links) / len(self.links) if self.links else 0.0

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "cluster": dataclasses.asdict(self.shape) | {"workers": self.shape.workers},
            "strategy": dataclasses.asdict(self.strategy),
            "busiest_link": {"host": self.busiest_link.host, "roles": self.busiest_link.roles}
            if self.links
            else None,
            "busiest_link_bytes_per_round": self.busiest_link.bytes_per_round if self.links else 0.0,
            "mean_link_bytes_per_round": self.mean_link_bytes,
            "links": [dataclasses.asdict(x) for x in self.links],
            "ps_balance": self.ps_balance,
            "terms_seconds": self.terms,
            "round_time_seconds": self.round_time,
            "examples_per_sec": self.examples_per_sec,
            "replica_steps_per_sec": self.replica_steps_per_sec,
            "scaling_efficiency": self.efficiency,
            "bottleneck": self.bottleneck,
        }


def check(shape: Shape, strategy: Strategy) -> None:
    """Raise PlanError naming the first impossible setting and how to fix it."""
    if shape.hosts < 1:
        raise PlanError(f"hosts={shape.hosts}: a cluster needs at least 1 host")
    if shape.gpus_per_host < 1:
        raise PlanError(f"gpus_per_host={shape.gpus_per_host}: need at least 1 GPU per host")
    if strategy.kind not in STRATEGIES:
        raise PlanError(f"unknown strategy {strategy.kind!r}: expected one of {', '.join(STRATEGIES)}")
    if strategy.placement not in PLACEMENTS:
        raise PlanError(f"unknown placement {strategy.placement!r}: expected one of {', '.join(PLACEMENTS)}")
    if shape.ps_hosts not in PS_HOSTS:
        raise PlanError(f"ps_hosts={shape.ps_hosts!r}: expected one of {', '.join(PS_HOSTS)}")
    if strategy.uses_ps and shape.ps < 1:
        raise PlanError(f"{strategy.kind} needs at least 1 PS task: set ps >= 1, or use allreduce")
    if not strategy.uses_ps and shape.ps:
        raise PlanError(f"allreduce has no PS tasks, got ps={shape.ps}: set ps=0")
    if shape.link_gbit is not None and not shape.link_gbit > 0:
        raise PlanError(f"link_gbit={shape.link_gbit}: must be > 0 (None for unlimited)")
    if shape.latency_ms < 0:
        raise PlanError(f"latency_ms={shape.latency_ms}: must be >= 0")
    if strategy.transfer_bits not in (16, 32):
        raise PlanError(f"transfer_bits={strategy.transfer_bits}: expected 16 or 32")
    if strategy.bucket_bytes < 1:
        raise PlanError(f"bucket_bytes={strategy.bucket_bytes}: must be >= 1")
    if strategy.kind == SYNC_PS and not 0 <= strategy.backup_workers < shape.workers:
        raise PlanError(
            f"backup_workers={strategy.backup_workers} out of range: {shape.workers} worker(s), "
            f"so between 0 and {shape.workers - 1}"
        )
    if strategy.uses_ps and strategy.transport is not None and strategy.transport.name != GRPC:
        raise PlanError(
            f"{strategy.kind} moves variables over gRPC, got transport {strategy.transport.name!r}: "
            f"use transport {GRPC!r}, or allreduce for NCCL"
        )
    if strategy.transport is not None and not 0 < strategy.transport.link_share <= 1:
        raise PlanError(f"transport link_share={strategy.transport.link_share}: must be in (0, 1]")
    if shape.host_bus is not None and not shape.host_bus.busbw > 0:
        raise PlanError(f"host_bus busbw={shape.host_bus.busbw}: must be > 0 (None: no host term)")
    for name in ("host_cores", "shared_cores"):
        value = getattr(shape, name)
        if value is not None and not value > 0:
            raise PlanError(f"{name}={value}: must be > 0 (None: no CPU limit)")


def _hosts(shape: Shape) -> tuple[list[int], list[int], list[str]]:
    """Workers per host, the host of each PS task, and each host's roles."""
    k, hosts = shape.workers_per_host, shape.hosts
    workers = [k] * hosts
    if shape.ps and shape.ps_hosts == DEDICATED:
        ps_host = [hosts + j for j in range(shape.ps)]
        workers += [0] * shape.ps
    else:
        ps_host = [j % hosts for j in range(shape.ps)]
    roles = []
    for h, count in enumerate(workers):
        parts = []
        if count:
            parts.append(f"worker{h * k}" + (f"-{h * k + count - 1}" if count > 1 else ""))
        ps = [j for j, at in enumerate(ps_host) if at == h]
        if ps:
            parts.append("ps" + ",".join(str(j) for j in ps))
        roles.append("+".join(parts))
    return workers, ps_host, roles


def pipelined(forward: float, backward: float, comm: float, chunks: int, per_chunk: float) -> float:
    """Time from a step's start until the last of `chunks` transfers, each sent once backprop made it.

    Chunk i is ready at forward + backward * (i+1)/chunks and takes comm/chunks
    + per_chunk; one chunk at a time (disttrain chains its all-reduce buckets).
    """
    done = 0.0
    for i in range(chunks):
        ready = forward + backward * (i + 1) / chunks
        done = max(done, ready) + comm / chunks + per_chunk
    return done


@dataclasses.dataclass(frozen=True)
class Traffic:
    """What crosses each host's link and its processes in one round (bytes each way, messages)."""

    link: list[float]  # per host: bytes each way over its link
    local: list[float]  # per host: bytes each way between tasks on the host (no link, still gRPC)
    remote: float  # one worker's bytes each way over its own link (the worst host's)
    rows_remote: float  # of which table rows (a step looks them up inside itself, even with overlap)
    phase: float  # bytes on the busiest direction of any link while every worker pushes (or pulls)
    messages: list[float]  # per host: gRPC messages its processes handle
    ps_work: list[float]  # per PS task: CPU seconds of its own end of every byte and message
    chunks: int  # transfers a step sends as backprop makes them (PS pieces, all-reduce buckets)
    hop_chain: int  # hops one after another in one all-reduce bucket (0 for PS)


def _ps_traffic(model: Model, shape: Shape, strategy: Strategy, c: Constants, dense: float, rows: float):
    layout = model.layout(shape.ps, strategy.placement)
    workers_on, ps_host, _ = _hosts(shape)
    w_total = shape.workers
    per_ps = [f * dense + shape.towers_per_worker * rows / shape.ps for f in layout.shares]
    local = [0.0] * len(workers_on)
    for j, h in enumerate(ps_host):
        local[h] += workers_on[h] * per_ps[j]
    remote = max(
        sum(s for j, s in enumerate(per_ps) if ps_host[j] != h) for h, count in enumerate(workers_on) if count
    )
    # While every worker pushes, host h sends its workers' pushes to other hosts' PS and receives
    # the other workers' pushes to its own PS (a pull phase is the reverse): the two directions of
    # its link, at once. Workers whose loops contend for a PS fall into step (a convoy), so a
    # phase lasts as long as the busiest direction of any link needs.
    on_host = [0.0] * len(workers_on)
    for j, h in enumerate(ps_host):
        on_host[h] += per_ps[j]
    total = sum(per_ps)
    phase = max(max(k * (total - f), (w_total - k) * f) for k, f in zip(workers_on, on_host, strict=True))
    row_share = shape.towers_per_worker * rows / shape.ps
    rows_remote = max(
        row_share * sum(1 for at in ps_host if at != h) for h, count in enumerate(workers_on) if count
    )
    messages = [0.0] * len(workers_on)
    for j, h in enumerate(ps_host):
        per_worker = 2 * layout.tensors[j]  # pull and push each piece
        messages[h] += per_worker * w_total  # the PS's end
        for g, count in enumerate(workers_on):
            messages[g] += per_worker * count  # the workers' end
    ps_work = [
        w_total * (2 * c.rpc_cpu_s_per_byte * s + 2 * layout.tensors[j] * c.per_message_s)
        for j, s in enumerate(per_ps)
    ]
    traffic = Traffic(
        link=traffic_lib.ps_host_bytes(workers_on, ps_host, per_ps),
        local=local,
        remote=remote,
        rows_remote=rows_remote,
        phase=phase,
        messages=messages,
        ps_work=ps_work,
        chunks=max(1, min(sum(layout.tensors), 8)),
        hop_chain=0,
    )
    return traffic, layout


def _ring_traffic(shape: Shape, strategy: Strategy, dense: float, rows: float, tensors: int) -> Traffic:
    workers_on, _, _ = _hosts(shape)
    n = shape.workers
    ring = [traffic_lib.ring_host_bytes(n, dense, shape.towers_per_worker * rows) if n > 1 else 0.0] * len(
        workers_on
    )
    # A bucket holds whole tensors (strategies.allreduce.make_buckets): never more buckets than tensors.
    buckets = max(1, min(tensors, math.ceil(dense / strategy.bucket_bytes)))
    hops = 2 * (n - 1) if n > 1 else 0  # a bucket's ring: reduce-scatter then all-gather, hop after hop
    return Traffic(
        link=ring,
        local=[(k - 1) / k * r if k > 1 else 0.0 for k, r in zip(workers_on, ring, strict=True)],
        remote=ring[0],
        rows_remote=0.0,
        phase=0.0,
        messages=[buckets * hops * 2.0 * k for k in workers_on],
        ps_work=[],
        chunks=buckets,
        hop_chain=hops,
    )


def _hybrid_traffic(model: Model, shape: Shape, strategy: Strategy, c: Constants, dense: float, rows: float):
    """SyncHybrid: the dense bytes round a ring of the workers, the tables' rows to and from the PS.

    Each host's link carries both. The PS side moves rows only: a push and a
    lookup per table part a worker touches (one message each way per PS).
    """
    ring = _ring_traffic(shape, strategy, dense, 0.0, model.tensors)
    tables, layout = _ps_traffic(model, shape, strategy, c, 0.0, rows)
    workers_on, ps_host, _ = _hosts(shape)
    per_worker = 2  # the rows pushed, the rows looked up
    messages = [0.0] * len(workers_on)
    for h in ps_host:
        messages[h] += per_worker * shape.workers
        for g, count in enumerate(workers_on):
            messages[g] += per_worker * count
    per_ps = shape.towers_per_worker * rows / shape.ps
    ps_work = [shape.workers * (2 * c.rpc_cpu_s_per_byte * per_ps + per_worker * c.per_message_s)] * shape.ps
    links = len(workers_on)
    ring_link = ring.link + [0.0] * (links - len(ring.link))
    ring_local = ring.local + [0.0] * (links - len(ring.local))
    ring_messages = ring.messages + [0.0] * (links - len(ring.messages))
    traffic = Traffic(
        link=[a + b for a, b in zip(ring_link, tables.link, strict=True)],
        local=[a + b for a, b in zip(ring_local, tables.local, strict=True)],
        remote=ring.remote + tables.remote,
        rows_remote=tables.rows_remote,
        phase=tables.phase,
        messages=[a + b for a, b in zip(ring_messages, messages, strict=True)],
        ps_work=ps_work,
        chunks=ring.chunks,
        hop_chain=ring.hop_chain,
    )
    return traffic, layout


def _worker_path(
    strategy: Strategy,
    c: Constants,
    t: Traffic,
    compute: float,
    link_time: list[float],
    rate: float,
    one_way: float,
    steal: float,
    ps_cpu: float,
    host: float,
) -> tuple[float, float]:
    """(a worker's step from start to its last transfer, the part of it that is latency).

    `host`: the host bus's seconds per round; half is a reduce that goes with
    each chunk as backprop makes it, half the copy back after the last transfer.
    """
    fwd, bwd = compute * c.forward_fraction, compute * (1 - c.forward_fraction)
    phase = t.phase / rate
    rtt = 2 * one_way
    if strategy.kind == ASYNC_PS and strategy.overlap:
        latency = 2 * rtt  # push, update, pull: in series, beside the step
        lookup = t.rows_remote / rate + rtt if t.rows_remote else 0.0  # rows: fetched inside the step
        # In pieces, each piece is pulled back while the next ones are pushed (full duplex): the
        # round is one push plus the last piece's pull, not a push and a whole pull.
        pull = phase * min(1.0, strategy.piece_bytes / max(t.remote, 1.0)) if strategy.piece_bytes else phase
        return max(compute + steal + lookup, phase + pull + latency + host), latency
    if strategy.kind == ASYNC_PS:
        latency = 2 * rtt  # pull before the step, push during backprop
        path = latency + phase + host / 2 + pipelined(fwd, bwd, phase + host / 2, t.chunks, 0)
        return path + steal, latency
    if strategy.kind == SYNC_PS:
        latency = 3 * rtt  # push, the step's token, pull
        # Every replica pushes at once, then pulls at once: each phase waits for the busiest link
        # direction, and for the busiest PS's half of its work.
        both = max(phase, ps_cpu / 2)
        return latency + pipelined(fwd, bwd, both + host / 2, t.chunks, 0) + both + host / 2 + steal, latency
    # All-reduce: a bucket is summed in the host, goes round the ring, is copied back, then the next.
    per_bucket = t.hop_chain * (one_way + c.per_message_s)
    ring = pipelined(fwd, bwd, max(link_time) + host, t.chunks, per_bucket)
    if strategy.kind == HYBRID:
        # The tables' rows: looked up before the forward pass, pushed during backprop beside the
        # ring, then the step's token (the aggregator's one update).
        lookup = t.rows_remote / rate + rtt if t.rows_remote else 0.0
        return lookup + ring + rtt + steal, t.chunks * per_bucket + 2 * rtt
    return ring + steal, t.chunks * per_bucket


def _host_time(shape: Shape, strategy: Strategy, dense: float) -> float:
    """Seconds per round a host's GPUs spend on the host bus summing (or fetching) their gradients.

    Towers: an all-reduce of the dense bytes among the host's GPUs. A worker
    per GPU with PS: each GPU's own pull and push cross its bus link. A ring
    through every GPU (all-reduce, a worker per GPU) has no term of its own:
    its bytes go at the slower of the link and the bus (`predict`).
    """
    bus, k = shape.host_bus, shape.gpus_per_host
    if bus is None or k < 2:
        return 0.0
    if shape.towers:
        return host_bytes(dense, k) / bus.busbw
    return 2 * dense / bus.busbw if strategy.uses_ps else 0.0


def with_transport(constants: Constants, transport: Transport | None) -> Constants:
    """`constants` with the transport's share of the link, cost per message and CPU per byte (None: as is)."""
    if transport is None:
        return constants
    return dataclasses.replace(
        constants,
        goodput=transport.link_share,
        per_message_s=transport.per_message_s,
        rpc_cpu_s_per_byte=transport.cpu_s_per_byte,
    )


def moved_bytes(model: Model, strategy: Strategy) -> tuple[float, float]:
    """(dense, rows per step) as `strategy` moves them, in float32 bytes.

    SyncAllReduce and SyncHybrid sum a table of at most `densify_below_bytes`
    whole with the dense bytes and move no rows of it; the PS strategies move
    every table's rows.
    """
    dense, rows = model.dense_bytes, model.sparse_bytes
    if strategy.kind in (ALLREDUCE, HYBRID):
        small = [(whole, part) for whole, part in model.tables if whole <= strategy.densify_below_bytes]
        dense, rows = dense + sum(w for w, _ in small), max(0.0, rows - sum(p for _, p in small))
    return dense, rows


def predict(model: Model, shape: Shape, strategy: Strategy, constants: Constants = DEFAULTS) -> Prediction:
    """One round of `shape` training `model` with `strategy`, and what limits it (see module doc)."""
    check(shape, strategy)
    c = with_transport(constants, strategy.transport)
    width = 0.5 if strategy.transfer_bits == 16 else 1.0
    dense, rows = (b * width for b in moved_bytes(model, strategy))
    rate = math.inf if shape.link_gbit is None else shape.link_gbit * 1e9 / 8 * c.goodput
    host = _host_time(shape, strategy, dense)
    t, layout = _traffic(model, shape, strategy, c, dense, rows)
    _, _, roles = _hosts(shape)
    compute = model.step_time
    link_time = _link_times(shape, strategy, t, rate)
    busiest = max(range(len(t.link)), key=lambda h: t.link[h])
    terms = {"compute": compute, "busiest link": link_time[busiest]}
    if host:
        terms["host bus"] = host
    cpu = _rpc_cpu(c, t)
    terms.update(_cpu_terms(model, shape, c, t, cpu))

    # A worker's own end of its transfers steals from a compute thread on the same cores.
    steal = c.rpc_cpu_s_per_byte * 2 * t.remote if shape.compute_on_cpu else 0.0
    ps_cpu, one_way = terms.get("PS CPU", 0.0), shape.latency_ms / 1e3
    path, latency = _worker_path(strategy, c, t, compute, link_time, rate, one_way, steal, ps_cpu, host)
    terms["worker path"] = path
    terms["latency in path"] = latency
    ps_bound = strategy.kind == SYNC_PS and ps_cpu / 2 > t.phase / rate

    round_time = max(v for k, v in terms.items() if k != "latency in path")
    replicas = shape.workers * shape.towers_per_worker
    steps = (replicas - _backup_replicas(shape, strategy)) / round_time
    named = shape.host_bus.name if shape.host_bus else ""
    where = _Where(roles, busiest, cpu, t.ps_work, ps_bound, shape.shared_cores, named, shape.gpus_per_host)
    return Prediction(
        shape=shape,
        strategy=strategy,
        model=model.name,
        links=tuple(Link(h, roles[h], b) for h, b in enumerate(t.link)),
        ps_balance=layout.balance if layout else None,
        terms=terms,
        round_time=round_time,
        examples_per_sec=steps * model.batch_size,
        replica_steps_per_sec=steps,
        efficiency=steps * compute / replicas,
        bottleneck=_bottleneck(terms, round_time, where),
    )


def _traffic(
    model: Model, shape: Shape, strategy: Strategy, c: Constants, dense: float, rows: float
) -> tuple[Traffic, PsLayout | None]:
    """The round's traffic under `strategy`, and the PS layout of its variables (None for a ring)."""
    if strategy.kind == HYBRID:
        return _hybrid_traffic(model, shape, strategy, c, dense, rows)
    if strategy.uses_ps:
        return _ps_traffic(model, shape, strategy, c, dense, rows)
    return _ring_traffic(shape, strategy, dense, rows, model.tensors), None


def _link_times(shape: Shape, strategy: Strategy, t: Traffic, rate: float) -> list[float]:
    """Seconds per round each host's link needs at `rate` (a flat ring's: at its link's or bus's pace)."""
    # A ring through every GPU of a host crosses its bus as often as its link: the slower one paces it.
    # On one host the ring never leaves it: the bus alone.
    bus = shape.host_bus
    flat_ring = not strategy.uses_ps and not shape.towers and bus is not None and shape.gpus_per_host > 1
    ring_rate = (bus.busbw if shape.hosts == 1 else min(rate, bus.busbw)) if flat_ring else rate
    return [b / ring_rate for b in t.link]


def _rpc_cpu(c: Constants, t: Traffic) -> list[float]:
    """gRPC's CPU seconds per round on each host: every byte at both ends, every message."""
    # A link byte once here, a local byte twice.
    return [
        c.rpc_cpu_s_per_byte * (2 * lb + 4 * lo) + c.per_message_s * m
        for lb, lo, m in zip(t.link, t.local, t.messages, strict=True)
    ]


def _cpu_terms(model: Model, shape: Shape, c: Constants, t: Traffic, cpu: list[float]) -> dict[str, float]:
    """The CPU terms whose cores are known: the busiest host's, the busiest PS's, the shared machine's."""
    terms: dict[str, float] = {}
    if shape.host_cores is not None:
        terms["host CPU"] = max(cpu) / shape.host_cores
    if c.ps_cores is not None and t.ps_work:
        terms["PS CPU"] = max(t.ps_work) / c.ps_cores
    if shape.shared_cores is not None:
        per_step = model.compute_cpu if model.compute_cpu is not None else model.step_time
        compute_cpu = shape.workers * shape.towers_per_worker * per_step if shape.compute_on_cpu else 0.0
        terms["machine CPU"] = (sum(cpu) + compute_cpu) / shape.shared_cores
    return terms


def _backup_replicas(shape: Shape, strategy: Strategy) -> int:
    """The replicas of sync PS's backup workers, whose steps a round does not count (0 for the others)."""
    return strategy.backup_workers * shape.towers_per_worker if strategy.kind == SYNC_PS else 0


@dataclasses.dataclass(frozen=True)
class _Where:
    """What `_bottleneck` needs to name the limit."""

    roles: list[str]
    busiest: int
    cpu: list[float]
    ps_work: list[float]
    ps_bound: bool
    shared_cores: float | None
    bus: str
    gpus_per_host: int


def _bottleneck(terms: dict, round_time: float, w: _Where) -> str:
    """Name what sets the round time: compute, a named link, a named PS or host's CPU, or latency."""
    link = f"link of host {w.busiest} ({w.roles[w.busiest]})"
    busiest_ps = max(range(len(w.ps_work)), key=lambda j: w.ps_work[j]) if w.ps_work else None
    ps = f"CPU of PS {busiest_ps}: gRPC bytes and messages of every worker"
    if terms["compute"] >= 0.9 * round_time:
        return "compute"
    if w.ps_bound and terms["worker path"] >= round_time:
        return ps
    name = max((k for k in terms if k not in ("compute", "latency in path")), key=lambda k: terms[k])
    if name == "busiest link":
        return link
    if name == "PS CPU":
        return ps
    if name == "host CPU":
        h = max(range(len(w.cpu)), key=lambda i: w.cpu[i])
        return f"CPU of host {h} ({w.roles[h]}): gRPC bytes and messages"
    if name == "machine CPU":
        return f"CPU shared by all hosts ({w.shared_cores:.2f} cores)"
    if name == "host bus":
        return f"host bus ({w.bus}): summing {w.gpus_per_host} GPUs' gradients"
    if terms["latency in path"] > max(terms["busiest link"], terms["compute"], terms.get("host bus", 0.0)):
        return "latency: round trips and per-message costs in the step's path"
    if terms.get("host bus", 0.0) > terms["busiest link"]:
        return f"host bus ({w.bus}) in the step's path: summing {w.gpus_per_host} GPUs' gradients"
    return f"{link} in the step's path"


def shares_balance(loads: Sequence[float]) -> float:
    """Busiest over mean, 1.0 for nothing."""
    total = sum(loads)
    return max(loads) * len(loads) / total if total else 1.0
