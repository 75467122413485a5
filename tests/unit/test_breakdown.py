"""Where a step goes (disttrain.runtime.breakdown): what counts as what, the sweep, and a real trace.

The real trace is of a step whose variable lives on a PS task of a real
two-server cluster (both servers in this process): its gradient crosses to
the PS, where the update runs.
"""

from __future__ import annotations

import dataclasses

import pytest
import tensorflow as tf
from tensorflow.core.framework import step_stats_pb2

import disttrain  # noqa: F401  (graph mode)
from disttrain.edges.local import free_port
from disttrain.runtime import breakdown
from disttrain.runtime.breakdown import Span, part_of, sweep

v1 = tf.compat.v1
ME = "/job:worker/task:0"
WORKER = "/job:worker/replica:0/task:0/device:CPU:0"
PS0 = "/job:ps/replica:0/task:0/device:CPU:0"
PS1 = "/job:ps/replica:0/task:1/device:CPU:0"


@pytest.mark.parametrize(
    "name, op, device, peer, expected",
    [
        ("dense/MatMul", "MatMul", WORKER, "", ("compute", "")),
        ("IteratorGetNext", "IteratorGetNext", WORKER, "", ("input", "")),
        ("allreduce/CollectiveReduceV2", "CollectiveReduceV2", WORKER, "", ("peers", "")),
        ("sync_queues/token_0_Dequeue", "QueueDequeueV2", WORKER, "", ("peers", "")),
        ("gradient_queue/gradients_enqueue", "QueueEnqueueV2", WORKER, "", ("transfer", "")),
        ("other_queue/Dequeue", "QueueDequeueV2", WORKER, "", ("compute", "")),
        ("edge_7_v", "RecvTensor", WORKER, PS1, ("transfer", "/job:ps/task:1")),
        ("edge_9_grad", "RecvTensor", PS0, WORKER, ("transfer", "/job:ps/task:0")),
        ("update_v/ResourceApplyAdam", "ResourceApplyAdam", PS0, "", ("transfer", "/job:ps/task:0")),
        ("tower/MatMul", "MatMul", "/job:worker/replica:0/task:1/device:CPU:0", "", ("", "")),
    ],
)
def test_each_op_counts_as_its_part(name, op, device, peer, expected):
    assert part_of(name, op, device, peer, ME) == expected


def test_compute_hides_the_transfer_beside_it_and_an_instant_with_nothing_running_is_the_frameworks():
    found = [
        Span(0.0, 4.0, "compute"),
        Span(3.0, 7.0, "transfer", "/job:ps/task:0"),  # 3-4 hidden behind compute; 4-7 exposed
        Span(5.0, 6.0, "transfer", "/job:ps/task:1"),  # shares 5-6 with ps0
        Span(8.0, 9.0, "input"),  # 7-8: nothing running
        Span(8.5, 10.0, "peers"),  # 8.5-9 under input
    ]
    seconds, by_ps, window = sweep(found)
    assert window == 10.0
    assert seconds == {"compute": 4.0, "input": 1.0, "peers": 1.0, "transfer": 3.0, "framework": 1.0}
    assert by_ps == {"/job:ps/task:0": 2.5, "/job:ps/task:1": 0.5}
    assert sweep([]) == (dict.fromkeys(breakdown.PARTS, 0.0), {}, 0.0)
    assert breakdown.moving(found) == 4.0  # 3-7, hidden or not, ps1's inside it
    assert breakdown.moving([]) == 0.0


def stats_of(nodes) -> step_stats_pb2.StepStats:
    """A StepStats with one node per (device, node_name, timeline_label, start µs, length µs)."""
    stats = step_stats_pb2.StepStats()
    for device, name, label, start, length in nodes:
        node = stats.dev_stats.add(device=device).node_stats.add()
        node.node_name, node.timeline_label = name, label
        node.all_start_micros, node.all_end_rel_micros = start, length
    return stats


def test_the_trace_labels_tensorflow_writes_are_read_for_part_peer_and_bytes():
    stats = stats_of(
        [
            (WORKER, "MatMul", "[cpu 3.8MB 3.8MB] grad/MatMul = MatMul(IteratorGetNext, Tile)", 100, 50),
            (WORKER, "IteratorGetNext", "IteratorGetNext = IteratorGetNext(OneShotIterator)", 0, 100),
            (PS0, "RecvTensor", f"[3.8MB] [1.9Gb/s] edge_10_grad from {WORKER} to {PS0}", 150, 30),
            (WORKER, "RecvTensor", f"[512B] [0.1Mb/s] edge_7_v from {PS1} to {WORKER}", 0, 10),
            (PS0, "update", "update = ResourceApplyGradientDescent(v, lr, grad)", 180, 20),
        ]
    )
    found = breakdown.spans(stats, ME)
    assert [(s.part, s.ps, s.nbytes) for s in found] == [
        ("compute", "", 0.0),
        ("input", "", 0.0),
        ("transfer", "/job:ps/task:0", 3.8 * 2**20),
        ("transfer", "/job:ps/task:1", 512.0),
        ("transfer", "/job:ps/task:0", 0.0),
    ]
    seconds, _, window = sweep(found)
    assert window == pytest.approx(200e-6)
    assert seconds["input"] == pytest.approx(100e-6) and seconds["transfer"] == pytest.approx(50e-6)


def test_the_summary_line_names_each_part_and_each_ps():
    result = breakdown.Breakdown(
        step_secs=0.1,
        seconds={"compute": 0.06, "input": 0.01, "peers": 0.0, "transfer": 0.02, "framework": 0.01},
        transfer_by_ps={"/job:ps/task:0": 0.015, "/job:ps/task:1": 0.005},
        traced=3,
        trace_cost=0.004,
    )
    assert result.summary() == (
        "step 100.0 ms: compute 60%, input 10%, peers 0%, transfer 20% (ps0 15%, ps1 5%), framework 10% "
        "(3 step(s) traced, 0.4% of the run)"
    )
    assert breakdown.Breakdown.of({**dataclasses.asdict(result), "later_field": 1}) == result


def test_a_real_step_on_a_ps_task_splits_into_parts_that_add_up_to_the_step(tmp_path):
    spec = {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"]}
    cluster = tf.train.ClusterSpec(spec)
    servers = [tf.distribute.Server(cluster, job, 0, start=True) for job in ("ps", "worker")]
    with tf.Graph().as_default():
        with tf.device("/job:ps/task:0"):
            v = v1.get_variable("v", [500, 500])
        with tf.device("/job:worker/task:0"):
            batches = tf.data.Dataset.from_tensors(tf.ones([8, 500])).repeat()
            x = v1.data.make_one_shot_iterator(batches).get_next()
            step = v1.train.get_or_create_global_step()
            loss = tf.reduce_sum(tf.matmul(x, v))
            train = v1.train.GradientDescentOptimizer(1e-6).minimize(loss, global_step=step)
        hook = breakdown.BreakdownHook(
            ME, after_steps=2, budget=1.0, task_logdir=str(tmp_path), global_step=step
        )
        with v1.train.MonitoredSession(
            v1.train.ChiefSessionCreator(master=servers[1].target), hooks=[hook]
        ) as session:
            for _ in range(40):
                session.run(train)
        result = hook.breakdown()
    assert result is not None and result.traced >= 1
    assert sum(result.seconds.values()) == pytest.approx(result.step_secs)
    assert set(result.seconds) == set(breakdown.PARTS)
    assert result.seconds["compute"] > 0 and result.seconds["transfer"] > 0
    assert set(result.transfer_by_ps) == {"/job:ps/task:0"}
    # The gradient of v (500 x 500 float32) crosses to the PS each step, as the trace labels say.
    assert result.bytes_by_ps["/job:ps/task:0"] >= 0.9 * 500 * 500 * 4
    assert 0 <= result.trace_cost < 1


def test_the_parts_that_bind_the_step_are_named_longest_first_with_their_evidence():
    where = breakdown.Breakdown(
        step_secs=0.1,
        seconds={"compute": 0.03, "input": 0.025, "peers": 0.0, "transfer": 0.04, "framework": 0.005},
        bytes_by_ps={"/job:ps/task:0": 3 * 2**20, "/job:ps/task:1": 2**20},
    )
    found = breakdown.causes(where, "worker_1", ps_loads=[30, 10])
    assert [c.part for c in found] == ["transfer", "input"]  # framework: 5% of the step, below BINDS
    assert found[0].text == (
        "one PS holds most of the bytes (busiest/mean 1.5); moving variables and gradients takes "
        "40 ms of a 100 ms step (4.0 MiB a step)"
    )
    assert found[1].text == "most of worker_1's step waits for its input pipeline (25 ms of a 100 ms step)"
    assert breakdown.verdict(where, "worker_1", [20, 20]).startswith("moving variables")  # balanced
    quiet = dataclasses.replace(where, seconds={"compute": 0.092, "framework": 0.008}, step_secs=0.1)
    assert breakdown.verdict(quiet, "worker_1") == "no bottleneck: compute is 92% of worker_1's step (100 ms)"
    assert breakdown.causes(breakdown.Breakdown(), "worker_0") == []  # nothing measured: nothing named
    # Cores all busy: named first when this process got less than a core's worth a step (it waited for
    # one), not when it computed on its own core all along (a compute-bound run, no false alarm).
    full = dataclasses.replace(quiet, machine_busy=1.96, machine_cores=2)
    waited = breakdown.causes(dataclasses.replace(full, cpu_secs=0.04), "worker_1")
    assert [c.part for c in waited] == [breakdown.CORES]
    assert waited[0].text.startswith("this machine's 2 cores were 98% busy while worker_1 stepped")
    computing = dataclasses.replace(full, cpu_secs=0.1)
    assert breakdown.verdict(computing, "worker_1").startswith("no bottleneck: compute is 92%")
    # In a cgroup with a CPU quota, the cores are the quota and busy is the group's own time: a task
    # that got all of it a step computed on a slower core (no alarm); one that got less shared it.
    limited = dataclasses.replace(
        full, machine_busy=0.45, machine_cores=0.45, cores_limited=True, cpu_secs=0.044
    )
    assert breakdown.verdict(limited, "worker_1").startswith("no bottleneck: compute is 92%")
    assert "its CPU limit of 0.45 core(s) 100% busy" in limited.summary()
    shared = dataclasses.replace(limited, cpu_secs=0.02)  # the PS on its host took the rest
    assert breakdown.causes(shared, "worker_1")[0].text.startswith(
        "its CPU limit of 0.45 core(s) were 100% busy while worker_1 stepped"
    )
