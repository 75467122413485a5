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

NCCL_TCP, NCCL_RDMA = "nccl_tcp", "nccl_rdma"
HOROVOD_FUSION_MIB = 64  # Horovod's default fusion buffer (HOROVOD_FUSION_THRESHOLD, 64 MB)
DDP_BUCKET_MIB = 25  # DistributedDataParallel's default bucket_cap_mb


@dataclasses.dataclass(frozen=True)
class RingRun:
    """One published run: N hosts of the same kind, its rate, and one host's rate it scales against.

    images_per_sec and one_host_images_per_sec are whole-cluster rates (a
    source that gives a rate per GPU is multiplied by its GPUs here).
    """

    source: str
    model: str  # as the zoo names it in published.py
    gin_files: tuple[str, ...]
    batch_size: int  # per GPU
    hosts: int
    images_per_sec: float
    one_host_images_per_sec: float
    gpus_per_host: int
    link_gbit: float
    transport: str  # NCCL_TCP or NCCL_RDMA
    bucket_mib: float  # Horovod's fusion buffer or DDP's bucket_cap_mb

    @property
    def scaling(self) -> float:
        """The published scaling against one host: rate / (hosts x one host's rate)."""
        return self.images_per_sec / (self.hosts * self.one_host_images_per_sec)


# The inputs each source leaves unsaid, as assumed before any row was predicted.
NOTES: dict[str, str] = {}

RUNS: tuple[RingRun, ...] = ()
