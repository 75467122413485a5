"""Emulated hosts, tested with real processes and real TCP transfers (needs root).

Rates are kept low (20 Mbit/s) so transfers take ~2 s and the machine's CPU is never
the bottleneck; bands are wide because the machine is shared. Goodput is ~0.95 of
the link rate because tbf counts Ethernet, IP and TCP headers too.
"""

from __future__ import annotations

import json
import os
import select
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from disttrain.bench import netem
from disttrain.bench.netem import EmulatedHosts, check_permitted, cleanup_stale

pytestmark = pytest.mark.netem

PREFIX = "dtt"  # not the default "dt", so a benchmark running alongside is untouched
RATE = 20.0  # Mbit/s
PORT = 5001  # the same on every host: each namespace has its own ports
TIMEOUT = 30  # seconds, for any one process

# Accepts `n` connections, reads each to EOF, answers one byte, prints JSON with
# the bytes read and the time from the first accept to the last EOF.
RECEIVER = r"""
import json, selectors, socket, sys, time
n, port = int(sys.argv[1]), int(sys.argv[2])
srv = socket.create_server(("0.0.0.0", port), backlog=16)
sel = selectors.DefaultSelector()
sel.register(srv, selectors.EVENT_READ)
total, accepted, done, t0 = 0, 0, 0, None
while done < n:
    events = sel.select(timeout=20)
    if not events:
        sys.exit("receiver timed out")
    for key, _ in events:
        if key.fileobj is srv:
            conn, _ = srv.accept()
            t0 = t0 or time.monotonic()
            sel.register(conn, selectors.EVENT_READ)
            continue
        data = key.fileobj.recv(1 << 20)
        total += len(data)
        if not data:
            key.fileobj.sendall(b"k")
            sel.unregister(key.fileobj)
            key.fileobj.close()
            done += 1
print(json.dumps({"bytes": total, "seconds": time.monotonic() - t0}))
"""

# Connects (retrying until the receiver listens), sends `nbytes`, waits for the
# receiver's answer so the data has really arrived.
SENDER = r"""
import socket, sys, time
host, port, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + 10
while True:
    try:
        sock = socket.create_connection((host, port), timeout=20)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
chunk = b"x" * 65536
for _ in range(nbytes // len(chunk)):
    sock.sendall(chunk)
sock.sendall(chunk[: nbytes % len(chunk)])
sock.shutdown(socket.SHUT_WR)
assert sock.recv(1) == b"k"
"""

# Echo server for one connection, and a client timing connect and 1-byte round trips.
ECHO = r"""
import socket, sys
srv = socket.create_server(("0.0.0.0", int(sys.argv[1])))
conn, _ = srv.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while data := conn.recv(1):
    conn.sendall(data)
"""
PING = r"""
import json, socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 10
while True:
    t = time.monotonic()
    try:
        sock = socket.create_connection((host, port), timeout=10)
        connect = time.monotonic() - t
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(20):
    t = time.monotonic()
    sock.sendall(b"p")
    assert sock.recv(1) == b"p"
    rtts.append(time.monotonic() - t)
print(json.dumps({"connect": connect, "rtts": rtts}))
"""


@pytest.fixture(scope="module", autouse=True)
def _permitted():
    reason = check_permitted()
    if reason is not None:
        pytest.skip(reason)


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    """Wait for every process (bounded), kill all in any case, return their stdout."""
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT)
            assert p.returncode == 0, f"{p.args[-4:]} failed: {err}"
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)
    return outs


def _start(hosts: EmulatedHosts, i: int, script: str, *args) -> subprocess.Popen:
    argv = [sys.executable, "-c", script, *map(str, args)]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return hosts.popen(i, argv, **pipes)


def _mbit(result: str) -> float:
    r = json.loads(result)
    return r["bytes"] * 8 / r["seconds"] / 1e6


def _our_netns() -> list[str]:
    out = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True, timeout=10
    ).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True, timeout=10).stdout
    return {line.split(":")[1].strip() for line in out.splitlines()}


def test_rate_and_counters():
    """One flow runs at the set rate, and the interface counters cover the payload."""
    nbytes = 5_000_000
    with EmulatedHosts(2, RATE, prefix=PREFIX) as hosts:
        tx0, rx0 = hosts.link_bytes(0)[0], hosts.link_bytes(1)[1]
        recv = _start(hosts, 1, RECEIVER, 1, PORT)
        send = _start(hosts, 0, SENDER, hosts.address(1), PORT, nbytes)
        result, _ = _finish([recv, send])
        sent = hosts.link_bytes(0)[0] - tx0
        received = hosts.link_bytes(1)[1] - rx0
    mbit = _mbit(result)
    print(f"{nbytes} B at {mbit:.1f} Mbit/s (set {RATE}); link tx {sent} rx {received}")
    assert json.loads(result)["bytes"] == nbytes
    assert 0.6 * RATE <= mbit <= 1.1 * RATE
    # Payload plus headers (~5%); more than 1.5x would mean counting twice.
    assert nbytes <= sent <= 1.5 * nbytes
    assert nbytes <= received <= 1.5 * nbytes


def test_both_directions_shaped():
    """Host-to-bridge and bridge-to-host are each shaped, and independently.

    Two simultaneous opposite flows each get the full rate (full duplex, so the
    host egress tbf is per direction); two senders into one host share one rate
    (so the bridge egress tbf, the host's downlink, is shaped too).
    """
    nbytes = 4_000_000
    with EmulatedHosts(3, RATE, prefix=PREFIX) as hosts:
        duplex = [
            _start(hosts, 1, RECEIVER, 1, PORT),
            _start(hosts, 0, RECEIVER, 1, PORT),
            _start(hosts, 0, SENDER, hosts.address(1), PORT, nbytes),
            _start(hosts, 1, SENDER, hosts.address(0), PORT, nbytes),
        ]
        to_1, to_0 = (_mbit(out) for out in _finish(duplex)[:2])
        incast = [
            _start(hosts, 1, RECEIVER, 2, PORT),
            _start(hosts, 0, SENDER, hosts.address(1), PORT, nbytes // 2),
            _start(hosts, 2, SENDER, hosts.address(1), PORT, nbytes // 2),
        ]
        into_1 = _mbit(_finish(incast)[0])
    print(f"duplex {to_1:.1f} + {to_0:.1f} Mbit/s, incast {into_1:.1f} (set {RATE})")
    for mbit in (to_1, to_0, into_1):
        assert 0.6 * RATE <= mbit <= 1.1 * RATE


def test_removed_on_exit_and_on_exception():
    """Nothing of ours is left after the block, however it ends; root netns untouched."""
    links = _root_links()
    with EmulatedHosts(3, RATE, prefix=PREFIX) as hosts:
        names = [hosts.namespace(i) for i in range(3)]
        assert set(names) <= set(_our_netns())
        assert _root_links() == links  # nothing was created in the root namespace
    assert _our_netns() == []
    with EmulatedHosts(2, RATE, prefix=PREFIX) as a, EmulatedHosts(2, RATE, prefix=PREFIX) as b:
        assert a.namespace(0) != b.namespace(0)  # one process may hold several at once
    assert _our_netns() == []
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)), EmulatedHosts(2, RATE, prefix=PREFIX) as hosts:
            sleeper = hosts.popen(0, ["sleep", "60"])
            raise exc
        assert sleeper.poll() is not None  # processes in the hosts are ended too
        assert _our_netns() == []
    assert _root_links() == links
    hosts.close()  # idempotent
    with pytest.raises(netem.NetemError):
        hosts.address(0)


def _child_with_hosts() -> tuple[subprocess.Popen, list[str]]:
    """A separate Python process that builds hosts, reports their namespaces, waits."""
    code = (
        "import json, sys, time\n"
        f"sys.path.insert(0, {str(Path(netem.__file__).parent)!r})\n"
        "import netem\n"
        f"with netem.EmulatedHosts(2, 10, prefix={PREFIX!r}) as h:\n"
        "    names = [h.namespace(0), h.namespace(1), h.bridge_namespace]\n"
        "    print(json.dumps(names), flush=True)\n"
        "    time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([child.stdout], [], [], TIMEOUT)
    if not ready:
        child.kill()
        child.wait(timeout=5)
        pytest.fail("child did not build its hosts in time")
    return child, json.loads(child.stdout.readline())


def test_removed_when_parent_gets_sigterm():
    child, names = _child_with_hosts()
    try:
        assert set(names) <= set(_our_netns())
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=TIMEOUT) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait(timeout=5)
        cleanup_stale(PREFIX)
    assert not set(names) & set(_our_netns())


def test_cleanup_stale_after_sigkill():
    """SIGKILL leaves namespaces behind; cleanup_stale removes them, not live ones."""
    child, names = _child_with_hosts()
    child.kill()
    child.wait(timeout=5)
    fake = f"{PREFIX}-{child.pid}-5-7"  # a dead creator's leftover, made by hand
    alive = f"{PREFIX}-{os.getpid()}-99-0"  # this process is alive: must be kept
    try:
        for name in (fake, alive):
            subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
        assert set(names) <= set(_our_netns())
        removed = cleanup_stale(PREFIX)
        assert set(removed) == {*names, fake}
        assert _our_netns() == [alive]
    finally:
        subprocess.run(["ip", "netns", "del", alive], timeout=10, check=False)
        cleanup_stale(PREFIX)


def _rtt_ms(latency_ms: float) -> tuple[float, float]:
    """(median 1-byte TCP round trip, TCP connect time) from host 0 to host 1, in ms."""
    with EmulatedHosts(2, RATE, latency_ms=latency_ms, prefix=PREFIX) as hosts:
        server = _start(hosts, 1, ECHO, PORT)
        client = _start(hosts, 0, PING, hosts.address(1), PORT)
        out = json.loads(_finish([client, server])[0])
    return statistics.median(out["rtts"]) * 1000, out["connect"] * 1000


def test_no_latency_fast_first_connect():
    """Without latency_ms the round trip is sub-millisecond and the very first
    connection is immediate (no ~1 s stall while the links come up)."""
    rtt, connect = _rtt_ms(0.0)
    print(f"latency_ms=0: median RTT {rtt:.3f} ms, connect {connect:.1f} ms")
    assert rtt < 10
    assert connect < 300


def test_latency_adds_round_trip_delay():
    reason = check_permitted(latency=True)
    if reason is not None:
        pytest.skip(reason)
    latency_ms = 25.0
    rtt, connect = _rtt_ms(latency_ms)
    print(f"latency_ms={latency_ms}: median RTT {rtt:.1f} ms, connect {connect:.1f} ms")
    assert 2 * latency_ms * 0.9 <= rtt <= 2 * latency_ms + 40
    assert 2 * latency_ms * 0.9 <= connect <= 2 * latency_ms + 300


def test_latency_without_netem_fails_cleanly():
    """Where the kernel has no sch_netem, latency_ms > 0 says so and leaves nothing."""
    if check_permitted(latency=True) is None:
        pytest.skip("sch_netem is available here; test_latency_adds_round_trip_delay covers it")
    with pytest.raises(netem.NetemError, match="sch_netem"):
        with EmulatedHosts(2, RATE, latency_ms=10, prefix=PREFIX):
            pass
    assert _our_netns() == []


def test_seventeen_hosts():
    """17 hosts build, every link is shaped, and 16 senders reach the 17th at once."""
    n = 17
    with EmulatedHosts(n, RATE, prefix=PREFIX) as hosts:
        assert len({hosts.address(i) for i in range(n)}) == n
        for ns in [hosts.namespace(i) for i in range(n)] + [hosts.bridge_namespace]:
            out = subprocess.run(
                ["tc", "-n", ns, "qdisc", "show"], capture_output=True, text=True, check=True, timeout=10
            ).stdout
            assert out.count("qdisc tbf") == (n if ns == hosts.bridge_namespace else 1)
        procs = [_start(hosts, n - 1, RECEIVER, n - 1, PORT)]
        procs += [_start(hosts, i, SENDER, hosts.address(n - 1), PORT, 20_000) for i in range(n - 1)]
        result = json.loads(_finish(procs)[0])
    assert result["bytes"] == (n - 1) * 20_000
