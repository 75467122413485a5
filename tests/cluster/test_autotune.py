"""SyncAllReduce(autotune=True) on a real 2-replica cluster: it trains, agrees, and keeps the copies equal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from disttrain.edges.local import free_port, task_env
from tests.cluster.test_own_model import logs, run_all

pytestmark = pytest.mark.cluster

STEPS = 20
# Each replica trains on its own data; at the end it writes its variables and the chosen setting.
SCRIPT = """
import json
import sys

import numpy as np
import tensorflow as tf

import disttrain

v1 = tf.compat.v1
logdir = sys.argv[1]
cluster = disttrain.Cluster.from_env()
strategy = disttrain.SyncAllReduce(
    cluster, bucket_bytes=4096, autotune=True, autotune_grid=((256, None), (1 << 20, 8), (4096, 2))
)


def loss_fn():
    x = tf.random.stateless_normal([8, 16], seed=[cluster.task_index, 1])
    h = tf.nn.relu(tf.matmul(x, v1.get_variable("w1", [16, 32])) + v1.get_variable("b1", [32]))
    return tf.reduce_mean(tf.square(tf.matmul(h, v1.get_variable("w2", [32, 16])) - x))


class Record(v1.train.SessionRunHook):
    def begin(self):
        self.variables = v1.trainable_variables()

    def end(self, session):
        values = session.run({v.op.name: v for v in self.variables})
        np.savez(f"{logdir}/variables_{cluster.task_index}.npz", **values)


with strategy.scope():
    train_op = strategy.minimize(v1.train.AdamOptimizer(0.01), loss_fn)
with disttrain.session(strategy, steps=STEPS, logdir=logdir, log_every_steps=5, hooks=[Record()]) as session:
    losses = []
    while not session.should_stop():
        losses.append(float(session.run([train_op, strategy.loss])[1]))
chosen = strategy.tuner.chosen
with open(f"{logdir}/chosen_{cluster.task_index}.json", "w") as f:
    json.dump({"chosen": [chosen.bucket_bytes, chosen.max_subdivs], "losses": losses}, f)
""".replace("STEPS", str(STEPS))


def test_autotuned_replicas_train_choose_the_same_setting_and_stay_identical(tmp_path):
    path = tmp_path / "autotuned.py"
    path.write_text(SCRIPT)
    logdir = tmp_path / "logdir"
    logdir.mkdir()
    cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(2)]}
    procs = {}
    for index in range(2):
        env = task_env({k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        log = open(tmp_path / f"worker_{index}.log", "w")
        procs[f"worker_{index}"] = subprocess.Popen(
            [sys.executable, str(path), str(logdir)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    codes = run_all(procs, tmp_path, timeout=180)
    assert set(codes.values()) == {0}, (codes, logs(tmp_path))

    chosen = [json.loads((logdir / f"chosen_{i}.json").read_text()) for i in range(2)]
    assert chosen[0]["chosen"] == chosen[1]["chosen"]
    assert chosen[0]["chosen"] in ([256, -1], [1 << 20, 8], [4096, 2], [4096, -1])
    for i in range(2):
        text = (tmp_path / f"worker_{i}.log").read_text()
        # Every candidate was timed and the choice logged, on every replica.
        (line,) = re.findall(r"all-reduce autotune chose .*", text)
        assert line.count(" ms") == 4, line
        losses = chosen[i]["losses"]
        assert len(losses) == STEPS and losses[-1] < losses[0], losses

    values = [np.load(logdir / f"variables_{i}.npz") for i in range(2)]
    assert sorted(values[0].files) == ["b1", "w1", "w2"]
    for name in values[0].files:
        np.testing.assert_array_equal(values[0][name], values[1][name], err_msg=name)
