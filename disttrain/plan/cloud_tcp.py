"""A second held-out set: published multi-host runs on cloud VMs over TCP, as the sources give them.

Pure data, committed on its own before any code predicted a row of it (the
git history is the proof). The rule that chose the rows, written before any
was predicted: every run found, in public sources the planner had not used
(not in `published.py`), of a model of the zoo trained data-parallel on
several cloud VMs whose hosts talk over TCP (NCCL's socket transport or
TF's gRPC), whose source states the instance type and gives as text both
the multi-host throughput and the one-host throughput it is scaled against.
No row found so was left out, whatever its figure: two threads (horovod#396)
report runs their authors suspected of a poor network set-up; they stay in,
because a planner that is asked about a rented cluster meets such set-ups.

Every row is AWS p3.16xlarge: 8 V100
SXM2 joined by NVLink, 25 Gbit/s Ethernet, Horovod's NCCL all-reduce over
TCP (no EFA or RDMA on p3.16xlarge), one process per GPU.

Scaling is against one host, as every source gives it: the rate at N hosts
over N x the rate of one host with the same GPUs. Inputs the sources do not
state are marked "assumed" in each source's note.
"""

from __future__ import annotations

import dataclasses

P3_16XLARGE = "AWS p3.16xlarge: 8 V100-SXM2 16 GB joined by NVLink, 25 Gbit/s"

HOROVOD_396_WSKINNER = (
    "github.com/horovod/horovod/issues/396 (wskinner, 2018-07-22): 'TF 1.8, CUDA 9.0, ResNet50 from "
    "TensorFlow Benchmarks', '1 p3.16xlarge: 2697.29 images/sec', '2 p3.16xlarge: 2632.95 images/sec', "
    "'4 p3.16xlarge: 4772.04 images/sec', '8 p3.16xlarge: 9745.38 images/sec'"
)
HOROVOD_396_RICHARDLIAW = (
    "github.com/horovod/horovod/issues/396 (richardliaw, 2018-07-23): 'I used ResNet101, but speedup seems "
    "very similar - (p3.16xlarge)', 'GPUs | 4 | 8 | 16 | 32 | 64 | 128', "
    "'Horovod | 792.41 | 1523 | 1529 | 2958 | 5806 | 11384'"
)
AWS_SAMPLES_2 = (
    "github.com/aws-samples/deep-learning-models/issues/2 (markmp, 2018-09-13): 'run using the DL AMI "
    "(Version 13, Ubuntu/Conda) on p3 instances', 'default params (90 epochs, 256 batch size, etc.)', "
    "'1x8 GPU: 5000 img/sec', '2x8 GPU (16 GPUs total): 9860 imgs/sec', '4x8 GPU (32 GPUs total): "
    "21300 imgs/sec', '8x8 GPU (64 GPUs total): ~37000 imgs/sec'"
)
HOROVOD_779 = (
    "github.com/horovod/horovod/issues/779 (Jeffwan, 2019-01-25): 'Synthetic metrics', 'GPU | ResNet50', "
    "'8 | 6679', '16 | 12828', '32 | 23870', '64 | 47195', '128 | 89783', "
    "'Instance Type: 2 x p3.16xlarge (25Gbps)'"
)
HOROVOD_871 = (
    "github.com/horovod/horovod/issues/871 (Jeffwan, 2019-02-28): 'AWS P3.16xlarge V100-SXM2 16GB in "
    "placement group', 'I am trying to reproduce Resnet50 benchmark on kubernetes cluster with real "
    "data set', '8 Gpus 750.3/gpu 6001.19/total', "
    "'16 Gpus 693.3/gpu 11090.10/total', '32 Gpus 584.3/gpu 18695.00/total'"
)

# The inputs each source leaves unsaid, as assumed before any row was predicted.
NOTES = {
    HOROVOD_396_WSKINNER: "tf_cnn_benchmarks' defaults assumed: batch 64, float32 (2697/8 = 337 img/s per "
    "V100 is float32's rate); Horovod's 64 MB fusion buffer",
    HOROVOD_396_RICHARDLIAW: "tf_cnn_benchmarks' defaults assumed: batch 64, float32; the one-host rate is "
    "the 8-GPU column",
    AWS_SAMPLES_2: "the repository's script at ed46301 (2018-09-04): ResNet-50, batch 256 per GPU, --fp16 "
    "(float16 compute on float32 variables: float32 gradients), hvd.DistributedOptimizer(opt) with no "
    "compression, NCCL_MIN_NRINGS=4, real ImageNet data",
    HOROVOD_779: "assumed the aws-samples script (its author worked on it; 872 img/s per V100 is its float16 "
    "rate): batch 256, float32 gradients; synthetic data",
    HOROVOD_871: "assumed the aws-samples script as in horovod#779: batch 256, float32 gradients; real data",
}


@dataclasses.dataclass(frozen=True)
class ScaledRun:
    """One published run on N hosts, its rate, and one host's rate it scales against (whole-cluster rates)."""

    source: str
    model: str  # as the zoo names it in published.py
    gin_files: tuple[str, ...]
    batch_size: int  # per GPU
    hosts: int
    images_per_sec: float
    one_host_images_per_sec: float

    @property
    def scaling(self) -> float:
        """The published scaling against one host: rate / (hosts x one host's rate)."""
        return self.images_per_sec / (self.hosts * self.one_host_images_per_sec)


@dataclasses.dataclass(frozen=True)
class CloudRun(ScaledRun):
    """A run of this set: N hosts of the same instance."""

    gpus_per_host: int = 8
    link_gbit: float = 25.0
    instance: str = P3_16XLARGE


_RESNET50 = ("resnet50_sync.gin",)
_RESNET101 = ("gin/models/resnet101.gin", "gin/strategies/sync_ps.gin")


def _runs(source, model, gin_files, batch, one_host, rates):
    return tuple(CloudRun(source, model, gin_files, batch, hosts, rate, one_host) for hosts, rate in rates)


RUNS: tuple[CloudRun, ...] = (
    *_runs(
        HOROVOD_396_WSKINNER, "ResNet-50", _RESNET50, 64, 2697.29, ((2, 2632.95), (4, 4772.04), (8, 9745.38))
    ),
    *_runs(
        HOROVOD_396_RICHARDLIAW,
        "ResNet-101",
        _RESNET101,
        64,
        1523.0,
        ((2, 1529.0), (4, 2958.0), (8, 5806.0), (16, 11384.0)),
    ),
    *_runs(AWS_SAMPLES_2, "ResNet-50", _RESNET50, 256, 5000.0, ((2, 9860.0), (4, 21300.0), (8, 37000.0))),
    *_runs(
        HOROVOD_779,
        "ResNet-50",
        _RESNET50,
        256,
        6679.0,
        ((2, 12828.0), (4, 23870.0), (8, 47195.0), (16, 89783.0)),
    ),
    *_runs(HOROVOD_871, "ResNet-50", _RESNET50, 256, 6001.19, ((2, 11090.10), (4, 18695.00))),
)
