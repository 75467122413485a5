"""The transport probe on emulated hosts, with real sockets and real TF servers (needs root).

Tiny sizes on 3 hosts at 50 Mbit/s: each method must move its bytes (the TF
methods check their sum inside each host's task) and report a share of the
link rate that no transport can beat (at most ~1) and that a working one
reaches on an idle link.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from disttrain.bench import link_probe
from disttrain.bench.netem import EmulatedHosts, check_permitted
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
