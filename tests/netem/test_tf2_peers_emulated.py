"""TF 2's strategies (bench.tf2) on emulated hosts, through bin/benchmark.py (needs root).

One run of a small MLP at 100 Mbit/s: tf2_pss and tf2_pss_minsize on 2 worker
hosts + 2 dedicated PS hosts (the coordinator beside worker 0), tf2_mwms on 2
worker hosts. Each task runs in its host's namespace and listens on its
address there; the bytes each host link carried come from its interface
counters and must match what the layout moves: a PS link what that PS holds
(as the chief placed it) per global step, a worker link the model per step of
its own, a ring link 2S(N-1)/N per step. Bands are wide for the per-step
RPCs, headers and ACKs (measured 1.02-1.06x of the payload at this size).
"""

from __future__ import annotations

import pytest

from disttrain.bench import netem
from tests.bench.test_benchmark import TINY, _explain, benchmark

# Extended (CI's time): the TF 2 peers' bytes on emulated links, the benchmark's account of them; the
# peers' runs on loopback (tests/bench/test_tf2_peers.py) stay in CI.
pytestmark = [pytest.mark.netem, pytest.mark.extended]

# fc2 is 512 x 512 (1 MiB), so MinSizePartitioner's 256 KiB minimum splits it over 2 PS;
# 0.3M parameters, 1.14 MB: about 10 steps/s at 100 Mbit/s, so a run takes seconds.
ARGS = [
    "--gin_file=gin/bench/mlp.gin",
    f"--gin_file={TINY}",
    "--gin_param=mlp.hidden_sizes=(512, 512)",
    "--workers=2",
    "--ps=2",
    "--systems=tf2_pss,tf2_pss_minsize,tf2_mwms",
    "--network=emulated",
    "--link_mbit=100",
    "--warmup_steps=10",
    "--measure_steps=40",
]
MODEL_BYTES = 4 * (32 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10)
SLACK_BYTES = 16_000  # per step: RPC framing, headers and ACKs that do not grow with the payload


@pytest.fixture(scope="module", autouse=True)
def _permitted():
    reason = netem.check_permitted()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("tf2_emulated")
    done, report, pid = benchmark(ARGS, tmp_path, timeout=420)
    assert done.returncode == 0, _explain(done)
    left = [ns for ns in netem._netns_list() if ns.startswith(f"dtbench-{pid}-")]
    assert not left, f"namespaces left behind: {left}"
    assert report["config"]["model_bytes"] == MODEL_BYTES
    return report


def _run(report: dict, system: str) -> dict:
    (run,) = [r for r in report["runs"] if r["system"] == system]
    assert run["error"] is None, run["error"]
    assert (run["network"], run["link_mbit"], run["workers"]) == ("emulated", 100.0, 2)
    assert run["steps_per_sec"] > 0 and min(run["per_worker_steps_per_sec"]) > 0
    assert run["first_loss"] > 0 and not run["diverged"]
    assert run["bound_limited_by"] == "network" and 0 < run["efficiency_vs_bound"] < 1.5
    return run


def _close(measured: float, payload: float) -> bool:
    """The payload crossed the link, plus per-step overhead, and not much else."""
    return 0.9 * payload <= measured <= 1.3 * payload + SLACK_BYTES


@pytest.mark.parametrize("system", ["tf2_pss", "tf2_pss_minsize"])
def test_pss_link_bytes_follow_where_the_chief_placed_the_variables(report, system):
    run = _run(report, system)
    assert (run["strategy"], run["layout"], run["ps"], run["synchronous"]) == (
        "async_ps",
        "dedicated",
        2,
        False,
    )
    hosts = {h["tasks"]: h for h in run["link_bytes_per_step"]}
    assert set(hosts) == {"worker0+chief0", "worker1", "ps0", "ps1"}  # the coordinator beside worker 0
    loads = run["ps_loads"]
    assert sum(loads) == MODEL_BYTES
    # Every global step is one worker's step: it pulls and pushes what each PS holds.
    for j, load in enumerate(loads):
        h = hosts[f"ps{j}"]
        assert _close(h["sent"], load) and _close(h["received"], load), (j, load, h)
    # A worker's link carries the model for each of its own steps: its share of the global steps.
    rates = run["per_worker_steps_per_sec"]
    for i, name in enumerate(["worker0+chief0", "worker1"]):
        payload = MODEL_BYTES * rates[i] / sum(rates)
        h = hosts[name]
        assert _close(h["sent"], payload) and _close(h["received"], payload), (name, payload, h)


def test_pss_balance_round_robin_and_min_size(report):
    """TF's default deals whole variables round robin (every weight on ps0); MinSize splits fc2."""
    default, split = _run(report, "tf2_pss"), _run(report, "tf2_pss_minsize")
    assert default["ps_load_max_over_mean"] > 1.9
    assert split["ps_load_max_over_mean"] < 1.15
    busiest = lambda run: max(
        h["received"] for h in run["link_bytes_per_step"] if h["tasks"].startswith("ps")
    )
    assert busiest(split) < 0.7 * busiest(default)


def test_mwms_ring_link_bytes(report):
    run = _run(report, "tf2_mwms")
    assert (run["strategy"], run["layout"], run["ps"], run["ps_loads"]) == ("allreduce", "ring", 0, None)
    hosts = {h["tasks"]: h for h in run["link_bytes_per_step"]}
    assert set(hosts) == {"worker0", "worker1"}
    expected = run["expected_busiest_link_bytes_per_step"]
    assert expected == pytest.approx(2 * MODEL_BYTES * (2 - 1) / 2)  # 2S(N-1)/N each way
    for name, h in hosts.items():
        assert _close(h["sent"], expected) and _close(h["received"], expected), (name, expected, h)
