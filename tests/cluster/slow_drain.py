"""A test-only AsyncParameterServer (overlap) whose replica 1 holds its last transfer rounds at a gate.

Imported into task processes by a gin file (`import tests.cluster.slow_drain`).
Replica 1's transfer loop, in any round that starts once the step the
replica stops by (`stop_step_read`: its global step with its own queued
gradients counted) is within one of `last_step`, writes `<gate_file>.held`
and waits (at most 300 s) until `gate_file` exists before pushing. The one
(counted or not yet, as the round dequeues it) takes the replica to the last
step at its next step, at the latest, so it stops there and ends in the
drain, waiting for those rounds: the test lets the PS leave meanwhile, then
opens the gate.
Fault injection stays out of the library's public constructors.
"""

import os
import time

import gin
import numpy as np
import tensorflow as tf

from disttrain.base import tf_internals
from disttrain.strategies import AsyncParameterServer


class SlowDrainAsyncParameterServer(AsyncParameterServer):
    def __init__(self, cluster, gate_file: str = "", last_step: int = 0, **kwargs):
        super().__init__(cluster, overlap=True, **kwargs)
        self.gate_file, self.last_step = gate_file, last_step

    def apply_gradients(self, optimizer, grads_and_vars, global_step):
        graph = tf.compat.v1.get_default_graph()
        before = len(graph.get_operations())
        step = super().apply_gradients(optimizer, grads_and_vars, global_step)
        if self.cluster.replica_index != 1:
            return step
        built = graph.get_operations()[before:]
        (dequeue,) = [op for op in built if op.type.startswith("QueueDequeue")]
        pushes = [op for op in built if op.type.startswith("ResourceApply")]
        with tf.device(self.compute_devices[0]):
            held = tf.numpy_function(self._hold, [self.stop_step_read, dequeue.outputs[0]], tf.int64)
        for push in pushes:
            tf_internals.add_control_input(push, held.op)
        return step

    def _hold(self, stop_step, _):
        if stop_step >= self.last_step - 1:
            open(f"{self.gate_file}.held", "w").close()
            deadline = time.monotonic() + 300
            while not os.path.exists(self.gate_file) and time.monotonic() < deadline:
                time.sleep(0.05)
        return np.int64(0)


gin.external_configurable(SlowDrainAsyncParameterServer, "SlowDrainAsyncParameterServer")
