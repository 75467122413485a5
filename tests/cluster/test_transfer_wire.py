"""16-bit transfer on real servers: the bytes TF's runtime received between tasks in a step.

Two PS tasks and a worker, each a TensorFlow server in a process of its own
on loopback; this test's session runs one strategy's step on the worker
with a full trace, and sums the bytes of the trace's RecvTensor records
between tasks (TF's own count of each tensor it received over gRPC, after
its placer and Grappler have had their say, which the graph alone cannot
show).
The same model as tests/unit/test_transfer_bytes.py; with transfer_dtype
'bfloat16' a step must receive at most 0.55 of float32's bytes. The
emulated links' interface counters (tests/netem/test_transfer_link.py, as
root) add gRPC's own bytes to these.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from disttrain.base.cluster import Cluster
from disttrain.edges.local import free_port, task_env
from disttrain.graph import placement
from disttrain.strategies import AsyncParameterServer, SyncParameterServer
from tests.unit.test_transfer_bytes import loss_fn

pytestmark = pytest.mark.cluster
v1 = tf.compat.v1

SERVER = """
import json, sys
import tensorflow as tf
spec = tf.train.ClusterSpec(json.loads(sys.argv[1]))
tf.distribute.Server(spec, job_name=sys.argv[2], task_index=int(sys.argv[3])).join()
"""
_RECV = re.compile(r"\] (\S+) from (\S+) to (\S+)$")  # the label's tensor, sending and receiving devices
RUN_MS = 60_000  # a run that takes longer has lost a server
# A worker logs a RecvTensor record when the tensor has arrived, and the master collects the
# step's records when the step ends: one that ends the step (the last gradient's, whose update
# is all that is left) may be logged too late and missed. Each tensor counts with the most bytes
# any of several traced steps saw for it (a step's transfers are the same every step).
TRACED_STEPS = 6

MODES = {
    "async": (AsyncParameterServer, 1, {}),
    "async_pieces": (AsyncParameterServer, 1, {"piece_bytes": 65536}),
    "async_overlap": (AsyncParameterServer, 1, {"overlap": True}),
    "async_overlap_pieces": (AsyncParameterServer, 1, {"overlap": True, "piece_bytes": 65536}),
    "sync_ps_one_replica": (SyncParameterServer, 1, {}),
    "sync_ps": (SyncParameterServer, 2, {}),  # the accumulators' adds (the step then waits for the others)
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two PS and two workers' addresses; the PS tasks and worker 0 serving, each in its own process."""
    logs = tmp_path_factory.mktemp("servers")
    jobs = {"ps": [f"127.0.0.1:{free_port()}" for _ in range(2)]}
    jobs["worker"] = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    procs = []
    try:
        for job, index in (("ps", 0), ("ps", 1), ("worker", 0)):
            log = open(logs / f"{job}{index}.log", "w")
            argv = [sys.executable, "-c", SERVER, json.dumps(jobs), job, str(index)]
            env = task_env(dict(os.environ))
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
        for address in jobs["ps"] + jobs["worker"][:1]:
            _wait_listening(address, procs, timeout=60)
        yield jobs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)


def _wait_listening(address: str, procs, timeout: float) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        assert all(p.poll() is None for p in procs), "a server process exited"
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"{address} not listening after {timeout} s"
            time.sleep(0.2)


def step_runs(strategy, train_op) -> list:
    """The session runs of one step: with overlap its transfer round too; sync PS with peers, its adds."""
    if isinstance(strategy, SyncParameterServer) and strategy.aggregates:
        graph = train_op.graph
        return [[op for op in graph.get_operations() if op.type.endswith("AccumulatorApplyGradient")]]
    return [train_op, *([strategy.transfer_op] if getattr(strategy, "transfer_op", None) else [])]


def received_between_tasks(jobs, mode: str, transfer_dtype: str | None) -> tuple[int, dict]:
    """Bytes a step of `mode` received across tasks, and those bytes by tensor (see TRACED_STEPS)."""
    cls, replicas, knobs = MODES[mode]
    cluster = Cluster.from_hosts("worker", 0, jobs["ps"], jobs["worker"][:replicas])
    strategy = cls(cluster, transfer_dtype=transfer_dtype, **knobs)
    target = f"grpc://{jobs['worker'][0]}"

    def scoped_loss():
        # Variables of their own on the PS tasks: another mode's plan cuts the same names otherwise.
        with v1.variable_scope(f"{mode}_{transfer_dtype}"):
            return loss_fn()

    with tf.Graph().as_default():
        with strategy.scope():
            train_op = strategy.minimize(v1.train.AdamOptimizer(0.01), scoped_loss)
        runs = step_runs(strategy, train_op)
        with v1.Session(target, config=strategy.session_config()) as session:
            bounded = v1.RunOptions(timeout_in_ms=RUN_MS)
            session.run(v1.global_variables_initializer(), options=bounded)
            session.run(v1.local_variables_initializer(), options=bounded)  # copies read the PS's values
            steps = []
            for _ in range(TRACED_STEPS):
                by_tensor: dict[str, int] = {}
                for fetch in runs:
                    traced = v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE, timeout_in_ms=RUN_MS)
                    metadata = v1.RunMetadata()
                    session.run(fetch, options=traced, run_metadata=metadata)
                    _count(metadata.step_stats, by_tensor)
                steps.append(by_tensor)
    most = {name: max(step.get(name, 0) for step in steps) for step in steps for name in step}
    return sum(most.values()), most


def _count(step_stats, by_tensor: dict) -> None:
    """Bytes of the RecvTensor records between different tasks in `step_stats` (added to `by_tensor`)."""
    for device in step_stats.dev_stats:
        for node in device.node_stats:
            found = _RECV.search(node.timeline_label)
            if node.node_name != "RecvTensor" or not found or not node.output:
                continue
            if placement.task_of(found[2]) != placement.task_of(found[3]):
                nbytes = node.output[0].tensor_description.allocation_description.requested_bytes
                by_tensor[found[1]] = by_tensor.get(found[1], 0) + nbytes


@pytest.mark.parametrize("mode", list(MODES))
def test_a_16_bit_step_receives_at_most_0_55_of_float32s_bytes(servers, mode):
    full, _ = received_between_tasks(servers, mode, None)
    half, tensors = received_between_tasks(servers, mode, "bfloat16")
    print(f"{mode}: float32 {full} B, bfloat16 {half} B received between tasks ({half / full:.3f})")
    assert full > 256 * 256 * 4  # the dense layer's bytes crossed at least once
    biggest = sorted(tensors.items(), key=lambda item: -item[1])[:6]
    assert half <= 0.55 * full, (mode, half, full, biggest)
