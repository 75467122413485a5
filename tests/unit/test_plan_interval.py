"""The planner's intervals (each end from a transport's spread, the constant that drives the width), the
advice ranked by the low end, the cloud TCP held-out set, and link files measured on one's own hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from disttrain.base.errors import ConfigError
from disttrain.plan import advice, cloud_tcp, cost, interval, links, published, ring_runs, transports
from tests import REPO

MB = 1e6
Point, Spread = transports.Point, transports.Spread
SHARE, PER_MESSAGE, CPU = transports.LINK_SHARE, transports.PER_MESSAGE, transports.CPU_PER_BYTE
NO_CPU = cost.Constants(rpc_cpu_s_per_byte=0.0, per_message_s=0.0, ps_cores=None)


def model(dense=100 * MB, step=0.1, tensors=8):
    return cost.Model("m", dense, step, 32, cost.even_layout(tensors), tensors)


def tcp_spread(shares=(), hops=()):
    return Spread(
        transports.NCCL_TCP,
        {SHARE: tuple(Point(v, "test") for v in shares), PER_MESSAGE: tuple(Point(v, "test") for v in hops)},
    )


def test_each_end_of_the_interval_is_the_spread_s_end():
    # A ring of 4 hosts, D = 100 MB, one bucket: 2 x 100 x 3/4 = 150 MB each way on every link, at
    # 10 Gbit/s (1.25 GB/s) x the share: middle 0.6 -> 0.2 s, low 0.3 -> 0.4 s, high 0.9 -> 0.133 s. The
    # one bucket waits for the whole backprop: a round is 0.1 s + the link + 2 x 3 hops of 9.6 us.
    ring = cost.Strategy(cost.ALLREDUCE, bucket_bytes=2**30, transport=transports.NCCL_TCP)
    iv = interval.predict(
        model(), cost.Shape(hosts=4, link_gbit=10), ring, {"nccl_tcp": tcp_spread((0.3, 0.9))}, error=0.0
    )
    link = {end: p.terms["busiest link"] for end, p in zip("lmh", (iv.low, iv.middle, iv.high), strict=True)}
    assert link == pytest.approx({"l": 150 * MB / 0.375e9, "m": 150 * MB / 0.75e9, "h": 150 * MB / 1.125e9})
    assert iv.low.round_time == pytest.approx(0.1 + 0.4 + 6 * 9.6e-6)
    assert iv.efficiencies[0] < iv.efficiencies[1] < iv.efficiencies[2]
    assert iv.driver == "nccl_tcp link share 0.30-0.90"
    assert iv.contains(iv.middle.efficiency) and not iv.contains(iv.high.efficiency + 0.01)
    # The middle is the prediction as it was: the spread only adds ends.
    assert iv.middle == cost.predict(model(), cost.Shape(hosts=4, link_gbit=10), ring)


def test_the_width_is_named_after_the_constant_that_moves_the_efficiency_most():
    # 1 MB of 1,000 tensors in 4 KiB buckets over 8 hosts: 245 buckets x 14 hops, one after another:
    # latency-bound. A hop from 9.6 us to 1 ms moves the step by seconds; a share from 0.5 to 0.7
    # moves 1.4 ms of bytes.
    tiny = cost.Strategy(cost.ALLREDUCE, bucket_bytes=4096, transport=transports.NCCL_TCP)
    spreads = {"nccl_tcp": tcp_spread((0.5, 0.7), (1e-3,))}
    iv = interval.predict(
        model(dense=1 * MB, tensors=1000), cost.Shape(hosts=8, link_gbit=10), tiny, spreads, error=0.0
    )
    assert iv.driver == "nccl_tcp cost per message or hop 9.6 us-1.00 ms"
    assert iv.low.terms["latency in path"] == pytest.approx(245 * 14 * 1e-3)
    # One large bucket of 100 MB: the bytes, not 14 hops, set the width.
    big = cost.Strategy(cost.ALLREDUCE, bucket_bytes=2**30, transport=transports.NCCL_TCP)
    iv = interval.predict(model(), cost.Shape(hosts=8, link_gbit=10), big, spreads, error=0.0)
    assert iv.driver == "nccl_tcp link share 0.50-0.70"


def test_no_spread_leaves_a_point():
    ring = cost.Strategy(cost.ALLREDUCE, transport=transports.NCCL_TCP)
    iv = interval.predict(model(), cost.Shape(hosts=4), ring, {}, error=0.0)
    assert iv.low == iv.middle == iv.high and iv.driver == ""
    # A compute-bound layout: every constant spreads, none moves it.
    slow = model(dense=1 * MB, step=10.0)
    iv = interval.predict(
        slow, cost.Shape(hosts=2, link_gbit=100), ring, {"nccl_tcp": tcp_spread((0.9,))}, error=0.0
    )
    assert iv.low.efficiency == pytest.approx(iv.high.efficiency, abs=1e-3) and iv.driver == ""


def test_grpc_with_no_transport_named_keeps_the_constants_as_its_middle():
    # The middle of a strategy naming no transport is the constants' gRPC; the spread gives the ends.
    shape = cost.Shape(hosts=2, ps=2, link_gbit=1)
    spread = Spread(transports.GRPC, {SHARE: (Point(0.5, "test"),)})
    iv = interval.predict(model(), shape, cost.Strategy(overlap=True), {cost.GRPC: spread}, NO_CPU, error=0.0)
    assert iv.middle == cost.predict(model(), shape, cost.Strategy(overlap=True), NO_CPU)
    assert iv.low.terms["busiest link"] == pytest.approx(iv.middle.terms["busiest link"] * 0.95 / 0.5)


def test_the_ps_ceiling_spreads_only_layouts_with_a_ps():
    # One PS serving 8 workers a 100 MB model at 1.4 ms/MB: 8 x 2 x 100 MB x 1.4 ms/MB = 2.24 CPU-s per
    # round, over the ceiling's 1.4 cores (middle), 0.7 (low end) and 2.8 (high end).
    grpc = Spread(transports.GRPC, {transports.PS_CORES: (Point(0.7, "test"), Point(2.8, "test"))})
    shape = cost.Shape(hosts=8, ps=1, ps_hosts=cost.DEDICATED, link_gbit=100)
    sync = cost.Strategy(cost.SYNC_PS)
    iv = interval.predict(model(tensors=1), shape, sync, {cost.GRPC: grpc}, error=0.0)
    work = 8 * (2 * 1.4e-3 * 100 + 2 * cost.DEFAULTS.per_message_s)
    ceiling = {end: p.terms["PS CPU"] for end, p in zip("lmh", (iv.low, iv.middle, iv.high), strict=True)}
    assert ceiling == pytest.approx({"l": work / 0.7, "m": work / 1.4, "h": work / 2.8})
    assert iv.driver == "grpc PS process ceiling 0.70 cores-2.80 cores"
    assert iv.middle == cost.predict(model(tensors=1), shape, sync)
    # No PS ceiling in the constants: nothing to spread. A ring has no PS: the ceiling moves nothing.
    loose = cost.Constants(ps_cores=None)
    iv = interval.predict(model(tensors=1), shape, sync, {cost.GRPC: grpc}, loose, error=0.0)
    assert iv.low.efficiency == iv.middle.efficiency == iv.high.efficiency and iv.driver == ""
    ring = interval.predict(
        model(),
        cost.Shape(hosts=4, link_gbit=10),
        cost.Strategy(cost.ALLREDUCE),
        {cost.GRPC: grpc},
        error=0.0,
    )
    assert ring.low.efficiency == ring.middle.efficiency == ring.high.efficiency and ring.driver == ""


def test_the_planner_s_own_error_is_a_conformal_quantile_of_its_errors():
    # n = 9 errors: the ceil(10 x 0.8) = 8th smallest |error|; n = 3: ceil(3.2) = 4 > 3, the largest.
    errors = [0.01, -0.02, 0.03, -0.04, 0.05, -0.06, 0.07, -0.5, 2.0]
    assert interval.conformal_error(errors) == 0.5
    assert interval.conformal_error([0.1, -0.3, 0.2]) == 0.3
    with pytest.raises(ValueError):
        interval.conformal_error([])
    # Each end at least the error from the middle (|middle / end - 1| = error), the high end stopping at 1.
    assert interval.widen((0.5, 0.6, 0.9), 0.2) == pytest.approx((0.5, 0.6, 0.9))  # the spread is wider
    assert interval.widen((0.59, 0.6, 0.61), 0.2) == pytest.approx((0.5, 0.6, 0.75))
    assert interval.widen((0.95, 0.96, 0.97), 0.2) == pytest.approx((0.8, 0.96, 1.0))
    # Above 1, not past the middle.
    assert interval.widen((1.1, 1.2, 1.3), 0.2) == pytest.approx((1.0, 1.2, 1.3))


def test_the_planner_s_own_error_widens_a_narrow_range_and_is_named_where_it_drives_the_width():
    # A compute-bound ring: the link share moves the efficiency by little, the planner's error by more.
    ring = cost.Strategy(cost.ALLREDUCE, transport=transports.NCCL_TCP)
    shape = cost.Shape(hosts=4, link_gbit=100)
    spreads = {"nccl_tcp": tcp_spread((0.5, 0.7))}
    bare = interval.predict(model(dense=1 * MB), shape, ring, spreads, error=0.0)
    iv = interval.predict(model(dense=1 * MB), shape, ring, spreads, error=0.2)
    assert iv.middle == bare.middle
    mid = iv.middle.efficiency
    assert iv.low.efficiency == pytest.approx(mid / 1.2) and iv.high.efficiency == pytest.approx(
        min(mid / 0.8, 1)
    )
    assert iv.low.examples_per_sec == pytest.approx(iv.middle.examples_per_sec / 1.2)
    assert (
        iv.driver == interval.model_error_label(0.2) == "the planner's own error on its calibration runs, 20%"
    )
    # A wide spread keeps its driver, and says which end the error moved.
    wide = interval.predict(
        model(), cost.Shape(hosts=4, link_gbit=10), ring, {"nccl_tcp": tcp_spread((0.1, 0.61))}
    )
    assert wide.driver.startswith("nccl_tcp link share 0.10-0.61")
    assert wide.driver.endswith("; the high end from " + interval.model_error_label(interval.MODEL_ERROR))
    # Without an error given, the planner's own (MODEL_ERROR); with none (0.0), the spread alone.
    assert interval.predict(model(dense=1 * MB), shape, ring, spreads).driver == interval.model_error_label(
        interval.MODEL_ERROR
    )
    assert interval.predict(model(dense=1 * MB), shape, ring, {}, error=0.0).driver == ""


def test_the_ps_ceiling_points_are_the_published_rates_at_the_middle_cpu_per_mb():
    # Each published rate R (MB/s at the serving PS) is stored as R x 1.4 ms/MB cores, its quote beside it.
    stored = transports.GRPC_SPREAD.points[transports.PS_CORES]
    published_rates = [p for p in stored if not p.fitted]
    assert len(published_rates) == len(transports.PS_CORES_POINTS) >= 5
    for p in published_rates:
        mb_per_s = float(p.source.rsplit("(", 1)[1].split(" MB/s")[0])
        assert p.value == pytest.approx(mb_per_s * 1.4e-3)
        assert "github.com" in p.source or "gist.github.com" in p.source
    assert {p.value for p in stored if p.fitted} == {1.49, 5.95, 1.25}
    assert transports.GRPC_SPREAD.bounds(transports.PS_CORES) == (pytest.approx(150 * 1.4e-3), 5.95)
    # A link file does not measure a PS under load: the published ceiling stays its spread.
    assert links.spreads_with(link_file())[cost.GRPC].points[transports.PS_CORES] == stored


def test_advice_ranks_by_the_low_end():
    # The seed's kind of cluster: a worker per GPU, sync PS, round robin. With the published spreads, async
    # PS with overlap gains most in the middle, but leaving the PS most at the low end (where the PS
    # process's ceiling is the slowest published one): all-reduce comes first.
    shape = cost.Shape(hosts=8, gpus_per_host=4, towers=False, ps=8, link_gbit=10, host_bus=transports.PCIE)
    ranked = advice.changes(model(step=1.0), shape, cost.Strategy(cost.SYNC_PS, placement=cost.ROUND_ROBIN))
    assert [c.low_gain for c in ranked] == sorted((c.low_gain for c in ranked), reverse=True)
    by_middle = max(ranked, key=lambda c: c.gain)
    assert by_middle.what == "async PS with overlap instead of sync PS"
    assert ranked[0].what == "all-reduce instead of PS"
    assert ranked[0].interval.low.examples_per_sec > by_middle.interval.low.examples_per_sec
    # best_layout follows the low end too, and keeps a synchronous run synchronous.
    first = ranked[0].prediction
    best, steps = advice.best_layout(model(step=1.0), first.shape, first.strategy)
    assert best.middle.strategy.synchronous and steps


def test_one_host_ring_runs_on_the_bus_alone():
    # 8 GPUs of one host in a ring: 2 x 100 MB x 7/8 = 175 MB on each GPU's bus link at 10 GB/s, not
    # over the host's 1 Gbit/s network link, which the ring never crosses.
    shape = cost.Shape(hosts=1, gpus_per_host=8, towers=False, link_gbit=1, host_bus=cost.HostBus("b", 10e9))
    one_bucket = cost.Strategy(cost.ALLREDUCE, bucket_bytes=2**30)
    p = cost.predict(model(), shape, one_bucket, cost.Constants(goodput=1.0, ps_cores=None))
    assert p.terms["busiest link"] == pytest.approx(175 * MB / 10e9)


def test_cloud_tcp_runs_scale_against_one_host_as_published():
    cases = {(c.source, c.hosts): c for c in published.CLOUD_TCP_CASES}
    jeff = cases[(cloud_tcp.HOROVOD_779, 16)]
    assert jeff.published_efficiency == pytest.approx(89783 / (16 * 6679))
    assert jeff.one_gpu_images_per_sec == pytest.approx(6679 / 8)
    assert jeff.gpus == 128 and jeff.transport == "nccl_tcp" and jeff.shape["host_bus"] == transports.NVLINK
    assert all(run.source in cloud_tcp.NOTES for run in cloud_tcp.RUNS)
    # Predicted against one host: each end over the same end for one host, with the toy model.
    r = published.predict_case(jeff, model(step=256 / (6679 / 8)))
    one = interval.predict(
        r.model, cost.Shape(hosts=1, **jeff.shape), jeff.strategy, transports.SPREADS, cost.DEFAULTS
    )
    assert r.predicted[1] == pytest.approx(r.interval.middle.efficiency / one.middle.efficiency)
    assert r.predicted[0] <= r.predicted[1] <= r.predicted[2]


def test_the_third_set_is_published_rings_scaled_against_one_host():
    runs = ring_runs.RUNS
    assert len(runs) >= 8 and all(run.source in ring_runs.NOTES for run in runs)
    assert all(run.hosts >= 2 and run.images_per_sec > 0 and run.one_host_images_per_sec > 0 for run in runs)
    assert {run.transport for run in runs} <= {ring_runs.NCCL_TCP, ring_runs.NCCL_RDMA}
    # Sources no other set uses.
    others = {c.source for c in published.CASES if c.split != published.RING}
    assert not {run.source for run in runs} & others
    # The DDP benchmark prints ex/sec per GPU: stored as the cluster's rate, 2 hosts x 8 GPUs x 306/s.
    ddp = [r for r in runs if r.source == ring_runs.PYTORCH_DDP_BENCH and r.bucket_mib == 25]
    r50 = next(r for r in ddp if r.model == "ResNet-50")
    assert (r50.images_per_sec, r50.one_host_images_per_sec) == (2 * 8 * 306.0, 8 * 307.0)
    assert r50.scaling == pytest.approx(306 / 307)
    # As cases: the source's transport and buckets, one GPU's step from one host's rate, scaled vs one host.
    case = next(c for c in published.RING_CASES if c.source == ring_runs.HOROVOD_2581)
    assert case.transport == "nccl_tcp" and case.strategy.bucket_bytes == 64 * 2**20
    assert case.one_gpu_images_per_sec == pytest.approx(1531.9 / 8)
    assert case.published_efficiency == pytest.approx(546.9 / (2 * 1531.9))
    assert case.shape["host_bus"] == transports.NVLINK and not case.shape["towers"]


def test_coverage_is_counted_from_the_rows():
    toy = model(tensors=8)
    results = [
        published.predict_case(c, toy.replace(step_time=c.batch_size / c.one_gpu_images_per_sec))
        for c in published.CASES
    ]
    text = published.table(results)
    held = [r for r in results if r.case.split in published.HELD_OUT_SPLITS]
    inside = sum(r.inside for r in held)
    assert f"all held-out runs ({len(held)} runs): inside the interval {inside} of {len(held)};" in text
    for r in results:
        low, _, high = r.predicted
        assert r.inside == (low <= r.case.published_efficiency <= high)


# ---- link files ----------------------------------------------------------------------------------


def link_file(**changes) -> links.LinkFile:
    m = links.Measured
    fields = dict(
        hosts=("10.0.0.1:7300", "10.0.0.2:7300"),
        link_gbit=0.1,
        tcp_share=m(0.90, 0.93, 0.95),
        latency_ms=m(0.02, 0.03, 0.05),
        grpc_share=m(0.80, 0.85, 0.90),
        grpc_cpu_s_per_byte=m(2e-9, 3e-9, 4e-9),
        grpc_per_message_s=m(4e-5, 5e-5, 6e-5),
    )
    return links.LinkFile(**(fields | changes))


def test_a_link_file_round_trips_and_replaces_the_published_constants(tmp_path):
    path = str(tmp_path / "links.json")
    links.write(link_file(), path)
    loaded = links.load(path)
    assert loaded == link_file(path=path)
    spreads = links.spreads_with(loaded)
    grpc = spreads[cost.GRPC]
    assert (grpc.transport.link_share, grpc.transport.cpu_s_per_byte, grpc.transport.per_message_s) == (
        0.85,
        3e-9,
        5e-5,
    )
    assert grpc.bounds(SHARE) == (0.80, 0.90) and grpc.bounds(CPU) == (4e-9, 2e-9)
    assert spreads["nccl_tcp"].transport.link_share == 0.93
    assert spreads["nccl_tcp"].transport.per_message_s == transports.NCCL_TCP.per_message_s  # NCCL's own
    assert spreads["nccl_rdma"] is transports.SPREADS["nccl_rdma"]  # not measured: published
    constants = links.constants_with(loaded)
    assert (constants.goodput, constants.rpc_cpu_s_per_byte) == (0.85, 3e-9)
    with pytest.raises(ConfigError, match="not nccl_rdma"):
        links.transport_for(loaded, cost.Strategy(cost.ALLREDUCE, transport=transports.NCCL_RDMA))


@pytest.mark.parametrize(
    "content, words",
    [
        (None, "no such file"),
        ("not json", "not a readable JSON link file"),
        ('{"format": "something else"}', "not a disttrain.plan.links version 1"),
        ({"link_gbit": 0}, "link_gbit must be a rate > 0"),
        ({"tcp_share": {"low": 0.5, "median": 0.4, "high": 0.6}}, "low <= median <= high"),
        ({"grpc_share": {"low": 5, "median": 9, "high": 10}}, "is no share of a 0.1 Gbit/s link"),
        ({"latency_ms": None}, "'latency_ms' missing"),
    ],
)
def test_a_bad_link_file_is_one_clear_error(tmp_path, content, words):
    path = tmp_path / "links.json"
    if isinstance(content, dict):
        path.write_text(json.dumps(link_file().as_dict() | content))
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=words) as raised:
        links.load(str(path))
    assert "\n" not in str(raised.value)


def _plan(*args):
    argv = [sys.executable, os.path.join(REPO, "bin", "plan.py"), *args]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=180)


def test_plan_with_a_link_file_uses_its_rate_latency_and_constants(tmp_path):
    path = str(tmp_path / "links.json")
    links.write(link_file(), path)
    common = [
        "--gin_file=gin/mlp_async.gin",
        "--gin_file=gin/testing/tiny.gin",
        "--hosts=2",
        "--step_time_ms=5",
    ]
    done = _plan(*common, f"--link_file={path}", f"--out={tmp_path / 'plan.json'}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "transport constants: measured on 2 hosts at 0.1 Gbit/s" in done.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    cluster = plan["prediction"]["cluster"]
    assert (
        cluster["link_gbit"] == 0.1 and cluster["latency_ms"] == 0.03
    )  # the file's, not the flags' defaults
    # Links measured this narrowly leave the planner's own error as the width.
    iv = plan["prediction"]["interval"]
    assert iv["width_from"] == interval.model_error_label(interval.MODEL_ERROR), iv
    assert iv["low"] == pytest.approx(iv["middle"] / (1 + interval.MODEL_ERROR))
    # Flags given explicitly win over the file.
    done = _plan(*common, f"--link_file={path}", "--link_gbit=10", f"--out={tmp_path / 'plan10.json'}")
    assert json.loads((tmp_path / "plan10.json").read_text())["prediction"]["cluster"]["link_gbit"] == 10
    # A transport the file did not measure: one line, exit 2.
    done = _plan(*common, f"--link_file={path}", "--strategy=allreduce", "--transport=nccl_rdma")
    assert done.returncode == 2
    assert "the link file measured grpc and nccl_tcp, not nccl_rdma" in done.stderr.strip().splitlines()[-1]


def test_link_probe_hosts_mode_bad_input_is_one_line():
    argv = [
        sys.executable,
        os.path.join(REPO, "bin", "link_probe.py"),
        "--mode=hosts",
        "--worker_hosts=a:1,b:1",
    ]
    for extra, words in (([], "needs --link_gbit > 0"), (["--link_gbit=25", "--task=0"], "pass --out")):
        done = subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=120, env=os.environ)
        assert done.returncode == 2, done.stderr[-2000:]
        assert words in done.stderr.strip().splitlines()[-1]
