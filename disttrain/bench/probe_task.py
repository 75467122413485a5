"""One emulated host's part of a transport probe (disttrain/bench/link_probe.py); run by file path.

    python probe_task.py <host> <addresses,...> <method> <bytes> <pieces> <repeats>

method: tcp_ring, tcp_all_to_all (plain sockets, no TensorFlow), tf_ring (TF's
collective ring all-reduce, `pieces` = max_subdivs), tf_all_to_all (a reduce-
scatter and an all-gather built from queues on each host, over TF's gRPC, in
`pieces` pipelined pieces). Each host sends and receives `bytes` per direction
for tcp_*, and all-reduces a float32 tensor of `bytes` for tf_*. Protocol on
stdio: prints "ready", waits for a line, does one untimed round (tf_*) then
`repeats` timed rounds, prints "seconds t1,t2,...", waits for a line, exits.
It imports no disttrain (whose import would switch TensorFlow's mode) and
nothing at all for the TCP methods but the standard library.
"""

import socket
import sys
import threading
import time

PORT = 7100
CHUNK = 1 << 20


def _tcp(
    me: int, addrs: list[str], targets: list[int], nbytes: int, senders: int, repeats: int
) -> list[float]:
    """Send nbytes (split evenly over targets) to targets while receiving from `senders` peers."""
    server = socket.create_server((addrs[me], PORT), backlog=16)
    received, lock = [0], threading.Lock()

    def serve(conn):
        while data := conn.recv(CHUNK):
            with lock:
                received[0] += len(data)

    def accept():
        for _ in range(senders):
            threading.Thread(target=serve, args=(server.accept()[0],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    conns, deadline = [], time.monotonic() + 60
    for t in targets:
        while True:
            try:
                conns.append(socket.create_connection((addrs[t], PORT)))
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"probe: host {me} could not connect to host {t} ({addrs[t]}): {e}"
                    ) from None
                time.sleep(0.01)
    _handshake()
    buf, share, times = memoryview(b"x" * CHUNK), nbytes // len(targets), []
    for r in range(repeats):
        start = time.monotonic()

        def send(conn):
            left = share
            while left > 0:
                left -= conn.send(buf[: min(left, CHUNK)])

        threads = [threading.Thread(target=send, args=(c,)) for c in conns]
        [t.start() for t in threads]
        [t.join() for t in threads]
        while received[0] < share * senders * (r + 1):  # this round's bytes from every sender
            time.sleep(0.001)
        times.append(time.monotonic() - start)
    return times


def _tf(me: int, addrs: list[str], method: str, nbytes: int, pieces: int, repeats: int) -> list[float]:
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    n = len(addrs)
    config = v1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    config.experimental.collective_group_leader = "/job:worker/replica:0/task:0"
    spec = v1.train.ClusterSpec({"worker": [f"{a}:{PORT}" for a in addrs]})
    server = v1.train.Server(spec, job_name="worker", task_index=me, config=config)

    def device(task):
        return f"/job:worker/task:{task}/device:CPU:0"

    length = nbytes // 4 // (n * pieces) * (n * pieces)
    with tf.device(device(me)):
        value = v1.get_local_variable("x", initializer=tf.fill([length], float(me + 1))).read_value()
        if method == "tf_ring":
            summed = [
                tf.raw_ops.CollectiveReduceV2(
                    input=value,
                    group_size=n,
                    group_key=1,
                    instance_key=1,
                    ordering_token=[],
                    merge_op="Add",
                    final_op="Id",
                    max_subdivs_per_device=pieces,
                )
            ]
        else:
            summed = [
                _all_to_all(tf, piece, me, n, p, device) for p, piece in enumerate(tf.split(value, pieces))
            ]
        # A scalar per piece, so that fetching the step moves nothing more.
        step = tf.group(*[tf.reduce_sum(s[:1]) for s in summed])
        check = tf.reduce_sum(summed[0][:1])
    with v1.Session(server.target, config=config) as session:
        session.run(v1.local_variables_initializer())
        _handshake()
        _, got = session.run([step, check])  # the untimed round, checked
        expected = n * (n + 1) / 2
        if got != expected:
            raise SystemExit(f"probe: {method} summed {got}, expected {expected}")
        times = []
        for _ in range(repeats):
            start = time.monotonic()
            session.run(step)
            times.append(time.monotonic() - start)
    return times


def _all_to_all(tf, piece, me: int, n: int, p: int, device):
    """Sum of `piece` over n hosts: shard j goes to host j's queue, is summed there, and comes back."""
    shards = tf.split(piece, n)
    size = shards[0].shape[0]

    def queue(kind, host, dtypes, shapes):
        with tf.device(device(host)):
            return tf.queue.FIFOQueue(
                2 * n, dtypes, shapes, shared_name=f"{kind}_{p}_{host}", name=f"{kind}_{p}_{host}"
            )

    others = [j for j in range(n) if j != me]
    sent = [queue("scatter", j, [tf.float32], [[size]]).enqueue([shards[j]]) for j in others]
    with tf.control_dependencies(sent):
        mine = (
            tf.reduce_sum(queue("scatter", me, [tf.float32], [[size]]).dequeue_many(n - 1), axis=0)
            + shards[me]
        )
    shapes = [[], [size]]
    back = [queue("gather", j, [tf.int32, tf.float32], shapes).enqueue([me, mine]) for j in others]
    with tf.control_dependencies(back):
        owners, parts = queue("gather", me, [tf.int32, tf.float32], shapes).dequeue_many(n - 1)
    order = tf.concat([owners, [me]], 0)[:, None]
    return tf.reshape(tf.scatter_nd(order, tf.concat([parts, mine[None]], 0), [n, size]), [-1])


def _handshake() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def main(argv: list[str]) -> None:
    me, addrs, method = int(argv[1]), argv[2].split(","), argv[3]
    nbytes, pieces, repeats = int(argv[4]), int(argv[5]), int(argv[6])
    n = len(addrs)
    if method == "tcp_ring":
        times = _tcp(me, addrs, [(me + 1) % n], nbytes, 1, repeats)
    elif method == "tcp_all_to_all":
        others = [j for j in range(n) if j != me]
        times = _tcp(me, addrs, others, nbytes, n - 1, repeats)
    elif method in ("tf_ring", "tf_all_to_all"):
        times = _tf(me, addrs, method, nbytes, pieces, repeats)
    else:
        raise SystemExit(f"probe: unknown method {method!r}")
    print("seconds " + ",".join(f"{t:.4f}" for t in times), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main(sys.argv)
