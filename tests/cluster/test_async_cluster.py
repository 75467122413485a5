"""Async PS on real clusters: overlap's traces, a separate chief and an evaluator, a finished run restarted.

The main job (2 PS, 2 workers: what TensorBoard, the traces and the results
say) is README's main command, tests/cluster/test_main_job.py.
"""

import glob
import json
import os

import pytest
import tensorflow as tf

from disttrain.launch import read_results
from tests.cluster.helpers import TINY, describe_failure, run_cluster, scalars

pytestmark = pytest.mark.cluster

MLP = ["gin/mlp_async.gin", TINY]


def test_overlap_trace_shows_the_transfer_loop_beside_the_step(tmp_path):
    """With overlap a step never touches the PS: its trace must carry the loop's rounds too.

    One worker, so that it runs every step and the traced ones (a second replica, e.g. a separate
    chief, may take all the steps the trace waits for).
    """
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


def test_a_finished_run_restarted_trains_nothing_and_every_task_exits_0(tmp_path):
    """The whole cluster started again on a run already at its last step: no step past the end.

    (A restart that resumes from the latest checkpoint, with nothing lost, is tests/cluster/
    test_faults.py's killed PS and chief and test_resize.py's legs, which compare what was restored
    with what was saved.)
    """
    first, codes = run_cluster(
        tmp_path, MLP, num_ps=1, num_workers=1, gin_params=["TrainConfig.train_steps=20"]
    )
    assert set(codes.values()) == {0}, describe_failure(first)
    step = tf.train.load_checkpoint(first.logdir).get_tensor("global_step")
    assert step >= 20
    again, codes = run_cluster(
        tmp_path, MLP, num_ps=1, num_workers=1, gin_params=["TrainConfig.train_steps=20"]
    )
    assert set(codes.values()) == {0}, describe_failure(again)
    assert read_results(again.logdir)["worker_0"]["local_steps"] == 0
    assert tf.train.load_checkpoint(again.logdir).get_tensor("global_step") == step
    assert "training is already over" in open(again.chief_task.log_path).read()
