"""A fourth held-out set: published multi-host runs of zoo models over NCCL's ring, as the sources give them.

Pure data, committed on its own before any code predicted a row of it (the
git history is the proof: the rule below was committed before any row, the
rows before anything read them; no prediction of any row was run while
collecting them). The layout is `ring_runs`' (its `RingRun`). The rule that
chose the rows, written before any row was added:

every run found, in public sources the planner has not used (not in
`published`, `cloud_tcp` or `ring_runs`, nor a source those list as left
out, nor a source the planner's transports were taken from), of a model of
the zoo (ResNet-50, ResNet-101, ResNet-152, Inception-v3, VGG16, AlexNet)
trained synchronously data-parallel on several hosts with NCCL's ring
all-reduce (over TCP sockets or RDMA) by Horovod (its fusion buffer, 64 MB
by default) or PyTorch's DistributedDataParallel (`bucket_cap_mb`, 25 by
default, or as the source sets it), whose source states as text the hosts'
GPUs, the link (its kind and rate), the per-GPU batch, float32 training,
and both the multi-host throughput and the one-host throughput of the same
set-up it scales against. Float32: stated, or, where the source says
nothing of mixed precision and the framework's default is float32, assumed
(and marked so). TF32 math on A100 (float32 storage, float32 gradients on
the link: the bytes the planner counts are the same) counts as float32 and
is marked TF32 in the source's note; float16/AMP runs are left out. Where
a source gives percentiles, the median; where it gives none, its lowest
percentile. No row found under the rule is left out, whatever its figure.

Scaling is against one host, as every source gives it: the rate at N hosts
over N x the rate of one host with the same GPUs. Inputs the sources do not
state are marked "assumed" in each source's note.
"""

from __future__ import annotations

from disttrain.plan import ring_runs

RingRun = ring_runs.RingRun
NCCL_TCP, NCCL_RDMA = ring_runs.NCCL_TCP, ring_runs.NCCL_RDMA
HOROVOD_FUSION_MIB, DDP_BUCKET_MIB = ring_runs.HOROVOD_FUSION_MIB, ring_runs.DDP_BUCKET_MIB

# The inputs each source leaves unsaid, as assumed before any row was predicted.
NOTES: dict[str, str] = {}

RUNS: tuple[RingRun, ...] = ()
