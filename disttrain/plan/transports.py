"""Transports and host buses, and what each transport's constants were in every environment found.

A transport's middle values (`cost.Transport`) are the ones every middle
prediction uses; its spread (`Spread`) lists the value each constant took in
each published or measured environment, with its source, so that a
prediction can say how far it moves between the least and the most
favourable of them (`plan.interval`). The points are micro-benchmarks
(nccl-tests, iperf-like probes), vendor figures, the measurements of this
project's own emulated hosts, published gRPC rates of one PS process (for
`Constants.ps_cores`, the PS's ceiling, spread beside gRPC's constants), and,
marked `fitted`, the value each calibration source's rows imply
(`plan.calibrate`); no held-out run.
"""

from __future__ import annotations

import dataclasses

from disttrain.plan import cost

LINK_SHARE, PER_MESSAGE, CPU_PER_BYTE = "link_share", "per_message_s", "cpu_s_per_byte"
TRANSPORT_FIELDS = (LINK_SHARE, PER_MESSAGE, CPU_PER_BYTE)
# `Constants.ps_cores`, the PS process's ceiling on its gRPC work: spread beside gRPC's own constants.
PS_CORES = "ps_cores"
FIELDS = (*TRANSPORT_FIELDS, PS_CORES)
# A larger link share or PS ceiling is better; a larger cost per message or per byte is worse.
_HIGHER_IS_BETTER = {LINK_SHARE: True, PER_MESSAGE: False, CPU_PER_BYTE: False, PS_CORES: True}
PESSIMISTIC, OPTIMISTIC = "pessimistic", "optimistic"


@dataclasses.dataclass(frozen=True)
class Point:
    """One constant's value in one environment, and where it was published or measured.

    fitted: implied by a calibration source's rows (`plan.calibrate`), not
    measured by a micro-benchmark.
    """

    value: float
    source: str
    fitted: bool = False


def _fitted(value: float, source: str) -> Point:
    return Point(
        value, f"calibration set, {source}: its rows' median error is zero here (plan.calibrate)", True
    )


# The calibration sources, as `plan.calibrate` names the environments it fits.
SEED_RUNS = "the seed's 128-K80 runs (tensorflow/tensorflow#5683)"
TF_CNN_RUNS = "tensorflow.org's EC2 K80 runs (tf_cnn_benchmarks)"
HOROVOD_16_RUNS = "Horovod's 16-GPU table (README at d54e3a88)"


@dataclasses.dataclass(frozen=True)
class Spread:
    """A transport's middle values and the value each constant took in every environment found.

    A constant with no points has no spread: its middle value holds at
    both ends. The ends include the middle: a range always contains the
    value the middle prediction uses. `ps_cores` is the middle of
    `Constants.ps_cores` (None: no PS ceiling, so nothing to spread); its
    points (`PS_CORES`) move only layouts with a PS.
    """

    transport: cost.Transport
    points: dict[str, tuple[Point, ...]]
    ps_cores: float | None = cost.DEFAULTS.ps_cores

    def _middle(self, field: str) -> float | None:
        return self.ps_cores if field == PS_CORES else getattr(self.transport, field)

    def bounds(self, field: str) -> tuple[float, float]:
        """(pessimistic, optimistic) value of `field`, the middle included."""
        middle = self._middle(field)
        if middle is None:
            return middle, middle
        values = [middle, *(p.value for p in self.points.get(field, ()))]
        worst, best = (min, max) if _HIGHER_IS_BETTER[field] else (max, min)
        return worst(values), best(values)

    def spreads(self, field: str) -> bool:
        pessimistic, optimistic = self.bounds(field)
        return pessimistic != optimistic

    def at(self, end: str, fields=FIELDS) -> cost.Transport:
        """The transport with `fields` at `end` (PESSIMISTIC or OPTIMISTIC), the others at the middle."""
        which = 0 if end == PESSIMISTIC else 1
        moved = [f for f in fields if f in TRANSPORT_FIELDS]
        return dataclasses.replace(self.transport, **{f: self.bounds(f)[which] for f in moved})

    def constants_at(self, end: str, constants: cost.Constants, fields=FIELDS) -> cost.Constants:
        """`constants` with `ps_cores` at `end` if `fields` name it (and it has a middle), else as is."""
        if PS_CORES not in fields or self.ps_cores is None:
            return constants
        return dataclasses.replace(constants, ps_cores=self.bounds(PS_CORES)[0 if end == PESSIMISTIC else 1])


NCCL_2_4_TUNING = (
    "github.com/NVIDIA/nccl src/graph/tuning.cc (NCCL 2.4): 'Latencies in us' hwLat NET Ring Simple 9.6, "
    "baseLat Ring Simple 8.4"
)
MEASURED_HERE = "measured here on TF 2.21's CPU gRPC (decision 0082; tests/netem)"

# gRPC on CPU: measured here, the default `cost.Constants`: 95% of a shaped link (tests/netem), 0.26 ms
# per message (1,000 small variables read in one run), 1.4 ms of CPU per MB at each end (the tasks' CPU
# seconds per step in the benchmark's emulated MLP runs).
GRPC = cost.Transport(
    cost.GRPC,
    link_share=cost.DEFAULTS.goodput,
    per_message_s=cost.DEFAULTS.per_message_s,
    cpu_s_per_byte=cost.DEFAULTS.rpc_cpu_s_per_byte,
)
# The PS process's ceiling (`Constants.ps_cores`; middle 1.4, from the seed's one-host rows). The rule for
# its points, written before any was taken: every published figure found of TF's gRPC moving tensors
# to or from a PS process (or a worker serving a variable, the same server code) whose source shows
# TF's gRPC, not the link, as the limit (processes on one machine, or machines whose link another
# transport filled faster), and none from a held-out source. A rate R at the serving end is the cores'
# worth the middle's CPU per MB needs for it: R x 1.4 ms/MB. A client's fetch (tensorflow#6256) is not
# a PS's end and is left out; so are runs several PS processes shared one machine in.


def _ps_rate(mb_per_s: float, source: str) -> Point:
    """A PS process's published gRPC rate as `ps_cores`: the cores the middle's CPU per MB needs for it."""
    return Point(mb_per_s * 1e6 * GRPC.cpu_s_per_byte, source + f" ({mb_per_s:g} MB/s x 1.4 ms/MB)")


PS_CORES_POINTS = (
    _ps_rate(
        161.63,
        "github.com/tensorflow/tensorflow/issues/4498 (yaroslavvb, 2016-09-21, TF 0.10): two local "
        "processes adding 10 MB vectors to a variable in the other, 'Distributed rate: 161.63 MB per second'",
    ),
    _ps_rate(
        900.0,
        "github.com/tensorflow/tensorflow/issues/6116 (yaroslavvb, 2016-12-09), Xeon E5-2630 v3: "
        "'the non-fetching is just slow (0.9 GB/sec grpc vs 20.2 GB/sec in-process)'",
    ),
    _ps_rate(
        550.0,
        "gist.github.com/yaroslavvb/ea1b1bae0a75c4aae593df7eca72d9ca, sharded_ps_benchmark.py (linked "
        "from tensorflow#6116): independent workers adding to variables on one PS, "
        "'xeon: ps=1: 0.5-0.6 GB/s'",
    ),
    _ps_rate(
        196.11,
        "github.com/tensorflow/tensorflow/pull/11261 (byronyi, 2017-07-04), local recv_tensor benchmark on "
        "master: 'Distributed rate: 196.11 MB/s'",
    ),
    _ps_rate(
        150.0,
        "github.com/tensorflow/tensorflow/issues/6116 (byronyi, 2017-08-09), the local benchmark before "
        "TF's gRPC upgrade: 'improved from 100-200 MB/s' (a quoted range: its middle, as for 0.5-0.6 GB/s)",
    ),
    _ps_rate(
        800.0,
        "github.com/tensorflow/tensorflow/issues/6116 (byronyi, 2017-08-09), the local benchmark after "
        "TF's gRPC upgrade: 'improved from 100-200 MB/s to 800 MB/s'",
    ),
    _ps_rate(
        287.89,
        "github.com/tensorflow/tensorflow/issues/6116 (suiyuan2009, 2017-08-14), the same benchmark on "
        "master: 'Distributed rate: 287.89 MB per second'",
    ),
    _ps_rate(
        500.0,
        "github.com/tensorflow/tensorflow/issues/6116 (suiyuan2009, 2017-08-14), 3 machines: "
        "'grpc+gdr is about 3400MB/s, grpc is about 500MB/s' (the link "
        "carried 3.4 GB/s: gRPC was the limit)",
    ),
)

GRPC_SPREAD = Spread(
    GRPC,
    {
        LINK_SHARE: (
            Point(
                0.85,
                "measured here: TF's ring all-reduce over its gRPC transfers, 0.85-0.90 of the "
                "nominal rate (bin/link_probe.py on emulated hosts; decision 0030)",
            ),
            Point(0.957, "measured here: plain TCP, 0.950-0.957 of the nominal rate (bin/link_probe.py)"),
            _fitted(0.164, HOROVOD_16_RUNS + ", TF 1.3's gRPC"),
        ),
        PER_MESSAGE: (_fitted(3.92e-4, HOROVOD_16_RUNS),),
        CPU_PER_BYTE: (
            _fitted(1.28e-9, SEED_RUNS),
            _fitted(0.05e-9, TF_CNN_RUNS + " (the search's floor: at most this)"),
            _fitted(1.65e-9, HOROVOD_16_RUNS),
            Point(
                2.2e-3 / 1e6,
                "measured here: CIFAR-10's small tensors, 0.56 CPU-s per round where 1.4 "
                "ms/MB gives 0.36 (the 3-host async run of data/benchmark_emulated_hosts.json)",
            ),
        ),
        PS_CORES: (
            *PS_CORES_POINTS,
            _fitted(1.49, SEED_RUNS + ", its 128-GPU rows"),
            _fitted(5.95, TF_CNN_RUNS),
            _fitted(1.25, HOROVOD_16_RUNS + ", TF 1.3's PS"),
        ),
    },
)

# NCCL over TCP sockets. Middle: github.com/NVIDIA/nccl/issues/209 (2019, nccl-tests over TCP): "Even with
# large message sizes we have not been able to reliably obtain more than 60% of wire speed over 32Gpbs
# networks". Per ring hop: NCCL's own latency model, 9.6 us per network hop (tuning.cc above). CPU:
# NCCL's kernels and proxy threads take no core the model counts. The spread: every large-message
# nccl-tests bus bandwidth over TCP found in NCCL's issue threads, over the link's nominal rate.
NCCL_TCP = cost.Transport("nccl_tcp", link_share=0.60, per_message_s=9.6e-6, cpu_s_per_byte=0.0)
NCCL_TCP_SPREAD = Spread(
    NCCL_TCP,
    {
        LINK_SHARE: (
            Point(
                14.5 / 32,
                "github.com/NVIDIA/nccl/issues/209 (cswinter, 2019-06-04), GCP 32GbE, 2 nodes x "
                "8 GPUs, NCCL 2.4.7ms0: bus bandwidth '14.5, 14.8, 14.9' Gbit/s",
            ),
            Point(22.9 / 32, "same thread, 4 nodes x 8 GPUs: '22.2, 22.4, 22.9' Gbit/s"),
            Point(31.4 / 32, "same thread, 2 nodes x 1 GPU: '30.6, 31.0, 31.4' Gbit/s"),
            Point(
                2.68429 / 12.5,
                "github.com/NVIDIA/nccl/issues/450 (shjwudp, 2021-01-06), 100Gbps TCP, "
                "all_reduce_perf 8-128 MB: 'Avg bus bandwidth : 2.68429' GB/s",
            ),
            Point(
                1.7 / 3.125,
                "github.com/NVIDIA/nccl-tests/issues/83 (rahul-bothra, 2021-05-11), Azure, "
                "25 Gbps, 2 nodes x 4 GPUs: 'it maxed out at 1.7GBps'",
            ),
            _fitted(0.570, HOROVOD_16_RUNS),
        ),
        PER_MESSAGE: (
            Point(
                45.82e-6,
                "github.com/NVIDIA/nccl-tests/issues/82 (rahul-bothra, 2021-05-11), Azure TCP, 2 "
                "ranks: broadcast_perf of 8 bytes (one hop) '45.82' us",
            ),
            _fitted(1.05e-4, HOROVOD_16_RUNS),
        ),
    },
)

# NCCL over RDMA (InfiniBand, RoCE). Middle: github.com/NVIDIA/nccl-tests/issues/119, NCCL's maintainer
# (sjeaugey, 2022): "We usually consider 24GB/s is the peak performance per 200G NIC (12 GB/s for 100G
# NICs)": 12 of 12.5 GB/s = 0.96 (and NCCL's topo.h: NET_BW 12.0 // 100Gbit). Per hop: as above.
NCCL_RDMA = cost.Transport("nccl_rdma", link_share=0.96, per_message_s=9.6e-6, cpu_s_per_byte=0.0)
NCCL_RDMA_SPREAD = Spread(
    NCCL_RDMA,
    {
        LINK_SHARE: (
            Point(
                12.2 / 12.5,
                "github.com/NVIDIA/nccl-tests/issues/29 (sjeaugey, 2019-12-06): '12.2 GB/s "
                "(for a 100Gbps card) is as good as you can get'",
            ),
            Point(
                0.65,
                "github.com/NVIDIA/nccl-tests/issues/112 (sandyhouse, 2022-07-06), RoCEv2: 'nccl "
                "test only gets ~65% of the link bandwidth' (PCIe ACS left enabled)",
            ),
            _fitted(0.883, HOROVOD_16_RUNS),
        ),
        PER_MESSAGE: (_fitted(1.05e-4, HOROVOD_16_RUNS),),
    },
)

TRANSPORTS = {t.name: t for t in (GRPC, NCCL_TCP, NCCL_RDMA)}
SPREADS = {s.transport.name: s for s in (GRPC_SPREAD, NCCL_TCP_SPREAD, NCCL_RDMA_SPREAD)}
TRANSPORT_SOURCES = {
    GRPC.name: MEASURED_HERE,
    NCCL_TCP.name: "github.com/NVIDIA/nccl/issues/209: 'not ... more than 60% of wire speed'; "
    + NCCL_2_4_TUNING,
    NCCL_RDMA.name: "github.com/NVIDIA/nccl-tests/issues/119: '12 GB/s for 100G NICs'; " + NCCL_2_4_TUNING,
}

# Host buses: NCCL's own bandwidth table, github.com/NVIDIA/nccl src/graph/topo.h (GB/s): "#define
# PCI_BW 12.0 // PCI Gen3 x16", "#define QPI_BW 6.0" (Broadwell's link between sockets; later
# "BDW_QPI_BW 6.0"), "#define SM60_NVLINK_BW 18.0" (one Pascal NVLink). A host with two PCIe roots
# (two CPUs, GPUs under each) sums across sockets at QPI's rate.
NCCL_TOPO = "github.com/NVIDIA/nccl src/graph/topo.h"
PCIE = cost.HostBus("pcie", 12.0e9)
PCIE_TWO_ROOTS = cost.HostBus("pcie_two_roots", 6.0e9)
NVLINK = cost.HostBus("nvlink", 18.0e9)
HOST_BUSES = {b.name: b for b in (PCIE, PCIE_TWO_ROOTS, NVLINK)}
HOST_BUS_SOURCES = {
    PCIE.name: NCCL_TOPO + ": PCI_BW 12.0 // PCI Gen3 x16",
    PCIE_TWO_ROOTS.name: NCCL_TOPO + ": QPI_BW 6.0 (between the sockets of a two-root host)",
    NVLINK.name: NCCL_TOPO + ": SM60_NVLINK_BW 18.0 (one Pascal NVLink; a conservative floor)",
}
