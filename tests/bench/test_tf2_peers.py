"""TF 2's strategies as benchmark systems (bench.tf2, bench/peers/): specs, and both peers on loopback."""

from __future__ import annotations

import ast
import glob
import json
import math
import os
import subprocess
import sys
import time

import gin
import pytest
import tensorflow as tf

from disttrain.bench import runner, tf2
from disttrain.edges import configurables
from model_zoo import cifar10, layers
from tests import REPO, extended_beyond
from tests.bench.test_benchmark import TINY, _explain, benchmark

v1 = tf.compat.v1


def with_config(files, fn, bindings=()):
    """fn(TrainConfig of `files`), while its gin bindings are in force (its optimizer is gin-bound)."""
    configurables.register_all()
    gin.add_config_file_search_path(REPO)
    gin.clear_config()
    try:
        gin.parse_config_files_and_bindings(
            [os.path.join(REPO, f) for f in files], list(bindings), skip_unknown=False
        )
        return fn(configurables.train_config().validate())
    finally:
        gin.clear_config()


def spec_of(system: str, *files: str, pack: int = 0) -> dict:
    return with_config(files, lambda config: tf2.spec(tf2.PEERS[system], config, pack))


def bucket_bytes(*files: str) -> int:
    return with_config(files, tf2.bucket_bytes, ["TrainConfig.strategy=@SyncAllReduce"])


@pytest.mark.parametrize("every_n, expected", [(10, 10), (2, 2), (20, 10), (7, 7), (12, 6), (1, 1)])
def test_steps_per_function_divides_the_log_interval(every_n, expected):
    assert tf2.steps_per_function(every_n) == expected


def test_spec_of_the_bench_mlp():
    spec = spec_of("tf2_mwms", "gin/bench/mlp.gin", pack=bucket_bytes("gin/bench/mlp.gin"))
    assert spec["model"] == {
        "name": "mlp",
        "input_shape": [256],
        "num_classes": 256,
        "hidden_sizes": [4096, 4096],
    }
    assert [v["name"] for v in spec["variables"]] == [
        f"{layer}/{kind}" for layer in ("fc1", "fc2", "logits") for kind in ("weights", "biases")
    ]
    assert spec["optimizer"] == {
        "name": "adam",
        "learning_rate": 1e-4,
        "beta1": 0.9,
        "beta2": 0.999,
        "epsilon": 1e-8,
    }
    assert (spec["batch_size"], spec["intra_op_threads"], spec["inter_op_threads"]) == (128, 1, 1)
    assert (spec["log_every_steps"], spec["steps_per_function"]) == (10, 10)
    assert spec["bytes_per_pack"] == 4 * 2**20  # SyncAllReduce's default bucket
    pss = spec_of("tf2_pss_minsize", "gin/bench/mlp.gin")
    assert (pss["variable_partitioner"], pss["min_shard_bytes"]) == ("min_size", 256 * 1024)
    assert spec_of("tf2_pss", "gin/bench/mlp.gin")["variable_partitioner"] is None


@pytest.mark.parametrize(
    "config, batch, inter_op",
    [("gin/bench/cifar10_b32.gin", 32, 2), ("gin/bench/cifar10_b128.gin", 128, 1)],  # the configs' threads
)
def test_spec_of_the_bench_cifar10(config, batch, inter_op):
    spec = spec_of("tf2_pss", config)
    assert spec["model"] == {"name": "cifar10", "input_shape": [24, 24, 3], "num_classes": 10, "width": 64}
    assert spec["optimizer"] == {"name": "sgd", "learning_rate": 0.01}
    assert (spec["batch_size"], spec["intra_op_threads"], spec["inter_op_threads"]) == (batch, 1, inter_op)
    shapes = {v["name"]: v["shape"] for v in spec["variables"]}
    assert shapes == {
        "conv1/weights": [5, 5, 3, 64],
        "conv1/biases": [64],
        "conv2/weights": [5, 5, 64, 64],
        "conv2/biases": [64],
        "local3/weights": [2304, 384],
        "local3/biases": [384],
        "local4/weights": [384, 192],
        "local4/biases": [192],
        "softmax_linear/weights": [192, 10],
        "softmax_linear/biases": [10],
    }
    assert sum(math.prod(s) for s in shapes.values()) == 1_068_298  # 4.27 MB: model_zoo's 1.07M parameters


# Builds the peer's own model from a spec, in eager mode in a process of its own (this one is in
# graph mode), and prints its variables' names, shapes and bytes, as created (before sharding).
PEER_MODEL = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import tf2_common as common
model = common.build_model(json.load(open(sys.argv[2])))
print(json.dumps([[common.variable_name(v), v.shape.as_list(), v.shape.num_elements() * v.dtype.size]
                  for v in model.variables]))
"""


def _peer_model(spec: dict, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    peers = os.path.join(REPO, "disttrain", "bench", "peers")
    argv = [sys.executable, "-c", PEER_MODEL, peers, str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=dict(os.environ))


@pytest.mark.parametrize("config", ["gin/bench/mlp.gin", "gin/bench/cifar10_b32.gin"])
def test_the_peers_model_is_model_zoos(config, tmp_path):
    """Same math: the peer's variables have model_zoo's names, shapes and bytes, in the same order."""
    spec = spec_of("tf2_pss", config)
    done = _peer_model(spec, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    built = json.loads(done.stdout.strip().splitlines()[-1])

    def zoo(config_model):
        with tf.Graph().as_default():
            config_model.build_variables()
            return [
                [v.op.name, v.shape.as_list(), v.shape.num_elements() * v.dtype.size]
                for v in v1.trainable_variables()
            ]

    assert built == with_config([config], lambda c: zoo(c.model))


def test_a_peer_whose_model_differs_stops_with_one_line(tmp_path):
    spec = spec_of("tf2_pss", "gin/bench/cifar10_b32.gin")
    spec["model"]["width"] = 32  # the peer would build another network than the spec's variables
    done = _peer_model(spec, tmp_path)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "the peer's Cifar10 has variable {'name': 'conv1/weights', 'shape': [5, 5, 3, 32]}"
    )
    assert "where model_zoo's has {'name': 'conv1/weights', 'shape': [5, 5, 3, 64]}" in last


def test_bytes_per_pack_follows_the_buckets():
    assert bucket_bytes("gin/bench/mlp_b32.gin") == 32 * 2**20


def test_a_model_the_peers_do_not_implement_is_refused():
    with pytest.raises(tf2.PeerUnsupported, match="MLP and Cifar10 only; the config's model is DLRM"):
        spec_of("tf2_pss", "gin/bench/dlrm.gin")


def test_a_model_with_batch_norm_is_refused(monkeypatch):
    """Moving statistics are non-trainable variables the peers would never update."""

    def build_with_batch_norm(self):
        x = tf.zeros((1, 24, 24, 3))
        layers.batch_norm(layers.conv2d(x, 4, 3, name="conv1"), training=True, name="bn1")

    monkeypatch.setattr(cifar10.Cifar10, "build_variables", build_with_batch_norm)
    with pytest.raises(tf2.PeerUnsupported, match="also has bn1/moving_mean, bn1/moving_variance"):
        spec_of("tf2_pss", "gin/bench/cifar10_b32.gin")


def test_each_system_has_its_kind():
    assert runner.TF2_PSS.uses_ps and not runner.TF2_PSS.synchronous
    assert runner.TF2_MWMS.synchronous and not runner.TF2_MWMS.uses_ps
    assert set(tf2.PEERS) <= set(runner.SYSTEMS)


PEER_FILES = sorted(glob.glob(os.path.join(REPO, "disttrain", "bench", "peers", "*.py")))


@pytest.mark.parametrize("path", PEER_FILES, ids=os.path.basename)
def test_peers_never_import_disttrain(path):
    """Importing disttrain switches a process to graph mode, where TF 2's strategies cannot run."""
    with open(path) as f:
        tree = ast.parse(f.read())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.split(".")[0] in ("disttrain", "model_zoo")]


# ---- both peers at tiny size on loopback, through bin/benchmark.py ------------------------------

TINY_ARGS = [f"--gin_file={TINY}", "--warmup_steps=10", "--measure_steps=20", "--reference=false"]
MODELS = {"mlp": "gin/bench/mlp.gin", "cifar10": "gin/bench/cifar10_b32.gin"}  # tiny: tiny.gin shrinks both


def _check_peer_row(run: dict, system: str, workers: int) -> None:
    assert run["error"] is None, run["error"]
    assert (run["system"], run["workers"], run["network"]) == (system, workers, "localhost")
    assert run["steps_per_sec"] > 0 and run["examples_per_sec"] > 0
    per_worker = run["per_worker_steps_per_sec"]
    assert len(per_worker) == workers and min(per_worker) > 0
    assert run["min_worker_steps_per_sec"] == min(per_worker)
    assert run["first_loss"] > 0 and not run["diverged"]


@pytest.mark.cluster
@pytest.mark.parametrize("model", extended_beyond(MODELS, {"mlp"}))  # CIFAR-10: extended (CI's time)
def test_tf2_pss_two_workers_one_ps(model, tmp_path):
    args = [f"--gin_file={MODELS[model]}", *TINY_ARGS, "--workers=2", "--ps=1", "--systems=tf2_pss"]
    done, report, _ = benchmark(args, tmp_path, timeout=180)
    assert done.returncode == 0, _explain(done)
    (run,) = report["runs"]
    _check_peer_row(run, "tf2_pss", 2)
    assert (run["strategy"], run["ps"], run["layout"], run["synchronous"]) == (
        "async_ps",
        1,
        "dedicated",
        False,
    )
    assert run["counted_steps_per_sec"] == pytest.approx(2 * run["min_worker_steps_per_sec"])
    # The tiny model's bytes (MLP 27,688; CNN 70,056), all on the one PS, as the chief placed them.
    assert run["ps_loads"] == [report["config"]["model_bytes"]]
    assert run["ps_load_max_over_mean"] == pytest.approx(1.0)
    lines = glob.glob(os.path.join(run["logdir"], "logs", "worker_*.lines"))
    assert len(lines) == 2  # the coordinator's lines, one file per worker


@pytest.mark.cluster
@pytest.mark.parametrize("model", extended_beyond(MODELS, {"mlp"}))
def test_tf2_mwms_two_workers(model, tmp_path):
    args = [f"--gin_file={MODELS[model]}", *TINY_ARGS, "--workers=2", "--systems=tf2_mwms"]
    done, report, _ = benchmark(args, tmp_path, timeout=180)
    assert done.returncode == 0, _explain(done)
    (run,) = report["runs"]
    _check_peer_row(run, "tf2_mwms", 2)
    assert (run["strategy"], run["ps"], run["layout"], run["synchronous"]) == ("allreduce", 0, "ring", True)
    assert run["ps_loads"] is None
    # Synchronous: the cluster's rate is N x each worker's.
    assert run["steps_per_sec"] == pytest.approx(sum(run["per_worker_steps_per_sec"]), rel=0.15)


def _placement(tmp_path, system: str, num_ps: int, **overrides) -> dict:
    """The tiny MLP placed by a tf2_pss chief over `num_ps` PS (1 worker), as its placement.json says."""
    spec = dict(spec_of(system, "gin/bench/mlp.gin", TINY), **overrides)
    cluster = tf2.PeerCluster(tf2.PEERS[system], spec, str(tmp_path / system), num_ps, 1)
    try:
        cluster.start()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if os.path.exists(cluster.placement_path) and cluster.ps_loads():
                with open(cluster.placement_path) as f:
                    return json.load(f)
            dead = [t.name for t in cluster.tasks if t.proc.poll() is not None]
            assert not dead, f"{dead} exited; logs in {cluster.logdir}/logs"
            time.sleep(0.2)
        raise AssertionError(f"no placement after 90 s; logs in {cluster.logdir}/logs")
    finally:
        cluster.stop()


@pytest.mark.cluster
def test_pss_placement_round_robin_and_min_size(tmp_path):
    """TF's default deals variables to 2 PS by count; MinSizePartitioner splits those over its minimum."""
    default = _placement(tmp_path, "tf2_pss", 2)
    # fc1/weights, fc1/biases, fc2/weights, ...: weights on ps0, biases on ps1.
    assert [v["device"].split("/task:")[1][0] for v in default["variables"]] == ["0", "1"] * 3
    assert default["ps_bytes"] == [4 * (32 * 64 + 64 * 64 + 64 * 10), 4 * (64 + 64 + 10)]
    split = _placement(tmp_path, "tf2_pss_minsize", 2, min_shard_bytes=1024)  # the tiny MLP's scale
    names = [v["name"] for v in split["variables"]]
    assert "fc2/weights/part_0:0" in names and "fc2/weights/part_1:0" in names
    assert sum(split["ps_bytes"]) == 27_688
    assert max(split["ps_bytes"]) / (27_688 / 2) < 1.2
