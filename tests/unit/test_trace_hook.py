"""TraceHook: a transfer-loop round that outlives the traced steps still lands in their trace."""

import glob
import json
import threading

import tensorflow as tf
from tensorflow.core.framework import step_stats_pb2

import disttrain  # noqa: F401  (graph mode)
from disttrain.runtime import metrics

v1 = tf.compat.v1


class Loop:
    """A transfer loop whose one traced round starts inside the traced steps and ends `late` steps after."""

    def __init__(self):
        self.requested = 0
        self.started = threading.Event()
        self.done: list = []

    def trace(self, rounds):
        self.requested += rounds
        self.started.set()

    def stop_tracing(self):
        self.requested = 0
        return self.started.is_set() and not self.done

    def finish(self):
        stats = step_stats_pb2.StepStats()
        node = stats.dev_stats.add(device="/job:ps/replica:0/task:0/device:CPU:0").node_stats.add()
        node.node_name = "late_round/ResourceApplyAdam"
        node.timeline_label = "late_round = ResourceApplyAdam()"
        node.all_start_micros, node.all_end_rel_micros = 1, 2
        self.done.append(stats)

    def take_traces(self):
        taken, self.done = self.done, []
        return taken


def test_a_round_that_ends_after_the_traced_steps_is_in_the_last_trace(tmp_path):
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        train = v1.assign_add(step, 1)
        loop = Loop()
        hook = metrics.TraceHook(str(tmp_path), steps=2, after_steps=1, global_step=step, loops=[loop])
        with v1.train.MonitoredSession(hooks=[hook]) as session:
            for i in range(6):
                session.run(train)
                if i == 4:  # two steps after the last traced one (steps 2 and 3)
                    loop.finish()
        traces = sorted(glob.glob(str(tmp_path / "trace_step_*.json")))
    assert len(traces) == 2 and loop.requested == 0  # no traced round starts after the traced steps
    events = [json.load(open(t))["traceEvents"] for t in traces]
    names = [{e["args"]["name"] for e in trace if e.get("ph") == "X"} for trace in events]
    assert "late_round/ResourceApplyAdam" in names[-1] and "late_round/ResourceApplyAdam" not in names[0]


def test_two_traced_steps_that_read_one_global_step_write_two_files(tmp_path):
    """Overlap's global step is a worker-side mirror that can lag: one value, two steps, two files."""
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        read = step.read_value()
        hook = metrics.TraceHook(str(tmp_path), steps=3, after_steps=1, global_step=step)
        with v1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(5):
                session.run(read)
    assert len(glob.glob(str(tmp_path / "trace_step_*.json"))) == 3 == len(set(hook.written))
