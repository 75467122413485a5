"""A real cluster: PS and workers as separate processes on loopback, trained to a set step."""

import glob
import json
import os

import pytest
import tensorflow as tf

from disttrain.launch import read_results
from tests.cluster.helpers import TINY, describe_failure, run_cluster, scalars, texts

pytestmark = pytest.mark.cluster

MLP = ["gin/mlp_async.gin", TINY]


def test_two_ps_two_workers_train_and_every_process_exits_0(tmp_path):
    cluster, codes = run_cluster(
        tmp_path,
        MLP,
        num_ps=2,
        num_workers=2,
        # Enough steps that the chief logs several intervals even if the other worker takes most steps.
        gin_params=[
            "TrainConfig.train_steps=200",
            "TrainConfig.log_every_steps=4",
            "TrainConfig.trace_steps=1",
        ],
    )
    assert all(code == 0 for code in codes.values()), describe_failure(cluster) + str(codes)
    logdir = cluster.logdir

    losses = scalars(logdir, "loss")
    assert len(losses) >= 2, describe_failure(cluster)
    assert losses[-1][1] < losses[0][1], losses  # the loss falls
    assert scalars(logdir, "examples/sec") and scalars(logdir, "global_step/sec")
    for worker in ("worker_0", "worker_1"):  # each worker's own throughput
        assert scalars(os.path.join(logdir, "tasks", worker), "examples/sec")

    step = tf.train.load_checkpoint(logdir).get_tensor("global_step")
    assert step >= 200
    assert os.path.exists(os.path.join(logdir, "operative_config.gin"))
    # TensorBoard says what ran: settings, cluster, strategy, placement, the operative gin config.
    described = texts(logdir)
    assert set(described) == {
        "run/settings",
        "run/cluster",
        "run/strategy",
        "run/placement",
        "run/gin_config",
    }
    assert "/job:worker/task:0" in described["run/cluster"] and "/job:ps/task:1" in described["run/cluster"]
    assert described["run/strategy"].strip().startswith("AsyncParameterServer(num_towers=1")
    assert "busiest PS / mean" in described["run/placement"]
    assert "TrainConfig.train_steps = 200" in described["run/gin_config"]
    assert "log_every_steps=4" in described["run/settings"]
    r = read_results(logdir)
    assert set(r) == {"worker_0", "worker_1"} and all(x["local_steps"] > 0 for x in r.values())
    for worker in ("worker_0", "worker_1"):  # one step's Chrome trace each, the PS ops included
        (trace,) = glob.glob(os.path.join(logdir, "tasks", worker, "trace_step_*.json"))
        events = json.load(open(trace))["traceEvents"]
        devices = {e["args"]["name"].split()[0] for e in events if e.get("name") == "process_name"}
        assert {d.split("/replica")[0] for d in devices} >= {"/job:ps", f"/job:{worker.split('_')[0]}"}, (
            devices
        )
        assert any(e.get("ph") == "X" and e["args"]["name"].startswith("fc") for e in events)
    chief_log = open(cluster.chief_task.log_path).read()
    assert "busiest PS / mean" in chief_log  # the placement report, printed by the chief


def test_overlap_trace_shows_the_transfer_loop_beside_the_step(tmp_path):
    """With overlap a step never touches the PS: its trace must carry the loop's rounds too."""
    cluster, codes = run_cluster(
        tmp_path,
        MLP,
        num_ps=1,
        num_workers=1,
        gin_params=[
            "TrainConfig.train_steps=40",
            "TrainConfig.log_every_steps=10",
            "TrainConfig.trace_steps=3",
            "AsyncParameterServer.overlap=True",
            "AsyncParameterServer.piece_bytes=4096",
        ],
    )
    assert all(code == 0 for code in codes.values()), describe_failure(cluster) + str(codes)
    traces = glob.glob(os.path.join(cluster.logdir, "tasks", "worker_0", "trace_step_*.json"))
    assert len(traces) == 3
    ops = []
    for trace in traces:
        ops += [e["args"] for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
    names = {(a["name"].split("/")[0], a["op"]) for a in ops}
    assert ("pull", "AssignVariableOp") in names  # the loop's pulls into the worker's copies
    assert any(op.startswith("ResourceApply") for _, op in names)  # the loop's updates, on the PS
    assert any(name.startswith("fc") for name, _ in names)  # the step's own compute


def test_restart_resumes_from_the_latest_checkpoint(tmp_path):
    first, codes = run_cluster(
        tmp_path, MLP, num_ps=1, num_workers=1, gin_params=["TrainConfig.train_steps=20"]
    )
    assert set(codes.values()) == {0}, describe_failure(first)
    step1 = tf.train.load_checkpoint(first.logdir).get_tensor("global_step")
    second, codes = run_cluster(
        tmp_path, MLP, num_ps=1, num_workers=1, gin_params=["TrainConfig.train_steps=30"]
    )
    assert set(codes.values()) == {0}, describe_failure(second)
    assert tf.train.load_checkpoint(second.logdir).get_tensor("global_step") >= 30
    # It went on from the checkpoint, not from 0: it ran only the remaining steps.
    assert read_results(second.logdir)["worker_0"]["local_steps"] <= 30 - step1 + 1
    # Once more on the finished run: nothing to train, not one step past the end.
    step2 = tf.train.load_checkpoint(second.logdir).get_tensor("global_step")
    third, codes = run_cluster(
        tmp_path, MLP, num_ps=1, num_workers=1, gin_params=["TrainConfig.train_steps=30"]
    )
    assert set(codes.values()) == {0}, describe_failure(third)
    assert read_results(third.logdir)["worker_0"]["local_steps"] == 0
    assert tf.train.load_checkpoint(third.logdir).get_tensor("global_step") == step2
    assert "training is already over" in open(third.chief_task.log_path).read()


def test_separate_chief_and_evaluator(tmp_path):
    cluster, codes = run_cluster(
        tmp_path,
        MLP,
        num_ps=1,
        num_workers=1,
        chief=True,
        evaluator=True,
        gin_params=["TrainConfig.train_steps=30"],
    )
    assert set(codes.values()) == {0}, describe_failure(cluster) + str(codes)
    assert set(read_results(cluster.logdir)) == {"chief_0", "worker_0"}
    assert scalars(os.path.join(cluster.logdir, "eval"), "eval/loss")
