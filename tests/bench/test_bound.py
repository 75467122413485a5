"""The physical bound and the bytes per link under it (disttrain.plan.traffic), on cases by hand."""

import math

import pytest

from disttrain.bench import bound as b
from disttrain.plan import traffic as tr

MB = 1e6


def test_link_rate():
    # 1000 Mbit/s = 1e9 bit/s / 8 = 125e6 bytes/s per direction; 500 Mbit/s = 62.5e6.
    assert b.link_rate_bytes(1000) == 125e6
    assert b.link_rate_bytes(500) == 62.5e6
    assert b.link_rate_bytes(None) == math.inf
    with pytest.raises(ValueError):
        b.link_rate_bytes(0)


def test_a_link_at_a_ratio_moves_the_bytes_in_that_many_steps():
    # CIFAR-10's 4.3 MB each way in one 100 ms step: 344 Mbit/s; in half a step, twice that.
    assert b.link_mbit_for_ratio(4.3 * MB, 0.1, 1.0) == pytest.approx(344.0)
    assert b.link_mbit_for_ratio(4.3 * MB, 0.1, 0.5) == pytest.approx(688.0)
    # A machine five times slower takes five times as long a step: a fifth of the rate, the same case.
    assert b.link_mbit_for_ratio(4.3 * MB, 0.5, 1.0) == pytest.approx(344.0 / 5)
    assert 4.3 * MB / b.link_rate_bytes(b.link_mbit_for_ratio(4.3 * MB, 0.5, 1.0)) == pytest.approx(0.5)
    for bad in ((0, 0.1, 1.0), (4.3 * MB, 0, 1.0), (4.3 * MB, 0.1, 0), (4.3 * MB, 0.1, -1)):
        with pytest.raises(ValueError):
            b.link_mbit_for_ratio(*bad)


def test_dedicated_ps_link_is_the_bottleneck():
    # S = 100 MB, N = 2 workers, P = 1 dedicated PS host, B = 100 MB/s (800 Mbit/s), C = 0.1 s.
    # Per round (each worker one step): a worker link carries S = 100 MB each way (pull
    # S, push S); the PS link carries N*S/P = 2*100/1 = 200 MB each way.
    loads = tr.link_loads(tr.DEDICATED, 100 * MB, workers=2, ps=1)
    assert [(x.role, x.hosts, x.bytes_per_round) for x in loads] == [
        ("worker", 2, 100 * MB),
        ("ps", 1, 200 * MB),
    ]
    # comm = 200 MB / 100 MB/s = 2 s > C = 0.1 s: T = 2 s per round, 2 replica steps per
    # round, so 2 / 2 = 1 step/s for the cluster, network-bound.
    r = b.bound(tr.DEDICATED, 100 * MB, 2, 1, b.link_rate_bytes(800), 0.1)
    assert r.comm_time == pytest.approx(2.0)
    assert r.round_time == pytest.approx(2.0)
    assert r.steps_per_sec == pytest.approx(1.0)
    assert r.limited_by == "network"


def test_dedicated_more_ps_moves_the_bottleneck_to_the_worker_link():
    # S = 100 MB, N = 4, P = 4: PS link N*S/P = 4*100/4 = 100 MB = worker link 100 MB.
    # B = 50 MB/s (400 Mbit/s): comm = 100/50 = 2 s; C = 0.5 s; T = 2 s; 4 / 2 = 2 steps/s.
    assert tr.busiest_bytes_per_round(tr.DEDICATED, 100 * MB, 4, 4) == pytest.approx(100 * MB)
    assert b.bound(tr.DEDICATED, 100 * MB, 4, 4, 50 * MB, 0.5).steps_per_sec == pytest.approx(2.0)
    # P = 8 > N: PS links carry 4*100/8 = 50 MB, worker links still 100 MB: the busiest is 100.
    assert tr.busiest_bytes_per_round(tr.DEDICATED, 100 * MB, 4, 8) == pytest.approx(100 * MB)
    assert tr.least_bytes_per_round(tr.DEDICATED, 100 * MB, 4, 8) == pytest.approx(50 * MB)


def test_colocated_one_ps_per_host_is_2s_n_minus_1_over_n():
    # The MLP: S = 18,882,816 params x 4 bytes = 75,531,264 bytes. N = P = 4 colocated,
    # 500 Mbit/s = 62.5e6 B/s. Each host link: 2S(N-1)/N = 2 * 75,531,264 * 3/4
    # = 113,296,896 bytes per round each way; 113,296,896 / 62.5e6 = 1.81275 s.
    s = 75_531_264
    assert tr.busiest_bytes_per_round(tr.COLOCATED, s, 4, 4) == pytest.approx(113_296_896)
    # Via the general formula S + (N-2)S/P = S + 2S/4 = 1.5 S, the same number.
    assert 1.5 * s == 113_296_896
    # C = 0.04 s (batch 32): T = max(0.04, 1.81275) = 1.81275 s; 4 / 1.81275 = 2.2066 steps/s.
    r = b.bound(tr.COLOCATED, s, 4, 4, b.link_rate_bytes(500), 0.04)
    assert r.comm_time == pytest.approx(1.81275, rel=1e-5)
    assert r.steps_per_sec == pytest.approx(4 / 1.81275, rel=1e-5)
    assert r.limited_by == "network"
    # Async, per global step (a round is N = 4 global steps): 113.3 MB / 4 = 28.3 MB per step.
    assert b.global_steps_per_round(4, synchronous=False) == 4
    assert b.global_steps_per_round(4, synchronous=True) == 1


def test_colocated_fewer_ps_than_hosts():
    # S = 120 MB, N = 4, P = 2: a host with a PS carries S + (N-2)S/P = 120 + 2*120/2 = 240 MB
    # (its own pull and push of the remote 60 MB, 60 MB, plus serving 3 other workers 60 MB
    # each: 60 + 180 = 240); a host without a PS carries S = 120 MB.
    loads = tr.link_loads(tr.COLOCATED, 120 * MB, 4, 2)
    assert [(x.role, x.hosts, x.bytes_per_round) for x in loads] == [
        ("worker+ps", 2, pytest.approx(240 * MB)),
        ("worker", 2, 120 * MB),
    ]


def test_one_host_has_nothing_to_send():
    # Colocated N = P = 1: S + (1-2)S/1 = 0. Ring N = 1: 2S(0)/1 = 0. Compute-bound: 1/C.
    assert tr.busiest_bytes_per_round(tr.COLOCATED, 100 * MB, 1, 1) == 0
    assert tr.busiest_bytes_per_round(tr.RING, 100 * MB, 1, 0) == 0
    r = b.bound(tr.RING, 100 * MB, 1, 0, b.link_rate_bytes(10), 0.25)
    assert (r.steps_per_sec, r.limited_by) == (4.0, "compute")


def test_ring_all_reduce():
    # S = 100 MB, N = 4: 2 * 100 * 3/4 = 150 MB each way per host per step.
    # B = 125e6 (1 Gbit/s): 1.2 s; C = 0.3 s: T = 1.2 s; 4 / 1.2 = 3.333 steps/s.
    assert tr.busiest_bytes_per_round(tr.RING, 100 * MB, 4, 0) == pytest.approx(150 * MB)
    assert b.bound(tr.RING, 100 * MB, 4, 0, 125e6, 0.3).steps_per_sec == pytest.approx(4 / 1.2)


def test_compute_bound_cifar10_at_1_gbit():
    # CIFAR-10 CNN, S = 4.3 MB, 1 worker + 1 dedicated PS at 1000 Mbit/s (125e6 B/s):
    # worker and PS links carry 4.3 MB each way: 4.3e6 / 125e6 = 0.0344 s per step.
    # One process alone: 19.2 steps/s, C = 1/19.2 = 0.0521 s > 0.0344 s: compute-bound,
    # the bound is 1 / C = 19.2 steps/s, and a run at 11.2 steps/s is 11.2/19.2 = 0.583 of it.
    r = b.bound(tr.DEDICATED, 4.3 * MB, 1, 1, b.link_rate_bytes(1000), 1 / 19.2)
    assert r.comm_time == pytest.approx(0.0344)
    assert r.limited_by == "compute"
    assert r.steps_per_sec == pytest.approx(19.2)
    assert b.efficiency(11.2, r.steps_per_sec) == pytest.approx(0.5833, abs=1e-4)


def test_unlimited_link_is_the_ideal_line():
    # Loopback: B unlimited, the bound is N / C = N x one process alone.
    assert b.bound(tr.DEDICATED, 100 * MB, 3, 1, math.inf, 0.2).steps_per_sec == pytest.approx(15.0)


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="ps <= workers"):
        tr.link_loads(tr.COLOCATED, 1, workers=2, ps=3)
    with pytest.raises(ValueError, match="no PS"):
        tr.link_loads(tr.RING, 1, workers=2, ps=1)
    with pytest.raises(ValueError, match="at least 1 PS"):
        tr.link_loads(tr.DEDICATED, 1, workers=2, ps=0)
    with pytest.raises(ValueError, match="unknown layout"):
        tr.link_loads("mesh", 1, 2, 1)
    with pytest.raises(ValueError, match="compute_time"):
        b.bound(tr.DEDICATED, 1, 1, 1, 1e6, 0)


# ---- embedding tables: D whole, R of rows per step --------------------------------------------


@pytest.mark.parametrize(
    "layout, workers, ps",
    [(tr.DEDICATED, 2, 1), (tr.DEDICATED, 4, 8), (tr.COLOCATED, 4, 2), (tr.COLOCATED, 3, 3), (tr.RING, 4, 0)],
)
def test_a_model_without_tables_gives_todays_numbers(layout, workers, ps):
    # R = 0: D is all of S, and every formula is exactly the one above (S as D).
    s = 75_531_264
    if layout == tr.DEDICATED:
        today = [("worker", workers, s), ("ps", ps, workers * s / ps)]
    elif layout == tr.COLOCATED:
        today = [("worker+ps", ps, s + (workers - 2) * s / ps)]
        today += [("worker", workers - ps, s)] if workers > ps else []
    else:
        today = [("worker", workers, 2 * s * (workers - 1) / workers)]
    for loads in (tr.link_loads(layout, s, workers, ps), tr.link_loads(layout, s, workers, ps, 0.0)):
        assert [(x.role, x.hosts, x.bytes_per_round) for x in loads] == today
    sizes = tr.ModelBytes(dense=s)
    assert (sizes.total, sizes.sparse, sizes.table_bytes, sizes.table_fraction_per_step) == (s, 0, 0, 0.0)
    assert b.bound(layout, s, workers, ps, 125e6, 0.1) == b.bound(layout, s, workers, ps, 125e6, 0.1, 0.0)


def test_table_rows_and_their_indices():
    # A table of 1,000,000 rows x 64 float32 = 256 bytes a row, 256 MB in all. A step looks up
    # 10,000 distinct rows: each row travels with its int64 index, 10,000 x (256 + 8) = 2.64 MB
    # each way; the rows are 10,000 x 256 / 256e6 = 1% of the table.
    t = tr.Table("emb", nbytes=256_000_000, row_bytes=256, rows_per_step=10_000)
    assert t.bytes_per_step == 2_640_000
    assert t.fraction_per_step == pytest.approx(0.01)
    # A second table, 1,000 rows x 16 float32 (64 bytes, 64 KB), of which a step reads 500 rows:
    # 500 x 72 = 36,000 bytes. R = 2,640,000 + 36,000 = 2,676,000; the tables hold 256,064,000
    # bytes, of which a step reads 2,560,000 + 32,000 = 2,592,000 (1.0122%). S = D + the tables.
    u = tr.Table("small", nbytes=64_000, row_bytes=64, rows_per_step=500)
    sizes = tr.ModelBytes(dense=3_000_000, tables=(t, u))
    assert sizes.sparse == 2_676_000
    assert sizes.table_bytes == 256_064_000
    assert sizes.total == 259_064_000
    assert sizes.table_fraction_per_step == pytest.approx(2_592_000 / 256_064_000)


def test_ps_layouts_move_dense_and_rows_alike():
    # D = 10 MB, R = 2 MB: S = D + R = 12 MB a worker step pulls, and pushes as gradients.
    # Dedicated, N = 2, P = 2: a worker link 12 MB; a PS link N*S/P = 2*12/2 = 12 MB.
    loads = tr.link_loads(tr.DEDICATED, 10 * MB, 2, 2, 2 * MB)
    assert [(x.role, x.bytes_per_round) for x in loads] == [("worker", 12 * MB), ("ps", 12 * MB)]
    # Colocated, N = 4, P = 2: a host with a PS S + (N-2)S/P = 12 + 2*12/2 = 24 MB; without, 12 MB.
    loads = tr.link_loads(tr.COLOCATED, 10 * MB, 4, 2, 2 * MB)
    assert [(x.role, x.bytes_per_round) for x in loads] == [
        ("worker+ps", pytest.approx(24 * MB)),
        ("worker", 12 * MB),
    ]
    # All rows, no dense bytes (D = 0): the same formulas in R alone.
    assert tr.busiest_bytes_per_round(tr.DEDICATED, 0, 3, 1, 5 * MB) == pytest.approx(15 * MB)


def test_ring_all_gathers_the_rows():
    # D = 100 MB by ring all-reduce, N = 4: 2 * 100 * 3/4 = 150 MB each way. R = 10 MB of rows
    # by all-gather: each host receives the 3 other replicas' 10 MB and sends 3 blocks of 10 MB
    # down the ring: 30 MB each way. In all 180 MB.
    assert tr.busiest_bytes_per_round(tr.RING, 100 * MB, 4, 0, 10 * MB) == pytest.approx(180 * MB)
    assert tr.least_bytes_per_round(tr.RING, 100 * MB, 4, 0, 10 * MB) == pytest.approx(180 * MB)
    # The rows' share grows with N: N = 8 gives 2 * 100 * 7/8 + 7 * 10 = 175 + 70 = 245 MB.
    assert tr.busiest_bytes_per_round(tr.RING, 100 * MB, 8, 0, 10 * MB) == pytest.approx(245 * MB)
    # One host alone sends nothing.
    assert tr.busiest_bytes_per_round(tr.RING, 100 * MB, 1, 0, 10 * MB) == 0


def test_bound_with_rows():
    # D = 2 MB, R = 1 MB, ring N = 4 at 1 Gbit/s (125e6 B/s): 2*2*3/4 + 3*1 = 6 MB per round,
    # 6e6 / 125e6 = 0.048 s > C = 0.01 s: network-bound, 4 / 0.048 = 83.33 replica steps/s.
    r = b.bound(tr.RING, 2 * MB, 4, 0, 125e6, 0.01, sparse_bytes=1 * MB)
    assert r.busiest_bytes_per_round == pytest.approx(6 * MB)
    assert r.comm_time == pytest.approx(0.048)
    assert (r.limited_by, r.steps_per_sec) == ("network", pytest.approx(4 / 0.048))
    # Dedicated N = 2, P = 2, same D and R: 3 MB per link, 0.024 s; 2 / 0.024 = 83.33 as well.
    r = b.bound(tr.DEDICATED, 2 * MB, 2, 2, 125e6, 0.01, sparse_bytes=1 * MB)
    assert r.comm_time == pytest.approx(0.024)
    with pytest.raises(ValueError, match="sparse_bytes"):
        tr.link_loads(tr.DEDICATED, 1, 1, 1, sparse_bytes=-1)


def test_the_hybrid_sends_rows_through_the_ps_and_dense_bytes_round_the_workers_ring():
    d, r, n, p = 2e6, 1e6, 4, 2
    dedicated = {
        x.role: x.bytes_per_round for x in tr.link_loads(tr.DEDICATED, d, n, p, r, dense_over_ring=True)
    }
    ring = 2 * d * (n - 1) / n
    assert dedicated["worker"] == pytest.approx(r + ring)  # its rows, pulled and pushed, and the ring
    assert dedicated["ps"] == pytest.approx(n * r / p)  # rows only: no dense byte reaches a PS
    colocated = tr.link_loads(tr.COLOCATED, d, n, p, r, dense_over_ring=True)
    plain = tr.link_loads(tr.COLOCATED, 0.0, n, p, r)
    for hybrid, rows_only in zip(colocated, plain, strict=True):
        assert hybrid.bytes_per_round == pytest.approx(rows_only.bytes_per_round + ring)
    bound = b.bound(tr.DEDICATED, d, n, p, 1e8, 0.001, r, dense_over_ring=True)
    assert bound.busiest_bytes_per_round == pytest.approx(max(r + ring, n * r / p))


def test_16_bit_transfer_halves_dense_bytes_and_row_values_but_not_indices():
    # D = 3 MB and a table of 256-byte rows, 10,000 looked up a step: R = 10,000 x (256 + 8).
    # In 16 bits: D 1.5 MB, R = 10,000 x (128 + 8) = 1.36 MB; the share of the table read stays 1%.
    t = tr.Table("emb", nbytes=256_000_000, row_bytes=256, rows_per_step=10_000)
    sizes = tr.ModelBytes(dense=3_000_000, tables=(t,))
    half = sizes.on_wire(2)
    assert (half.dense, half.sparse) == (1_500_000, 1_360_000)
    assert half.table_fraction_per_step == pytest.approx(sizes.table_fraction_per_step)
    assert sizes.on_wire(4) is sizes
    # The bound of a ring of 2 at 1 Gbit/s, D = 100 MB: 2 * 100 * 1/2 = 100 MB a round in float32,
    # 0.8 s; 50 MB and 0.4 s in 16 bits: the bound doubles when the link limits.
    full = b.bound(tr.RING, sizes.dense * 100 / 3, 2, 0, 125e6, 0.01)
    narrow = b.bound(tr.RING, half.dense * 100 / 3, 2, 0, 125e6, 0.01)
    assert narrow.steps_per_sec == pytest.approx(2 * full.steps_per_sec)


def test_transfer_itemsize_of_a_built_strategy():
    from disttrain.base.cluster import Cluster
    from disttrain.strategies import AsyncParameterServer, SyncAllReduce, SyncParameterServer

    cluster = Cluster.from_hosts("worker", 0, ["p:1"], ["w0:1", "w1:1"])
    assert tr.transfer_itemsize(AsyncParameterServer(cluster)) == 4
    assert tr.transfer_itemsize(AsyncParameterServer(cluster, transfer_dtype="bfloat16")) == 2
    assert tr.transfer_itemsize(SyncParameterServer(cluster, transfer_dtype="float16")) == 2
    assert tr.transfer_itemsize(SyncAllReduce(cluster, transfer_dtype="float32")) == 4
    assert tr.transfer_itemsize(object()) == 4  # a strategy with no such knob sends float32


@pytest.mark.parametrize("system", ["disttrain", "disttrain:hybrid", "disttrain:sync_ps"])
def test_the_bound_of_each_disttrain_system_counts_its_own_transfer_dtype(system):
    # `disttrain:<strategy>` systems send in their strategy's transfer_dtype as `disttrain` does;
    # TF's default and the peers send float32 whatever disttrain's settings say.
    import gin

    from disttrain.bench import runner
    from disttrain.edges import cli

    def load_config(bindings):
        gin.clear_config()
        return cli.train_config(["gin/bench/dlrm.gin"], list(bindings))

    sixteen = [f"{name}.transfer_dtype='bfloat16'" for name in ("SyncHybrid", "SyncParameterServer")]
    config = runner.BenchConfig(
        gin_files=("gin/bench/dlrm.gin",),
        load_config=load_config,
        gin_params=(*sixteen, "SyncAllReduce.transfer_dtype='bfloat16'"),
        systems=(system, "tf_default"),
        strategy="hybrid" if system == "disttrain" else None,
    )
    try:
        bench = runner.Benchmark(config, log=lambda line: None)
        ours, theirs = bench._specs()[0], bench._specs()[-1]
        assert (ours.system, theirs.system) == (system, "tf_default")
        assert bench._itemsize(ours) == 2 and bench._itemsize(theirs) == 4
    finally:
        gin.clear_config()
