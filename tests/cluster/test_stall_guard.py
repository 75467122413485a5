"""A replica whose steps move no global step stops with one line and exit code 4, in every strategy.

The train op is broken on purpose: the optimizer's apply_gradients returns a
no-op, so steps run (and look fast) but nothing is applied, as SyncAllReduce's
graph cycle once did for CIFAR-10 (decision 0027, issue 20). Real processes:
one alone, and real clusters under each strategy.
"""

from __future__ import annotations

import pytest

from disttrain.base.errors import EXIT_STALLED
from tests import extended_beyond
from tests.cluster.test_own_model import cluster_of, logs, run_all, start, start_all

pytestmark = pytest.mark.cluster

BROKEN = """
import tensorflow as tf

import disttrain

v1 = tf.compat.v1


class AppliesNothing(v1.train.GradientDescentOptimizer):
    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        return tf.no_op()


def loss_fn():
    x = tf.random.normal([8, 16])
    return tf.reduce_mean(tf.square(tf.matmul(x, v1.get_variable("w", [16, 16])) - x))


disttrain.fit(
    loss_fn,
    lambda: AppliesNothing(0.1),
    steps=1000,
    logdir="{logdir}",
    strategy={strategy},
    log_every_steps=5,
    stall_steps=12,
)
"""

STRATEGIES = {
    "async": "disttrain.AsyncParameterServer",
    "sync": "disttrain.SyncParameterServer",
    "allreduce": "disttrain.SyncAllReduce",
}


def broken_script(tmp_path, strategy: str) -> str:
    path = tmp_path / "broken.py"
    path.write_text(BROKEN.format(logdir=tmp_path / "logdir", strategy=STRATEGIES[strategy]))
    return str(path)


def test_one_process_stops_when_its_step_never_moves(tmp_path):
    codes = run_all({"local": start(broken_script(tmp_path, "async"), tmp_path, None, "local", 0)}, tmp_path)
    assert codes == {"local": EXIT_STALLED}, logs(tmp_path)
    errors = [line for line in logs(tmp_path).splitlines() if line.startswith("disttrain: error:")]
    assert errors == [
        "disttrain: error: AsyncParameterServer: the global step has not moved in 12 of this replica's "
        "steps (still 0): its train op applies no update; stopping (RunSettings.stall_steps sets the window)"
    ]


# CI: the sync PS replica (one process's guard is tested above); async and all-reduce: extended (CI's time).
@pytest.mark.parametrize("strategy", extended_beyond(STRATEGIES, {"sync"}))
def test_a_replica_of_a_cluster_stops_naming_its_strategy(tmp_path, strategy):
    cluster = cluster_of(strategy)
    path = broken_script(tmp_path, strategy)
    procs = start_all(path, tmp_path, cluster)
    replicas = {name: p for name, p in procs.items() if not name.startswith("ps")}
    try:
        codes = run_all(replicas, tmp_path, timeout=180)
    finally:
        for p in procs.values():  # a PS serves on: it cannot know that its replicas will not come back
            if p.poll() is None:
                p.kill()
    text = logs(tmp_path)
    name = STRATEGIES[strategy].split(".")[1]
    # The replica that saw it says so and exits 4; with all-reduce its peer may see the lost
    # collective first (exit 150). None trains on.
    assert EXIT_STALLED in codes.values() and set(codes.values()) <= {EXIT_STALLED, 150}, (codes, text)
    assert f"disttrain: error: {name}: the global step has not moved in 12 of this replica's steps" in text
