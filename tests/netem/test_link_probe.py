"""The transport probe on emulated hosts, with real sockets and real TF servers (needs root).

Tiny sizes on 3 hosts at 50 Mbit/s: each method must move its bytes (the TF
methods check their sum inside each host's task) and report a share of the
link rate that no transport can beat (at most ~1) and that a working one
reaches on an idle link. The hosts mode runs one task per host, as on a real
cluster, and writes the link file the planner reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from disttrain.bench import link_probe
from disttrain.bench.netem import EmulatedHosts, check_permitted
from disttrain.plan import links
from tests import REPO

pytestmark = pytest.mark.netem

RATE = 50.0  # Mbit/s: 1 MB takes 0.16 s


@pytest.fixture(scope="module")
def hosts():
    reason = check_permitted()
    if reason:
        pytest.skip(reason)
    with EmulatedHosts(3, RATE, prefix="dtlp") as h:
        yield h


@pytest.mark.parametrize(
    "method,pieces", [("tcp_ring", 1), ("tcp_all_to_all", 1), ("tf_ring", 2), ("tf_all_to_all", 3)]
)
def test_each_method_moves_its_bytes_near_the_link_rate(hosts, method, pieces):
    result = link_probe.measure(hosts, method, 1_500_000, pieces, repeats=2, timeout=120)
    assert len(result.seconds) == 2
    expected = link_probe.link_seconds(method, 3, 1_500_000, RATE)
    assert result.link_seconds == pytest.approx(expected)
    # Slower than the link allows is a measurement error (the bytes did not all move),
    # and a transport this far under it on an idle link is broken.
    assert all(0.3 < share < 1.05 for share in result.shares), result


def test_link_seconds_counts_the_busiest_link():
    # tcp: the bytes themselves; tf: the ring's 2(N-1)/N of the tensor.
    assert link_probe.link_seconds("tcp_ring", 4, 62_500_000, 500) == pytest.approx(1.0)
    assert link_probe.link_seconds("tf_ring", 4, 62_500_000, 500) == pytest.approx(1.5)


def test_bad_method_is_one_line_and_exit_2():
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "bin", "link_probe.py"), "--methods=tcp_ring,udp:3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--methods entry 'udp:3'" in proc.stderr.strip().splitlines()[-1]


def test_hosts_mode_measures_the_links_for_the_planner(hosts, tmp_path):
    # One task per emulated host, started as on real hosts: task 0 from TF_CONFIG, the others from host
    # flags. Task 0 writes the link file the planner reads; its shares are of the 50 Mbit/s declared.
    port = 7400
    addrs = [f"{hosts.address(i)}:{port}" for i in range(3)]
    out = tmp_path / "links.json"
    probe = [sys.executable, os.path.join(REPO, "bin", "link_probe.py"), "--mode=hosts", "--link_gbit=0.05"]
    sizes = ["--mbytes=1", "--repeats=2", "--timeout_s=240", f"--out={out}"]
    tf_config = json.dumps({"cluster": {"worker": addrs}, "task": {"type": "worker", "index": 0}})
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    logs = [tmp_path / f"task{i}.log" for i in range(3)]
    procs = [
        hosts.popen(
            0,
            [*probe, *sizes],
            env={**env, "TF_CONFIG": tf_config},
            stdout=logs[0].open("w"),
            stderr=subprocess.STDOUT,
        )
    ]
    procs += [
        hosts.popen(
            i,
            [*probe, *sizes, f"--worker_hosts={','.join(addrs)}", f"--task={i}"],
            env=env,
            stdout=logs[i].open("w"),
            stderr=subprocess.STDOUT,
        )
        for i in (1, 2)
    ]
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0, 0, 0], [log.read_text()[-1500:] for log in logs]
    found = links.load(str(out))
    assert found.hosts == tuple(addrs) and found.link_gbit == 0.05
    # No transport beats the link's rate, and a working one on an idle link gets most of it.
    for share in (found.tcp_share, found.grpc_share):
        assert 0.3 < share.low <= share.median <= share.high < 1.05, found
    assert 0 < found.latency_ms.median < 5  # one way, no netem delay: well under a millisecond here
    assert found.grpc_cpu_s_per_byte.median > 0 and found.grpc_per_message_s.median >= 0
    assert "link file:" in logs[0].read_text() and "served task 0" in logs[1].read_text()
