"""A third held-out set: published multi-host runs of zoo models over NCCL's ring, as the sources give them.

Pure data, committed on its own before any code predicted a row of it (the
git history is the proof: the rule below was committed before any row, the
rows before `published` read them). The rule that chose the rows, written
before any row was added:

every run found, in public sources the planner had not used (not in
`published` or `cloud_tcp`), of a model of the zoo trained data-parallel on
several hosts with NCCL's ring all-reduce (over TCP sockets or RDMA), whose
source states as text the hosts' GPUs, the link (its kind and rate), the
per-GPU batch, float32 training, and both the multi-host throughput and the
one-host throughput of the same set-up it scales against; and whose
all-reduce the planner can describe: Horovod (its fusion buffer, 64 MB by
default) or PyTorch's DistributedDataParallel (`bucket_cap_mb`, 25 by
default, or as the source sets it). Left out by the rule: mixed-precision
runs (whether their gradients cross the links in 16 or 32 bits is not
stated), and frameworks whose bucketing the sources leave unsaid (TF 2's
MultiWorkerMirroredStrategy, PaddlePaddle, OneFlow). Where a source gives
percentiles, the median; where it gives none, its lowest percentile. No row
found under the rule was left out, whatever its figure.

Scaling is against one host, as every source gives it: the rate at N hosts
over N x the rate of one host with the same GPUs. Inputs the sources do not
state are marked "assumed" in each source's note.
"""

from __future__ import annotations

import dataclasses

from disttrain.plan import cloud_tcp

NCCL_TCP, NCCL_RDMA = "nccl_tcp", "nccl_rdma"
HOROVOD_FUSION_MIB = 64  # Horovod's default fusion buffer (HOROVOD_FUSION_THRESHOLD, 64 MB)
DDP_BUCKET_MIB = 25  # DistributedDataParallel's default bucket_cap_mb


@dataclasses.dataclass(frozen=True)
class RingRun(cloud_tcp.ScaledRun):
    """A run of this set: N hosts of the same kind, joined by a link of `link_gbit`, over `transport`.

    images_per_sec and one_host_images_per_sec are whole-cluster rates (a
    source that gives a rate per GPU is multiplied by its GPUs here).
    """

    gpus_per_host: int
    link_gbit: float
    transport: str  # NCCL_TCP or NCCL_RDMA
    bucket_mib: float  # Horovod's fusion buffer or DDP's bucket_cap_mb


DLPERF = (
    "github.com/Oneflow-Inc/DLPerf reports/dlperf_benchmark_test_report_v1.md (tests of Aug 2020): '4 Nodes "
    "with 8x Tesla V100-SXM2-16GB GPUs', 'InfiniBand 100 Gb/sec (4X EDR)', 'ResNet50 V1.5', "
    "'batch size = 128, FP32 & Without XLA', node num 1 / 2 / 4: TensorFlow 1.x (DALI+Horovod) "
    "'2721.98 | 5099.42 | 9514.64', "
    "MXNet (DALI+Horovod, 'bsz=96') '2947.72 | 5684.68 | 10419.21', PyTorch (pytorch/examples, DALI) "
    "'2719.07 | 5307.21 | 10632.33' img/s"
)
PYTORCH_DDP_BENCH = (
    "github.com/pytorch/pytorch benchmarks/distributed/ddp/README.md (PR #30660, 2019-12): '8 DGX machines "
    "with V100 GPUs', '(4x 100Gb InfiniBand per machine)', 'resnet50 with batch size 32': '8 GPUs -- 1M/8G: "
    "p50: 0.104s 307/s', '16 GPUs -- 2M/8G: p50: 0.104s 306/s'; 'resnet101 with batch size 32': '8 GPUs -- "
    "1M/8G: p50: 0.179s 179/s', '16 GPUs -- 2M/8G: p50: 0.179s 178/s' (bucket_cap_mb=25, the default); "
    "the diff against 'bucket_cap_mb=1': resnet50 '8 GPUs: p75: 0.107s 299/s', '16 GPUs: p75: 0.108s "
    "294/s'; resnet101 '8 GPUs: p75: 0.184s 173/s', '16 GPUs: p75: 0.187s 170/s' (ex/sec per GPU)"
)
HOROVOD_2581 = (
    "github.com/horovod/horovod/issues/2581 (Rivendile, 2021-01-08): 'PyTorch', 'Horovod version: 0.16.1', "
    "'AWS p3dn.24xlarge (8x V100, bandwidth 100Gbps)', 'pytorch_synthetic_benchmark.py', '--model vgg16', "
    "'the speed is 1531.9 img/sec for 8 GPUs', 'on two machines, the speed is 546.9 img/sec for 16 GPUs'"
)

# The inputs each source leaves unsaid, as assumed before any row was predicted.
NOTES = {
    DLPERF: "GPUs joined by NVLink (the report's nvidia-smi topo: NV1/NV2); NCCL over the InfiniBand (RDMA); "
    "Horovod's default 64 MB fusion for TF 1.x and MXNet, DDP's default 25 MB buckets for pytorch/examples "
    "(assumed: the report does not set them); one GPU's step from the one-host rate over its 8 GPUs",
    PYTORCH_DDP_BENCH: "DGX-1: GPUs joined by NVLink; NCCL over the InfiniBand (RDMA), 4 x 100 Gbit/s per "
    "machine taken as one 400 Gbit/s link; rates are ex/sec per GPU x GPUs; the bucket_cap_mb=1 rows are "
    "the diff's test side (its baseline is the default 25), at p75 (the diff gives no median)",
    HOROVOD_2581: "pytorch_synthetic_benchmark.py's default batch 32 per GPU, float32; NCCL over TCP sockets "
    "(assumed: no EFA plugin with Horovod 0.16.1); GPUs joined by NVLink (p3dn.24xlarge); Horovod's default "
    "64 MB fusion",
}

_RESNET50 = ("resnet50_sync.gin",)
_RESNET101 = ("gin/models/resnet101.gin", "gin/strategies/sync_ps.gin")
_VGG16 = ("vgg16_sync.gin",)


def _runs(source, model, gin_files, batch, one_host, rates, link_gbit, transport, bucket_mib, gpus=8):
    return tuple(
        RingRun(
            source, model, gin_files, batch, hosts, rate, one_host, gpus, link_gbit, transport, bucket_mib
        )
        for hosts, rate in rates
    )


def _per_gpu(one_host: float, rates, gpus=8):
    """(one host's rate, ((hosts, rate), ...)) from rates per GPU, as the DDP benchmark prints them."""
    return one_host * gpus, tuple((hosts, rate * hosts * gpus) for hosts, rate in rates)


_DDP_R50_25 = _per_gpu(307.0, ((2, 306.0),))
_DDP_R101_25 = _per_gpu(179.0, ((2, 178.0),))
_DDP_R50_1 = _per_gpu(299.0, ((2, 294.0),))
_DDP_R101_1 = _per_gpu(173.0, ((2, 170.0),))

RUNS: tuple[RingRun, ...] = (
    *_runs(DLPERF, "ResNet-50", _RESNET50, 128, 2721.98, ((2, 5099.42), (4, 9514.64)), 100.0, NCCL_RDMA, 64),
    *_runs(DLPERF, "ResNet-50", _RESNET50, 96, 2947.72, ((2, 5684.68), (4, 10419.21)), 100.0, NCCL_RDMA, 64),
    *_runs(DLPERF, "ResNet-50", _RESNET50, 128, 2719.07, ((2, 5307.21), (4, 10632.33)), 100.0, NCCL_RDMA, 25),
    *_runs(PYTORCH_DDP_BENCH, "ResNet-50", _RESNET50, 32, *_DDP_R50_25, 400.0, NCCL_RDMA, 25),
    *_runs(PYTORCH_DDP_BENCH, "ResNet-101", _RESNET101, 32, *_DDP_R101_25, 400.0, NCCL_RDMA, 25),
    *_runs(PYTORCH_DDP_BENCH, "ResNet-50", _RESNET50, 32, *_DDP_R50_1, 400.0, NCCL_RDMA, 1),
    *_runs(PYTORCH_DDP_BENCH, "ResNet-101", _RESNET101, 32, *_DDP_R101_1, 400.0, NCCL_RDMA, 1),
    *_runs(HOROVOD_2581, "VGG16", _VGG16, 32, 1531.9, ((2, 546.9),), 100.0, NCCL_TCP, 64),
)
