"""Task 0 of the link probe across hosts never waits on a silent or lost peer past its deadline."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from disttrain.base.errors import TransientError
from disttrain.bench import link_hosts


def _listener():
    """A control port that accepts connections and never answers (a frozen host's kernel still does)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    held = []
    threading.Thread(target=lambda: held.append(server.accept()), daemon=True).start()
    return server, f"127.0.0.1:{port - link_hosts.CONTROL_OFFSET}", held


@pytest.mark.parametrize("call", ["ping", "duplex"])
def test_a_peer_that_never_answers_ends_at_the_deadline_with_one_line(call):
    server, address, _ = _listener()
    try:
        peer = link_hosts._Peer(address, time.monotonic() + 1.0)
        start = time.monotonic()
        said = f"the task at {address} did not answer .* within --timeout_s"
        with pytest.raises(TransientError, match=said):
            peer.one_way_ms() if call == "ping" else peer.duplex_seconds(1 << 16)
        assert time.monotonic() - start < 30  # bounded by the deadline, not by the peer
    finally:
        server.close()


def test_a_peer_that_closes_mid_transfer_is_a_lost_contact():
    server, address, held = _listener()
    try:
        peer = link_hosts._Peer(address, time.monotonic() + 30)
        deadline = time.monotonic() + 10
        while not held and time.monotonic() < deadline:
            time.sleep(0.01)
        held[0][0].close()
        with pytest.raises(TransientError, match="link probe: .*task at"):
            peer.duplex_seconds(1 << 16)
    finally:
        server.close()


def test_no_task_at_the_control_port_ends_at_the_deadline():
    with socket.create_server(("127.0.0.1", 0)) as spare:
        port = spare.getsockname()[1]  # closed below: nothing listens there
    with pytest.raises(TransientError, match="no task answered at"):
        link_hosts._Peer(f"127.0.0.1:{port - link_hosts.CONTROL_OFFSET}", time.monotonic() + 0.5)
