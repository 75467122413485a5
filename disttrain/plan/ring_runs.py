"""Deprecated: the NCCL rings held-out runs are data now (`plan/data/`, read by `plan.runs`).

`runs.ring_runs(runs.RING)` gives these runs, `runs.notes(runs.RING)` their
sources' notes, `runs.citations()` the sources.
"""

from __future__ import annotations

import warnings

from disttrain.plan import runs, transports

warnings.warn(
    "disttrain.plan.ring_runs is deprecated: use disttrain.plan.runs (ring_runs, notes, citations)",
    DeprecationWarning,
    stacklevel=2,
)

RingRun = runs.RingRun
NCCL_TCP, NCCL_RDMA = transports.NCCL_TCP.name, transports.NCCL_RDMA.name
HOROVOD_FUSION_MIB = 64  # Horovod's default fusion buffer (HOROVOD_FUSION_THRESHOLD, 64 MB)
DDP_BUCKET_MIB = 25  # DistributedDataParallel's default bucket_cap_mb
_CITED = runs.citations()
DLPERF = _CITED["dlperf"]
PYTORCH_DDP_BENCH = _CITED["pytorch_ddp_benchmark"]
HOROVOD_2581 = _CITED["horovod_2581"]
NOTES = runs.notes(runs.RING)
RUNS = runs.ring_runs(runs.RING)
