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

Searched (2026-11-27, with the issues, code, docs and pages corpora, reading
files whole where the code corpus holds them): Horovod issues on multi-node
throughput and scaling (2 / 4 / 8 nodes, "slower than one node", AWS p3 /
p3dn / EFA, Azure, GCP, RoCE, InfiniBand, 10 GbE), PyTorch DDP issues and
PRs with per-node rates, BytePS issues and docs comparing against Horovod,
NVIDIA DeepLearningExamples and other benchmark READMEs with multi-node
tables, vendor white papers and blogs (Dell EMC, AWS, Lambda), and papers in
the pages corpus. As in the earlier sets, the figures were seen while
collecting; no row was predicted.

Found under the rule: HKBU-HPML/ddl-benchmarks (the benchmark repository of
Shi et al., arXiv 2005.13247), ResNet-50 with the authors' Horovod optimizer
in its two fixed-bucket modes, on 2, 4 and 8 hosts of 4 GPUs over 10 GbE
(TCP), 100 Gb InfiniBand (RDMA) and TCP over the same 100 Gb NICs: 18 rows.
Its GPUs' number per host (the hostfiles' "slots=4") and their bus (PCIe:
the runs' log prefix "pcie") are stated; their kind is not (the README
refers to the paper, which the corpora hold only as an abstract). That is
read here as stating the hosts' GPUs, because the planner takes one GPU's
step from the stated one-host rate and never from the GPU's kind; a stricter
reading leaves all 18 rows out (see the note).

Found and left out, and why:
- ddl-benchmarks' MG-WFBP and ByteScheduler-A2A rows (the buckets are chosen
  at run time by a cost model, or tensors are partitioned and reordered by
  priority: no fixed bucket the planner can describe), its BSP-PS, WFBP-PS
  and ByteScheduler-PS rows (BytePS parameter servers, not an NCCL ring) and
  its BERT rows (not a zoo model).
- Oneflow-Inc/DLPerf's per-framework READMEs (e.g. MxNet/Classification/
  RN50v1b, gluon-cv with Horovod, FP32): the same test campaign and cluster
  as the report `ring_runs` used, and those READMEs do not state the link
  (only the used report does).
- horovod#416 (2 x 8 V100, RoCE 40 Gbit/s, ResNet-101, fp32, batch 64): the
  one-host rate is given for 4 GPUs ("1-4"), not for the 8 per host of the
  16-GPU run; the 16-GPU run is scaled against one GPU.
- horovod#659 (1 RTX 2080 per host, 10 Gbit/s, ResNet-101, real data: 172
  and 291 images/s): the per-GPU batch and the script are not stated, nor
  whether Horovod 0.15 was built with NCCL.
- skypilot-org/skypilot examples/torch_ddp_benchmark (GCP, A100:8, DDP,
  ResNet-101 batch 32, 1M/8G and 2M/8G): the link's kind and rate are not
  stated (only 'cloud: gcp' and 'A100:8').
- horovod#21 (speed-ups against one GPU only in the text returned),
  horovod#2869 (rates only in screenshots), bytedance/byteps docs/
  performance.md and msalvaris/BatchAIHorovodBenchmark (figures only as
  charts), pytorch#17159 (BERT), pytorch#36298 and nccl#318 (a language
  model, times only), Dell EMC's scale-out white papers (rates in charts;
  the text returned gives speed-ups against one GPU or against another
  server), the AWS blog "Scalable multi-node deep learning training using
  GPUs in the AWS Cloud" (only its opening was returned: no rate as text).
- Excluded whatever they hold, because `ring_runs` or BUILD_NOTES list them
  as used or left out (some came back in the searches): horovod#288,
  #476, #547, #693, tensorflow/benchmarks#212 and #247, byteps#29, and
  every source of `published`, `cloud_tcp` and `ring_runs`.
"""

from __future__ import annotations

from disttrain.plan import ring_runs

RingRun = ring_runs.RingRun
NCCL_TCP, NCCL_RDMA = ring_runs.NCCL_TCP, ring_runs.NCCL_RDMA

_DDL_BENCH = (
    "github.com/HKBU-HPML/ddl-benchmarks results/2020-05-29/README.md (the repository of arXiv 2005.13247): "
    "'DNN | BS | CONNECTION | METHOD | 1 GPU | 4 GPUs | 8 GPUs | 16 GPUs | 32 GPUs', "
)
DDL_BENCH_10GBE = _DDL_BENCH + (
    "'ResNet-50 | 64 | 10GbE with TCP/IP | BSP-A2A | 253.1 | 925.020 +- 4.42 | 1282.280 +- 1.94 | "
    "2485.120 +- 4.27 | 4920.820 +- 4.43', 'ResNet-50 | 64 | 10GbE with TCP/IP | WFBP-A2A | 253.1 | "
    "1015.400 +- 1.26 | 1795.740 +- 2.67 | 3146.780 +- 4.72 | 5113.180 +- 14.01' (img/s, all GPUs)"
)
DDL_BENCH_100GBIB = _DDL_BENCH + (
    "'ResNet-50 | 64 | 100GbIB with RDMA | BSP-A2A | 253.1 | 920.280 +- 2.68 | 1821.200 +- 4.28 | "
    "3602.900 +- 7.03 | 7126.520 +- 15.78', 'ResNet-50 | 64 | 100GbIB with RDMA | WFBP-A2A | 253.1 | "
    "1014.280 +- 1.13 | 2017.120 +- 3.96 | 3946.060 +- 11.07 | 7326.560 +- 12.13' (img/s, all GPUs)"
)
DDL_BENCH_100GBE = _DDL_BENCH + (
    "'ResNet-50 | 64 | 100GbE with TCP/IP | BSP-A2A | 253.1 | 926.000 +- 4.03 | 1601.360 +- 24.00 | "
    "3087.160 +- 16.60 | 5744.760 +- 62.88', 'ResNet-50 | 64 | 100GbE with TCP/IP | WFBP-A2A | 253.1 | "
    "1015.100 +- 1.56 | 1985.740 +- 2.59 | 3650.740 +- 19.21 | 6141.380 +- 21.40' (img/s, all GPUs)"
)

# What the repository states, for all three connections (scripts at 565964a, the table at 30de09b).
_DDL_SETUP = (
    "Hosts: 4 GPUs each ('gpu8 slots=4', 'gpu7 slots=4', ... in configs/cluster8, 16, 32; "
    "NVIDIA_VISIBLE_DEVICES=0,1,2,3), on PCIe (benchmarks.py logs under 'pcie'); 8, 16 and 32 GPUs are "
    "2, 4 and 8 hosts; the 4-GPU column is one host (assumed: configs/cluster4 is not in the repository, "
    "every other hostfile gives 4 slots a host). The GPUs' kind is not stated in the repository "
    "(assumed irrelevant: one GPU's step is the one-host rate over its 4 GPUs). PyTorch 1.4 "
    "(configs/envs.conf), Horovod 0.19+, NCCL 2.4+ (README). mgwfbp/imagenet_benchmark.py: torchvision "
    "resnet50, fixed random input on the GPU (synthetic), SGD, float32 (its '--fp16' flag, off by "
    "default, is not passed), HOROVOD_FUSION_THRESHOLD=0 and HOROVOD_CYCLE_TIME=0 (Horovod's own fusion "
    "off); its optimizer (mgwfbp/hv_distributed_optimizer.py) copies gradients into groups and calls "
    "Horovod's allreduce_async_ when a group is complete. WFBP-A2A: threshold 0, every gradient tensor "
    "its own all-reduce as backprop yields it (bucket 0 MB); BSP-A2A: threshold 536870912 elements "
    "(2 GiB of float32), all gradients in one buffer reduced after the whole backprop (bucket 2048 MB). "
    "Rates: the mean of 5 runs (benchmarks.py NUM_OF_TRIES=5, extract_log's mean +- std), no percentile"
)

# The inputs each source leaves unsaid, as assumed before any row was predicted.
NOTES = {
    DDL_BENCH_10GBE: _DDL_SETUP + "; horovod_mpi_cj.sh rdma=0: NCCL_IB_DISABLE=1, NCCL over TCP sockets on "
    "NCCL_SOCKET_IFNAME=enp136s0f0,enp137s0f0 (two Ethernet ports named: whether both carried traffic is "
    "not stated; the link taken as the table's 10 Gbit/s)",
    DDL_BENCH_100GBIB: _DDL_SETUP + "; rdma=1: NCCL_IB_DISABLE=0 on ib0, NCCL over the 100 Gbit/s "
    "InfiniBand (RDMA; GPUDirect not stated)",
    DDL_BENCH_100GBE: _DDL_SETUP + "; rdma=2: NCCL_IB_DISABLE=1 with NCCL_SOCKET_IFNAME=ib0 and GDR off: "
    "NCCL over TCP sockets on the same 100 Gbit/s InfiniBand NICs (IP over InfiniBand; the table calls it "
    "'100GbE with TCP/IP')",
}

_RESNET50 = ("resnet50_sync.gin",)
WFBP_BUCKET_MIB = 0.0  # threshold 0: every gradient tensor reduced on its own
BSP_BUCKET_MIB = 2048.0  # threshold 536870912 float32 elements: one buffer of all gradients


def _ddl(source, one_host, rates, link_gbit, transport, bucket_mib, gpus=4):
    """One ResNet-50 line of the table (batch 64): its rates at 8, 16 and 32 GPUs, i.e. 2, 4 and 8 hosts."""
    return tuple(
        RingRun(
            source,
            "ResNet-50",
            _RESNET50,
            64,
            n // gpus,
            rate,
            one_host,
            gpus,
            link_gbit,
            transport,
            bucket_mib,
        )
        for n, rate in zip((8, 16, 32), rates, strict=True)
    )


RUNS: tuple[RingRun, ...] = (
    *_ddl(DDL_BENCH_10GBE, 925.020, (1282.280, 2485.120, 4920.820), 10.0, NCCL_TCP, BSP_BUCKET_MIB),
    *_ddl(DDL_BENCH_10GBE, 1015.400, (1795.740, 3146.780, 5113.180), 10.0, NCCL_TCP, WFBP_BUCKET_MIB),
    *_ddl(DDL_BENCH_100GBIB, 920.280, (1821.200, 3602.900, 7126.520), 100.0, NCCL_RDMA, BSP_BUCKET_MIB),
    *_ddl(DDL_BENCH_100GBIB, 1014.280, (2017.120, 3946.060, 7326.560), 100.0, NCCL_RDMA, WFBP_BUCKET_MIB),
    *_ddl(DDL_BENCH_100GBE, 926.000, (1601.360, 3087.160, 5744.760), 100.0, NCCL_TCP, BSP_BUCKET_MIB),
    *_ddl(DDL_BENCH_100GBE, 1015.100, (1985.740, 3650.740, 6141.380), 100.0, NCCL_TCP, WFBP_BUCKET_MIB),
)
