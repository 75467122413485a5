"""16-bit transfer on emulated hosts (needs root): the bytes on each host's link, per strategy and mode.

bin/benchmark.py runs the MLP cut down to 256-512-512-256 (2.1 MB of
float32 variables), each task on a host of its own joined by 1 Gbit/s
links, disttrain only, with transfer_dtype None and then 'bfloat16'. The
links' interface counters (`netem.EmulatedHosts.link_bytes`, what the
benchmark reports as link bytes per global step) carry everything: the
tensors, gRPC's framing and headers, TCP's acknowledgements. Each
direction of each host's link must carry at most 0.55 of float32's bytes
in 16 bits. The model is large enough that a step's per-message costs
(tens of KB) stay a few percent of its bytes.
"""

from __future__ import annotations

import pytest

from disttrain.bench import netem
from tests.bench.test_benchmark import _explain, benchmark

pytestmark = pytest.mark.netem

SMALL_MLP = ["--gin_file=gin/bench/mlp.gin", "--gin_param=mlp.hidden_sizes=(512, 512)"]
CASES = {  # mode: (strategy, workers, bindings)
    "async": ("async_ps", 1, []),
    "async_overlap": ("async_ps", 1, ["AsyncParameterServer.overlap=True"]),
    "async_overlap_pieces": (
        "async_ps",
        1,
        ["AsyncParameterServer.overlap=True", "AsyncParameterServer.piece_bytes=262144"],
    ),
    "sync_ps": ("sync_ps", 2, []),
    "allreduce": ("allreduce", 2, []),
}
CLASS = {"async_ps": "AsyncParameterServer", "sync_ps": "SyncParameterServer", "allreduce": "SyncAllReduce"}


@pytest.fixture(scope="module", autouse=True)
def _permitted():
    reason = netem.check_permitted()
    if reason is not None:
        pytest.skip(reason)


def link_bytes(tmp_path, mode: str, transfer_dtype: str | None) -> dict[str, tuple[float, float]]:
    """Bytes per global step each host's link sent and received, by the host's tasks."""
    strategy, workers, bindings = CASES[mode]
    bindings = [*bindings, f"{CLASS[strategy]}.transfer_dtype={transfer_dtype!r}"]
    args = [
        *SMALL_MLP,
        *(f"--gin_param={b}" for b in bindings),
        f"--strategy={strategy}",
        f"--workers={workers}",
        "--ps=1",
        "--systems=disttrain",
        "--network=emulated",
        "--link_mbit=1000",
        "--reference=false",
        "--warmup_steps=10",
        "--measure_steps=40",
    ]
    done, report, _ = benchmark(args, tmp_path / str(transfer_dtype), timeout=300)
    assert done.returncode == 0, _explain(done)
    (run,) = report["runs"]
    assert run["error"] is None, run["error"]
    return {h["tasks"]: (h["sent"], h["received"]) for h in run["link_bytes_per_step"]}


# Plain async and async with overlap alone: the extended tier (CI's time). Async with overlap in pieces
# takes both paths on these links, and tests/cluster/test_transfer_wire.py reads each one's bytes.
@pytest.mark.parametrize(
    "mode",
    [pytest.param(m, marks=[pytest.mark.extended] if m in ("async", "async_overlap") else []) for m in CASES],
)
def test_16_bit_transfer_carries_at_most_0_55_of_float32s_bytes_on_every_link(tmp_path, mode):
    full = link_bytes(tmp_path, mode, None)
    half = link_bytes(tmp_path, mode, "bfloat16")
    print(f"{mode}: float32 {full}, bfloat16 {half} (bytes per global step: sent, received)")
    assert set(full) == set(half)
    for host, (sent, received) in full.items():
        assert sent > 1e6 or received > 1e6, (host, full)  # the variables or gradients crossed it
        assert half[host][0] <= 0.55 * sent, (mode, host, half[host], full[host])
        assert half[host][1] <= 0.55 * received, (mode, host, half[host], full[host])
