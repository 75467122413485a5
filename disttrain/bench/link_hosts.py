"""One host's part in measuring a cluster's own links for the planner: a task per host, task 0 measures.

Every task starts TF's gRPC server at its address and a small control
server (plain sockets) at the next port. Task 0 then measures, over every
other host (`measure`):

    latency      half the median round trip of a one-line message
    TCP share    N bytes each way at once on one connection, over N at the
                 declared link rate (the first round, TCP's slow start, untimed)
    gRPC share   TF's transfers around a ring of every host (host j reads a
                 tensor of N bytes held by host j+1, all at once), over N at
                 the link rate
    gRPC CPU     every task's process CPU seconds over those rounds beyond its
                 CPU at rest, per byte at each end; and, with many small
                 tensors instead, per message

and writes a link file (`plan.links`). The others serve until task 0 says
bye (or `timeout` passes). What it does not measure: NCCL (no GPU here; its
TCP share is taken as plain TCP's), RDMA, and links between hosts other
than the ring's neighbours and task 0's pairs.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
from collections.abc import Sequence

from disttrain.base.errors import TransientError
from disttrain.plan import links

CONTROL_OFFSET = 1  # the control server listens at the task's port + this
CHUNK = 1 << 20
LATENCY_SAMPLES = 50
SMALL_TENSORS = 64  # per host, for the per-message CPU
SMALL_FLOATS = 16


def _control_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port) + CONTROL_OFFSET


def _send_bytes(conn: socket.socket, nbytes: int) -> None:
    """Send `nbytes`; a lost or silent peer ends it quietly (the reading side says so)."""
    block = memoryview(b"x" * CHUNK)
    left = nbytes
    with contextlib.suppress(OSError):
        while left > 0:
            left -= conn.send(block[: min(left, CHUNK)])


def _duplex(conn: socket.socket, lines, nbytes: int) -> None:
    """Send `nbytes` on `conn` while reading as many from `lines` (its buffered reader), both at once."""
    sender = threading.Thread(target=_send_bytes, args=(conn, nbytes), daemon=True)
    sender.start()
    left = nbytes
    while left > 0:
        got = len(lines.read1(min(left, CHUNK)))
        if not got:
            raise ConnectionError("a link probe task closed its connection mid-transfer")
        left -= got
    sender.join()


class _Control:
    """A task's control server: answers task 0's commands, one line each, until bye."""

    def __init__(self, address: str):
        self.done = threading.Event()
        self._server = socket.create_server(("", _control_address(address)[1]), backlog=64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError, ConnectionError), conn, conn.makefile("rb") as lines:
            for line in lines:
                command, *args = line.decode().split()
                if command == "ping":
                    conn.sendall(b"pong\n")
                elif command == "duplex":  # the bytes follow the command line on the same stream
                    _duplex(conn, lines, int(args[0]))
                elif command == "cpu":
                    conn.sendall(f"{time.process_time()}\n".encode())
                elif command == "bye":
                    conn.sendall(b"bye\n")
                    self.done.set()
                    return

    def close(self) -> None:
        self.done.set()
        self._server.close()


class _Peer:
    """Task 0's connection to another task's control server; every call ends by `deadline`.

    A peer that stops answering (its host froze, or its link went down with no
    reset) raises TransientError at the deadline instead of holding task 0 for ever.
    """

    def __init__(self, address: str, deadline: float):
        self.address, self.deadline = address, deadline
        while True:
            try:
                self.conn = socket.create_connection(_control_address(address), timeout=10)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    why = f"link probe: no task answered at {address} (control port): {e}"
                    raise TransientError(why) from None
                time.sleep(0.2)
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lines = self.conn.makefile("rb")

    @contextlib.contextmanager
    def _bounded(self, what: str):
        """Socket calls inside wait until the deadline at most; a timeout or a lost peer is one line."""
        left = self.deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            self.conn.settimeout(left)
            yield
        except TimeoutError:
            raise TransientError(
                f"link probe: the task at {self.address} did not answer {what} within --timeout_s"
            ) from None
        except OSError as e:  # ConnectionError included
            why = f"link probe: lost contact with the task at {self.address} ({what}): {e}"
            raise TransientError(why) from None

    def ask(self, command: str) -> str:
        with self._bounded(command):
            self.conn.sendall(f"{command}\n".encode())
            answer = self.lines.readline()
        if not answer:
            raise TransientError(f"link probe: the task at {self.address} closed its control connection")
        return answer.decode().strip()

    def one_way_ms(self) -> float:
        rtts = []
        for _ in range(LATENCY_SAMPLES):
            start = time.perf_counter()
            self.ask("ping")
            rtts.append(time.perf_counter() - start)
        return statistics.median(rtts) / 2 * 1e3

    def duplex_seconds(self, nbytes: int) -> float:
        with self._bounded(f"a transfer of {nbytes} bytes"):
            start = time.perf_counter()
            self.conn.sendall(f"duplex {nbytes}\n".encode())
            _duplex(self.conn, self.lines, nbytes)
            return time.perf_counter() - start

    def cpu(self) -> float:
        return float(self.ask("cpu"))


def _server(addresses: Sequence[str], me: int):
    import tensorflow as tf

    v1 = tf.compat.v1
    spec = v1.train.ClusterSpec({"worker": list(addresses)})
    return v1.train.Server(spec, job_name="worker", task_index=me, start=True)


def _ring_graph(n: int, floats: int, tensors: int):
    """Host j reads `tensors` tensors of `floats` each from host j+1, all hosts at once; a scalar each."""
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        held = []
        for j in range(n):
            with tf.device(f"/job:worker/task:{j}/device:CPU:0"):
                held.append(
                    [
                        v1.get_local_variable(f"x{j}_{k}", initializer=tf.fill([floats], float(j + 1)))
                        for k in range(tensors)
                    ]
                )
        reads = []
        for j in range(n):
            with tf.device(f"/job:worker/task:{j}/device:CPU:0"):
                reads += [v.read_value()[:1] for v in held[(j + 1) % n]]  # the whole tensor crosses
        step = tf.group(*[tf.reduce_sum(r) for r in reads])
        init = v1.local_variables_initializer()
    return graph, step, init


def _all_cpu(peers) -> float:
    return time.process_time() + sum(p.cpu() for p in peers)


def _grpc_rounds(target: str, n: int, floats: int, tensors: int, repeats: int, peers, timeout: float):
    """(seconds per timed round, CPU seconds of every task per round beyond their rate at rest).

    The tasks' CPU while nothing moves (TF's server threads poll) is measured
    over one untimed round's length and taken off each round, so that what
    remains is the transfers' own: at a slow link it would otherwise count
    as CPU per byte.
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    graph, step, init = _ring_graph(n, floats, tensors)
    config = v1.ConfigProto(operation_timeout_in_ms=int(timeout * 1e3))
    with v1.Session(target, graph=graph, config=config) as session:
        session.run(init)
        start = time.perf_counter()
        session.run(step)  # untimed: graph registration, first connections
        rest = max(0.5, time.perf_counter() - start)
        before, start = _all_cpu(peers), time.perf_counter()
        time.sleep(rest)
        at_rest = (_all_cpu(peers) - before) / (time.perf_counter() - start)  # cores' worth
        seconds, cpu = [], []
        for _ in range(repeats):
            before = _all_cpu(peers)
            start = time.perf_counter()
            session.run(step)
            seconds.append(time.perf_counter() - start)
            cpu.append(max(0.0, _all_cpu(peers) - before - at_rest * seconds[-1]))
    return seconds, cpu


def measure(
    addresses: Sequence[str], link_gbit: float, nbytes: int, repeats: int, timeout: float, server
) -> links.LinkFile:
    """Task 0's measurements of every other host (see module doc); the other tasks must be serving."""
    deadline = time.monotonic() + timeout
    n = len(addresses)
    peers = [_Peer(a, deadline) for a in addresses[1:]]
    try:
        rate = link_gbit * 1e9 / 8
        latency = [p.one_way_ms() for p in peers]
        tcp = []
        for p in peers:
            p.duplex_seconds(nbytes)  # slow start, untimed
            tcp += [nbytes / rate / p.duplex_seconds(nbytes) for _ in range(repeats)]
        floats = nbytes // 4
        seconds, cpu = _grpc_rounds(server.target, n, floats, 1, repeats, peers, timeout)
        grpc_share = [nbytes / rate / t for t in seconds]
        per_byte = [c / (2 * n * floats * 4) for c in cpu]  # each byte: a sending and a receiving end
        _, small_cpu = _grpc_rounds(server.target, n, SMALL_FLOATS, SMALL_TENSORS, repeats, peers, timeout)
        small_bytes = 2 * n * SMALL_TENSORS * SMALL_FLOATS * 4
        per_message = [
            max(0.0, c - statistics.median(per_byte) * small_bytes) / (2 * n * SMALL_TENSORS)
            for c in small_cpu
        ]
        return links.LinkFile(
            tuple(addresses),
            link_gbit,
            tcp_share=links.Measured.of(tcp),
            latency_ms=links.Measured.of(latency),
            grpc_share=links.Measured.of(grpc_share),
            grpc_cpu_s_per_byte=links.Measured.of(per_byte),
            grpc_per_message_s=links.Measured.of(per_message),
        )
    finally:
        for p in peers:
            with contextlib.suppress(OSError, ConnectionError):
                p.ask("bye")
            p.conn.close()


def run_task(
    addresses: Sequence[str],
    me: int,
    link_gbit: float,
    nbytes: int,
    repeats: int,
    timeout: float,
) -> links.LinkFile | None:
    """This host's task: serve, and on task 0 measure (returns the link file there, None elsewhere).

    TF's server starts first, so that a task answering on its control port is ready for gRPC too.
    """
    server = _server(addresses, me)
    control = _Control(addresses[me])
    try:
        if me == 0:
            return measure(addresses, link_gbit, nbytes, repeats, timeout, server)
        if not control.done.wait(timeout):
            raise TimeoutError(f"link probe task {me}: task 0 did not finish within {timeout:.0f} s")
        return None
    finally:
        control.close()
