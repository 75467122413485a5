"""Published distributed-training runs, predicted from their published inputs, and the published
micro-benchmarks the planner's transports and host buses come from.

Every input is stated here with where it came from. The models are the model
zoo's, built from the shipped gin files at the published batch size; one
GPU's step time is the published single-GPU rate at that batch. Runs are
split in four: the calibration set (the only rows any constant was chosen
or checked against; `Constants.ps_cores` is calibrated on the seed's
one-host rows), the held-out set, a second held-out set of runs on cloud
TCP (`cloud_tcp`), a third of NCCL rings over TCP or RDMA (`ring_runs`) and
a fourth of rings on PCIe hosts (`heldout_runs4`), all three scaled against
one host as published; no held-out
row was used to choose anything: its errors and coverage are computed, not
fitted. Every row is predicted as an interval (`plan.interval`) from the
spread of its transport's published environments (`plan.transports`),
micro-benchmarks and vendor figures, not any run here, and at least the
planner's own error on the calibration rows (`interval.MODEL_ERROR`).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

from disttrain.plan import advice, cloud_tcp, cost, heldout_runs4, interval, ring_runs, transports

CALIBRATION, HELD_OUT, CLOUD_TCP = "calibration", "held-out", "held-out, cloud TCP"
RING = "held-out, NCCL rings"
PCIE_RINGS = "held-out, PCIe rings"
HELD_OUT_SPLITS = (HELD_OUT, CLOUD_TCP, RING, PCIE_RINGS)

# The transports and host buses, with their sources and spreads, live in `transports`; these names stay.
GRPC, NCCL_TCP, NCCL_RDMA = transports.GRPC, transports.NCCL_TCP, transports.NCCL_RDMA
TRANSPORTS, TRANSPORT_SOURCES = transports.TRANSPORTS, transports.TRANSPORT_SOURCES
PCIE, PCIE_TWO_ROOTS, NVLINK = transports.PCIE, transports.PCIE_TWO_ROOTS, transports.NVLINK
HOST_BUSES, HOST_BUS_SOURCES = transports.HOST_BUSES, transports.HOST_BUS_SOURCES

# ---- published runs ---------------------------------------------------------------------------

SEED = "tensorflow/tensorflow#5683 (Nov 2016), scripts indhub/tfperftest"
TF_CNN = (
    "tensorflow.org/performance/benchmarks, 'Details for Amazon EC2 Distributed (NVIDIA Tesla K80)' "
    "(tensorflow/tensorflow tensorflow/docs_src/performance/benchmarks.md, tested May 2017)"
)
HOROVOD_16 = (
    "github.com/horovod/horovod README at d54e3a88 (PR #19, 2017-09-05): 'The first benchmark was done "
    "on 4 servers with 4 Pascal GPUs each connected by RoCE-capable 25 Gbit/s network'"
)

_SYNC_RR = cost.Strategy(cost.SYNC_PS, placement=cost.ROUND_ROBIN)
_SYNC_GREEDY = cost.Strategy(cost.SYNC_PS, placement=cost.GREEDY)
# Horovod: one process per GPU, NCCL's ring through every GPU, tensors fused into 64 MB buffers
# (README at d54e3a88: "Default fusion buffer size is 64 MB").
_HOROVOD = cost.Strategy(cost.ALLREDUCE, bucket_bytes=64 * 2**20)

# The seed: EC2 p2.16xlarge (16 K80 per host), one worker per GPU, one PS per host (tfperftest's
# generate_runner.py), synchronous (SyncReplicasOptimizer), TF's replica_device_setter (round robin).
# Link: 20 Gbit/s, AWS's figure for p2.16xlarge (assumed: not in the report). Host bus: two sockets
# (assumed, as p2.8xlarge).
_SEED_SHAPE = dict(
    gpus_per_host=16, towers=False, ps_hosts=cost.COLOCATED, link_gbit=20.0, host_bus=PCIE_TWO_ROOTS
)
# tf_cnn_benchmarks: p2.8xlarge (8 K80), PS colocated on the worker hosts ("EC2 instances (p2.8xlarge)
# running worker servers also ran parameter servers. Equal numbers of parameter servers and worker
# servers were used with the following exceptions: InceptionV3: 8 instances / 6 parameter servers ...
# ResNet-152: 8 instances / 4 parameter servers"), distributed_replicated (one worker per host, the
# host's GPUs as towers, gradients summed on the host), cross_replica_sync. Link: 10 Gbit/s, AWS's
# figure for p2.8xlarge (assumed). Placement: round robin (assumed: the benchmark's distributed mode
# used replica_device_setter's default). Host bus: two sockets (assumed: p2.8xlarge has two Xeons).
_TF_CNN_SHAPE = dict(
    gpus_per_host=8, towers=True, ps_hosts=cost.COLOCATED, link_gbit=10.0, host_bus=PCIE_TWO_ROOTS
)
# Horovod's servers: "PCIx based Pascal servers: 1. Dual PCIx root. 2. 2 GPUs per CPU." (alsrgv,
# github.com/horovod/horovod/issues/979). Distributed TensorFlow there: "plain grpc + parameter_server
# as of TensorFlow 1.3.0" (alsrgv, github.com/horovod/horovod/issues/246); tf_cnn_benchmarks'
# parameter_server mode with variables on CPU caches each variable on the worker's CPU and sums the
# towers there (VariableMgrDistributedFetchFromPS, OverrideCachingDevice): towers. PS: one per host,
# colocated (assumed: not stated). Placement: that mode's own, each variable as created on the least
# loaded PS by bytes ("ps_strategy = tf.contrib.training.GreedyLoadBalancingStrategy(...,
# tf.contrib.training.byte_size_load_fn)", VariableMgrDistributedFetchFromPS.get_devices,
# tensorflow/benchmarks scripts/tf_cnn_benchmarks/variable_mgr.py at abe3c80, 2017-08-17, as at its
# first commit fd87986, 2017-05-03). Earlier rounds here assumed round robin: with 4 PS it deals
# Inception's conv kernels, each followed by three batch-norm variables, all to one PS.
_HOROVOD_HOST = dict(gpus_per_host=4, ps_hosts=cost.COLOCATED, host_bus=PCIE_TWO_ROOTS)
_HOROVOD_PS = dict(_HOROVOD_HOST, towers=True)
_HOROVOD_RING = dict(_HOROVOD_HOST, towers=False)

_INCEPTION = ("inception_v3_sync.gin",)
_RESNET50 = ("resnet50_sync.gin",)
_RESNET101 = ("gin/models/resnet101.gin", "gin/strategies/sync_ps.gin")
_RESNET152 = ("resnet152_sync.gin",)
_VGG16 = ("vgg16_sync.gin",)
_ALEXNET = ("alexnet_sync.gin",)


@dataclasses.dataclass(frozen=True)
class Case:
    """One published run and the inputs it is predicted from.

    images_per_sec: published at this scale; or `efficiency`, when the
    source gives only that (then the one-GPU rate only sets the step time).
    split: CALIBRATION or HELD_OUT; calibrated: a row `Constants.ps_cores`
    was fitted to (the seed's one-host rows).
    """

    source: str
    gin_files: tuple[str, ...]
    model: str
    batch_size: int
    one_gpu_images_per_sec: float  # published single-GPU rate at that batch: gives the step time
    images_per_sec: float | None
    hosts: int
    ps: int
    shape: dict
    strategy: cost.Strategy = _SYNC_RR
    split: str = CALIBRATION
    note: str = ""
    calibrated: bool = False
    efficiency: float | None = None
    one_host_images_per_sec: float | None = None  # set: scaling is against one host, as published

    @property
    def gpus(self) -> int:
        return self.hosts * self.shape["gpus_per_host"]

    @property
    def published_efficiency(self) -> float:
        """Against N x one GPU; or, with `one_host_images_per_sec`, against N x one host."""
        if self.efficiency is not None:
            return self.efficiency
        if self.one_host_images_per_sec is not None:
            return self.images_per_sec / (self.hosts * self.one_host_images_per_sec)
        return self.images_per_sec / (self.gpus * self.one_gpu_images_per_sec)

    @property
    def transport(self) -> str:
        return self.strategy.transport.name if self.strategy.transport else cost.GRPC


def _seed(model, gin_file, batch, one, rate, hosts=8, gpus=16, note="", calibrated=False):
    shape = dict(_SEED_SHAPE, gpus_per_host=gpus)
    return Case(
        SEED, (gin_file,), model, batch, one, rate, hosts, hosts, shape, note=note, calibrated=calibrated
    )


def _tf_cnn(gin, model, batch, one, rate, hosts, ps, split=CALIBRATION):
    return Case(TF_CNN, gin, model, batch, one, rate, hosts, ps, _TF_CNN_SHAPE, split=split)


def _horovod_16(gin, model, one, rate, setup):
    """One cell of Horovod's 16-GPU table (batch 64 per GPU); setup: 'ps', 'tcp' or 'rdma'."""
    if setup == "ps":
        shape, strategy = dict(_HOROVOD_PS, link_gbit=25.0), _SYNC_GREEDY
        note = "'Distributed TensorFlow (variables on CPU)'"
    else:
        transport = NCCL_TCP if setup == "tcp" else NCCL_RDMA
        shape, strategy = (
            dict(_HOROVOD_RING, link_gbit=25.0),
            dataclasses.replace(_HOROVOD, transport=transport),
        )
        note = f"'{setup.upper()} Horovod (allreduce on GPU with NCCL)'"
    ps = 4 if setup == "ps" else 0
    return Case(HOROVOD_16, gin, model, 64, one, rate, 4, ps, shape, strategy, note=note)


CALIBRATION_CASES = (
    _seed(
        "Inception-v3",
        "inception_v3_sync.gin",
        32,
        17.525,
        94.832,
        hosts=1,
        gpus=8,
        note="one host: no network; Constants.ps_cores is fitted here",
        calibrated=True,
    ),
    _seed(
        "Inception-v3",
        "inception_v3_sync.gin",
        32,
        17.525,
        99.072,
        hosts=1,
        gpus=16,
        note="one host: no network; Constants.ps_cores is fitted here",
        calibrated=True,
    ),
    _seed(
        "Inception-v3",
        "inception_v3_sync.gin",
        32,
        17.525,
        322.816,
        note="batch 32: tfperftest's example run, whose 17.5 img/s per worker is the report's 1-GPU row",
    ),
    _seed(
        "ResNet-152",
        "resnet152_sync.gin",
        32,
        10.567,
        152.192,
        note="batch 32 assumed (as Inception); the report names ResNet-152 but tfperftest's "
        "resnet_dist.py builds tensorflow/models' CIFAR-style ResNet (5 units, no bottleneck)",
    ),
    _seed(
        "AlexNet",
        "alexnet_sync.gin",
        256,
        92.464,
        874.624,
        note="batch 256: alexnet.py's default; at 32 the fc6 PS's link alone would need 7 s "
        "per round, longer than the published round (4.7 s)",
    ),
    # tf_cnn_benchmarks, "Training synthetic data": GPUs 1 / 8 / 16 / 32 / 64; InceptionV3 29.7 / 229 /
    # 459 / 902 / 1783, ResNet-50 52.4 / 378 / 751 / 1388 / 2744, ResNet-152 19.4 / 146 / 291 / 565 / 981.
    _tf_cnn(_INCEPTION, "Inception-v3", 64, 29.7, 229, 1, 1),
    _tf_cnn(_RESNET50, "ResNet-50", 64, 52.4, 378, 1, 1),
    _tf_cnn(_RESNET152, "ResNet-152", 32, 19.4, 146, 1, 1),
    _tf_cnn(_INCEPTION, "Inception-v3", 64, 29.7, 1783, 8, 6),
    _tf_cnn(_RESNET50, "ResNet-50", 64, 52.4, 2744, 8, 8),
    _tf_cnn(_RESNET152, "ResNet-152", 32, 19.4, 981, 8, 4),
    # Horovod's 16-GPU table: "Baseline single-GPU (batch size=64) | 134.4 | 119.4 | 130.9" (Inception
    # V3, ResNet-101, VGG-16); "Distributed TensorFlow (variables on CPU) | 1,576.4 (11.7x) | 1,168.8
    # (9.8x) | 79.5 (0.6x)"; "TCP Horovod (allreduce on GPU with NCCL) | 1,990.7 (14.8x) | 1,685.1
    # (14.1x) | 1,308.7 (10.0x)"; "RDMA Horovod (allreduce on GPU with NCCL) | 2,022.6 (15.0x) |
    # 1,746.2 (14.6x) | 1,787.4 (13.7x)".
    _horovod_16(_INCEPTION, "Inception-v3", 134.4, 1576.4, "ps"),
    _horovod_16(_RESNET101, "ResNet-101", 119.4, 1168.8, "ps"),
    _horovod_16(_VGG16, "VGG16", 130.9, 79.5, "ps"),
    _horovod_16(_INCEPTION, "Inception-v3", 134.4, 1990.7, "tcp"),
    _horovod_16(_RESNET101, "ResNet-101", 119.4, 1685.1, "tcp"),
    _horovod_16(_VGG16, "VGG16", 130.9, 1308.7, "tcp"),
    _horovod_16(_INCEPTION, "Inception-v3", 134.4, 2022.6, "rdma"),
    _horovod_16(_RESNET101, "ResNet-101", 119.4, 1746.2, "rdma"),
    _horovod_16(_VGG16, "VGG16", 130.9, 1787.4, "rdma"),
)
HOROVOD_64 = (
    "github.com/horovod/horovod README at d54e3a88 (PR #19, 2017-09-05): 'The second benchmark was done "
    "on 16 servers with 4 Pascal GPUs each connected by plain 40 Gbit/s network'"
)
HOROVOD_SCALE = (
    "github.com/horovod/horovod docs/benchmarks (README at 6bb6a2db, PR #44, and 8318a898, PR #266): "
    "'32 [then 128] servers with 4 Pascal GPUs each connected by RoCE-capable 25 Gbit/s network. Horovod "
    "achieves 90% scaling efficiency for both Inception V3 and ResNet-101, and 79% [then 68%] scaling "
    "efficiency for VGG-16'"
)
TF_BENCH_29 = (
    "github.com/tensorflow/benchmarks/issues/29 (ppwwyyxx, 2017-06-09): '4 Tesla M40s per machine', "
    "'Bandwidth: 9.3Gbit/s given by iperf', 'resnet50, batch 64 per GPU', '1GPU: 111 im/s', "
    "'2x4=8GPU: only 561 im/s' (distributed_replicated)"
)


def _horovod_64(gin, model, one, rate, setup):
    """One cell of Horovod's 64-GPU table (16 x 4 Pascal, 40 Gbit/s, batch 64): 'ps' or 'tcp'."""
    if setup == "ps":
        shape, strategy, ps = dict(_HOROVOD_PS, link_gbit=40.0), _SYNC_GREEDY, 16
        note = "'Distributed TensorFlow (variables on CPU)'"
    else:
        shape, ps = dict(_HOROVOD_RING, link_gbit=40.0), 0
        strategy = dataclasses.replace(_HOROVOD, transport=NCCL_TCP)
        note = "'TCP Horovod (allreduce on GPU with NCCL)'"
    return Case(HOROVOD_64, gin, model, 64, one, rate, 16, ps, shape, strategy, HELD_OUT, note)


def _horovod_scale(gin, model, one, hosts, efficiency):
    """Horovod's scaling chart: only the efficiency is published; the step is the 16-GPU table's single GPU.

    RoCE-capable 25 Gbit/s: NCCL over RDMA (assumed); the same Pascal servers (assumed).
    """
    shape = dict(_HOROVOD_RING, link_gbit=25.0)
    strategy = dataclasses.replace(_HOROVOD, transport=NCCL_RDMA)
    note = "efficiency as published; step time from the 16-GPU table's single-GPU rate (assumed the same GPU)"
    return Case(
        HOROVOD_SCALE, gin, model, 64, one, None, hosts, 0, shape, strategy, HELD_OUT, note, False, efficiency
    )


# Chosen before any of them was predicted, and never used to choose a constant.
HELD_OUT_CASES: tuple[Case, ...] = (
    # Horovod's 64-GPU table: "Baseline single-GPU (batch size=64) | 148.8 | 136.0 | 149.6";
    # "Distributed TensorFlow (variables on CPU) | 5,297.4 (35.6x) | 4,269.2 (31.4x) | 100.8 (0.7x)";
    # "TCP Horovod (allreduce on GPU with NCCL) | 7,932.1 (53.3x) | 7,741.6 (56.9x) | 6,084.2 (40.7x)".
    _horovod_64(_INCEPTION, "Inception-v3", 148.8, 5297.4, "ps"),
    _horovod_64(_RESNET101, "ResNet-101", 136.0, 4269.2, "ps"),
    _horovod_64(_VGG16, "VGG16", 149.6, 100.8, "ps"),
    _horovod_64(_INCEPTION, "Inception-v3", 148.8, 7932.1, "tcp"),
    _horovod_64(_RESNET101, "ResNet-101", 136.0, 7741.6, "tcp"),
    _horovod_64(_VGG16, "VGG16", 149.6, 6084.2, "tcp"),
    # Horovod's scaling chart at 128 GPUs (32 servers) and 512 GPUs (128 servers).
    _horovod_scale(_INCEPTION, "Inception-v3", 134.4, 32, 0.90),
    _horovod_scale(_RESNET101, "ResNet-101", 119.4, 32, 0.90),
    _horovod_scale(_VGG16, "VGG16", 130.9, 32, 0.79),
    _horovod_scale(_INCEPTION, "Inception-v3", 134.4, 128, 0.90),
    _horovod_scale(_RESNET101, "ResNet-101", 119.4, 128, 0.90),
    _horovod_scale(_VGG16, "VGG16", 130.9, 128, 0.68),
    # tf_cnn_benchmarks at 16 and 32 GPUs (2 and 4 instances, as many PS as workers: the page's rule).
    _tf_cnn(_INCEPTION, "Inception-v3", 64, 29.7, 459, 2, 2, HELD_OUT),
    _tf_cnn(_RESNET50, "ResNet-50", 64, 52.4, 751, 2, 2, HELD_OUT),
    _tf_cnn(_RESNET152, "ResNet-152", 32, 19.4, 291, 2, 2, HELD_OUT),
    _tf_cnn(_INCEPTION, "Inception-v3", 64, 29.7, 902, 4, 4, HELD_OUT),
    _tf_cnn(_RESNET50, "ResNet-50", 64, 52.4, 1388, 4, 4, HELD_OUT),
    _tf_cnn(_RESNET152, "ResNet-152", 32, 19.4, 565, 4, 4, HELD_OUT),
    # 2 x 4 M40, 9.3 Gbit/s measured, distributed_replicated (towers); PS: one per host (assumed, as
    # tf_cnn_benchmarks' page); host bus: one PCIe root (assumed: not stated).
    Case(
        TF_BENCH_29,
        _RESNET50,
        "ResNet-50",
        64,
        111.0,
        561.0,
        2,
        2,
        dict(gpus_per_host=4, towers=True, ps_hosts=cost.COLOCATED, link_gbit=9.3, host_bus=PCIE),
        split=HELD_OUT,
    ),
)


def _vs_one_host(run, strategy: cost.Strategy, split: str, note: str, host_bus: str = NVLINK) -> Case:
    """A run scaled against one host: an NCCL ring, one process per GPU, GPUs joined by `host_bus`.

    One GPU's step is the one-host rate over its GPUs; scaling is against
    one host (each end of the interval over the same end's one-host
    prediction, so the host's own all-reduce counts on both sides).
    """
    shape = dict(gpus_per_host=run.gpus_per_host, towers=False, link_gbit=run.link_gbit, host_bus=host_bus)
    one_gpu = run.one_host_images_per_sec / run.gpus_per_host
    return Case(
        run.source,
        run.gin_files,
        run.model,
        run.batch_size,
        one_gpu,
        run.images_per_sec,
        run.hosts,
        0,
        shape,
        strategy,
        split,
        note,
        one_host_images_per_sec=run.one_host_images_per_sec,
    )


def _cloud(run: cloud_tcp.CloudRun) -> Case:
    """A run of `cloud_tcp`: Horovod's NCCL ring over TCP."""
    strategy = dataclasses.replace(_HOROVOD, transport=NCCL_TCP)
    return _vs_one_host(run, strategy, CLOUD_TCP, cloud_tcp.NOTES[run.source])


def _ring(run: ring_runs.RingRun, split=RING, notes=ring_runs.NOTES, host_bus=NVLINK) -> Case:
    """A run of `ring_runs` (or a set laid out as it): NCCL's ring over its transport, in its buckets.

    A bucket of 0 MB (a source's threshold 0: every tensor reduced on its
    own) is one byte here: the cost model caps buckets at the model's tensors.
    """
    bucket = max(1, int(run.bucket_mib * 2**20))
    strategy = cost.Strategy(cost.ALLREDUCE, bucket_bytes=bucket, transport=TRANSPORTS[run.transport])
    return _vs_one_host(run, strategy, split, notes[run.source], host_bus)


CLOUD_TCP_CASES = tuple(_cloud(run) for run in cloud_tcp.RUNS)
RING_CASES = tuple(_ring(run) for run in ring_runs.RUNS)
# The fourth set's hosts: 4 GPUs on PCIe, as its source states (heldout_runs4's note; one root assumed).
PCIE_RING_CASES = tuple(_ring(run, PCIE_RINGS, heldout_runs4.NOTES, PCIE) for run in heldout_runs4.RUNS)
CASES = CALIBRATION_CASES + HELD_OUT_CASES + CLOUD_TCP_CASES + RING_CASES + PCIE_RING_CASES


@dataclasses.dataclass(frozen=True)
class Result:
    """A case predicted: its interval, and the efficiencies in the case's own terms (low, middle, high).

    `predicted` is the interval's efficiencies, or, for a case scaled
    against one host, each over the same end's prediction for one host.
    """

    case: Case
    interval: interval.Interval
    predicted: tuple[float, float, float]
    bytes_only: cost.Prediction  # without the PS-process ceiling (Constants.ps_cores=None)
    model: cost.Model

    @property
    def prediction(self) -> cost.Prediction:
        return self.interval.middle

    @property
    def error(self) -> float:
        return self.predicted[1] / self.case.published_efficiency - 1

    @property
    def inside(self) -> bool:
        return self.predicted[0] <= self.case.published_efficiency <= self.predicted[2]


def predict_case(
    case: Case,
    model: cost.Model,
    constants: cost.Constants = cost.DEFAULTS,
    spreads=transports.SPREADS,
    error: float | None = None,
) -> Result:
    """error: the planner's own error (`interval.MODEL_ERROR` when None; 0: the spread alone)."""
    shape = cost.Shape(hosts=case.hosts, ps=case.ps, **case.shape)
    error = interval.MODEL_ERROR if error is None else error
    iv = interval.predict(model, shape, case.strategy, spreads, constants, error=0.0)
    predicted = iv.efficiencies
    if case.one_host_images_per_sec is not None:  # each end of the spread over the same end for one host
        one = interval.predict(
            model, dataclasses.replace(shape, hosts=1), case.strategy, spreads, constants, error=0.0
        )
        predicted = tuple(n / o for n, o in zip(predicted, one.efficiencies, strict=True))
    predicted = interval.widen(predicted, error)  # the planner's own error, in the case's terms
    iv = interval.with_error(iv, error)
    loose = cost.predict(model, shape, case.strategy, dataclasses.replace(constants, ps_cores=None))
    return Result(case, iv, predicted, loose, model)


def predict_all(load_config: Callable, cases=CASES) -> list[Result]:
    """Every case; `load_config(gin_files, bindings)` parses gin (the script's edge does it)."""
    from disttrain.plan import models  # TensorFlow: only when runs are predicted

    built: dict[tuple[tuple[str, ...], int], cost.Model] = {}
    out = []
    for case in cases:
        key = (case.gin_files, case.batch_size)
        if key not in built:
            config = load_config(list(case.gin_files), [f"TrainConfig.batch_size={case.batch_size}"])
            built[key] = models.model_from_config(config, 1.0, case.model)
        model = built[key].replace(step_time=case.batch_size / case.one_gpu_images_per_sec)
        out.append(predict_case(case, model))
    return out


@dataclasses.dataclass(frozen=True)
class Summary:
    """A split's errors and coverage, computed from its rows' predictions (never stored)."""

    rows: int
    median_abs_error: float
    max_abs_error: float
    within_15: int
    within_25: int
    inside: int  # published figure inside [low, high]


def summary(results: list[Result]) -> Summary:
    errors = [abs(r.error) for r in results]
    if not errors:
        return Summary(0, 0.0, 0.0, 0, 0, 0)
    return Summary(
        len(errors),
        statistics.median(errors),
        max(errors),
        sum(e <= 0.15 for e in errors),
        sum(e <= 0.25 for e in errors),
        sum(r.inside for r in results),
    )


def _summary_line(name: str, s: Summary) -> str:
    return (
        f"{name} ({s.rows} runs): inside the interval {s.inside} of {s.rows}; middle: median |error| "
        f"{100 * s.median_abs_error:.0f}%, max {100 * s.max_abs_error:.0f}%, {s.within_15} within 15%, "
        f"{s.within_25} within 25%"
    )


def _sources(results: list[Result]) -> list[str]:
    return list(dict.fromkeys(r.case.source for r in results))


def _row(r: Result, tags: dict[str, str]) -> str:
    c = r.case
    layout = f"{c.ps} PS" if c.ps else "ring"
    per = "towers" if c.shape["towers"] else "per GPU"
    low, middle, high = r.predicted
    versus = "host" if c.one_host_images_per_sec is not None else "GPU"
    return (
        f"[{tags[c.source]}] {c.model:12s} {c.gpus:4d} {c.hosts:3d}x{c.shape['gpus_per_host']:<2d} "
        f"{layout:5s} {per:7s} {c.transport:9s} {c.shape['link_gbit']:5g} {c.batch_size:5d} {versus:4s} "
        f"{c.published_efficiency:9.3f} {low:6.3f} {middle:6.3f} {high:6.3f} "
        f"{'yes' if r.inside else 'NO':>3s} {100 * r.error:+6.0f}%  {r.prediction.bottleneck}"
        + (f"; width: {r.interval.driver}" if r.interval.driver else "")
        + ("  (ps_cores fitted here)" if c.calibrated else "")
    )


def table(results: list[Result]) -> str:
    """Each split apart with its coverage and errors, all held-out runs together, then every source."""
    tags = {source: chr(ord("A") + i) for i, source in enumerate(_sources(results))}
    header = (
        f"{'src':3s} {'model':12s} {'GPUs':>4s} {'hosts':>6s} {'layout':5s} {'workers':7s} {'transport':9s} "
        f"{'Gbit':>5s} {'batch':>5s} {'vs':4s} {'published':>9s} {'low':>6s} {'middle':>6s} {'high':>6s} "
        f"{'in?':>3s} {'error':>7s}  bottleneck (middle); what drives the width"
    )
    lines = []
    for split in (CALIBRATION, *HELD_OUT_SPLITS):
        rows = [r for r in results if r.case.split == split]
        if rows:
            lines += [
                _summary_line(f"{split} set", summary(rows)),
                header,
                *(_row(r, tags) for r in rows),
                "",
            ]
    held = [r for r in results if r.case.split in HELD_OUT_SPLITS]
    if held:
        s = summary(held)
        lines += [
            _summary_line("all held-out runs", s)
            + f" (inside: {_pct(s.inside, s.rows)}, middle within 25%: {_pct(s.within_25, s.rows)};"
            " the targets: 80% each)",
            "",
        ]
    lines.append(
        "efficiency: images/s over GPUs x one GPU's published rate (vs GPU), or over hosts x one host's "
        "(vs host), or as published; low and high: the transport's constants at their least and most "
        "favourable published environment, or the middle moved by the planner's own error on its calibration "
        f"runs ({100 * interval.MODEL_ERROR:.0f}%), whichever is farther (docs/planner.md)"
    )
    lines.append("sources:")
    lines += [f"  [{tag}] {source}" for source, tag in tags.items()]
    lines.append("transports and host buses:")
    lines += [f"  {name}: {source}" for name, source in TRANSPORT_SOURCES.items()]
    lines += [f"  {name}: {source}" for name, source in HOST_BUS_SOURCES.items()]
    return "\n".join(lines)


def _pct(count: int, rows: int) -> str:
    return f"{100 * count / rows:.0f}%" if rows else "-"


def seed_answer(result: Result) -> tuple[cost.Prediction, interval.Interval, list[str]]:
    """The seed's cluster with disttrain: its placement alone, then the best changes one after another.

    Returns (the same layout with disttrain's placement, the recommended layout's interval, the changes).
    """
    strategy = dataclasses.replace(result.prediction.strategy, placement=cost.DISTTRAIN)
    same = cost.predict(result.model, result.prediction.shape, strategy)
    best, steps = advice.best_layout(result.model, result.prediction.shape, strategy)
    return same, best, steps


def answers_table(results: list[Result]) -> str:
    """The seed's 128-GPU cases with disttrain: the same layout, a PS layout with towers, the best one."""
    lines = ["the seed's cluster with disttrain (predicted efficiency, synchronous as the seed ran):"]
    for r in results:
        if r.case.source != SEED or r.case.calibrated:
            continue
        same, best, steps = seed_answer(r)
        shape = dataclasses.replace(r.prediction.shape, towers=True)
        towers = cost.predict(
            r.model, shape, dataclasses.replace(r.prediction.strategy, placement=cost.DISTTRAIN)
        )
        lines.append(
            f"  {r.case.model:13s} TF default {r.prediction.efficiency:.3f}; disttrain's placement alone "
            f"{same.efficiency:.3f}; + towers (sync PS, {shape.ps} PS) {towers.efficiency:.3f}; "
            f"recommended {best.middle.efficiency:.3f} ({best.middle.examples_per_sec:.0f} img/s; "
            f"{best.low.efficiency:.3f}-{best.high.efficiency:.3f}): "
            + "; ".join(steps)
            + f" -> {best.middle.strategy.describe()}, bottleneck {best.middle.bottleneck}"
        )
    return "\n".join(lines)
