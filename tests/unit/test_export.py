"""disttrain.export in one process: exactness, what the SavedModel holds, bad input, the evaluator's exports.

Each export is loaded the way a user loads it: `tf.saved_model.load` in a
new Python process that runs TF 2 eagerly and never imports disttrain (its
import turns eager mode off). One such process loads every SavedModel of
this module's fixture; its outputs are compared with one process's outputs
from the same checkpoint (the model built in a v1 graph, all its variables
restored by a plain Saver), to float32 rounding. The same process also
loads each with TF 1's loader into a Session, as TF Serving does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import disttrain
from disttrain.base.cluster import EVALUATOR, Cluster
from disttrain.base.errors import ConfigError
from disttrain.edges import cli, zoo_run
from disttrain.runtime import exporting
from model_zoo.cifar10 import Cifar10
from model_zoo.mlp import MLP
from tests import REPO
from tests.cluster.helpers import scalars

v1 = tf.compat.v1

RTOL, ATOL = 1e-5, 1e-6  # float32 rounding: the same ops, possibly blocked differently
EXPORT_PY = os.path.join(REPO, "bin", "export.py")

# Run in a new process: TF 2 as a user has it (eager), disttrain never imported.
LOAD = r"""
import json, sys
import numpy as np
import tensorflow as tf

assert tf.executing_eagerly()
v1 = tf.compat.v1


def in_a_v1_session(directory, feeds):
    # TF 1's loader: the meta graph in a Session, as TF Serving loads a SavedModel.
    with tf.Graph().as_default() as graph, v1.Session() as session:
        signature = v1.saved_model.load(session, ["serve"], directory).signature_def["serving_default"]
        feed = {}
        for key, info in signature.inputs.items():
            if info.name:
                feed[info.name] = feeds[key]
            else:
                coo = info.coo_sparse
                names = (coo.indices_tensor_name, coo.values_tensor_name, coo.dense_shape_tensor_name)
                feed.update(zip(names, (feeds[f"{key}_{p}"] for p in ("indices", "values", "dense_shape"))))
        return session.run({k: info.name for k, info in signature.outputs.items()}, feed)


report = {}
for name, (directory, work) in json.loads(sys.argv[1]).items():
    loaded = tf.saved_model.load(directory)
    serve = loaded.signatures["serving_default"]
    feeds = dict(np.load(f"{work}.in.npz"))
    out = serve(**{k: tf.constant(v) for k, v in feeds.items()})
    np.savez(f"{work}.out.npz", **{k: v.numpy() for k, v in out.items()})
    np.savez(f"{work}.v1.npz", **in_a_v1_session(directory, feeds))
    report[name] = {"variables": sorted(v.name[:-2] for v in loaded.variables)}
report["disttrain imported"] = "disttrain" in sys.modules
print("REPORT " + json.dumps(report))
"""


def load_in_tf2(exports: dict[str, tuple[str, dict[str, np.ndarray]]], work: str) -> dict:
    """Serve each export's inputs in one plain TF 2 process: name -> outputs, variables, op types.

    `exports`: name -> (version directory, feeds); inputs and outputs pass through files in `work`.
    """
    paths = {name: (directory, os.path.join(work, name)) for name, (directory, _) in exports.items()}
    for name, (_, feeds) in exports.items():
        np.savez(f"{paths[name][1]}.in.npz", **feeds)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TF_CONFIG")}
    r = subprocess.run(
        [sys.executable, "-c", LOAD, json.dumps(paths)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd="/",
    )
    lines = [line for line in r.stdout.splitlines() if line.startswith("REPORT ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(lines[0][len("REPORT ") :])
    assert report.pop("disttrain imported") is False
    for name, (_, stem) in paths.items():
        report[name]["outputs"] = dict(np.load(f"{stem}.out.npz"))
        report[name]["v1_session_outputs"] = dict(np.load(f"{stem}.v1.npz"))
    return report


def saved_op_types(version_dir: str) -> set[str]:
    """The op types of the graph a SavedModel holds (all of it, not only what a signature runs)."""
    with open(os.path.join(version_dir, "saved_model.pb"), "rb") as f:
        saved = saved_model_pb2.SavedModel.FromString(f.read())
    (meta,) = saved.meta_graphs
    return {node.op for node in meta.graph_def.node}


def training_ops(op_types: set[str]) -> list[str]:
    """The op types among `op_types` that only training (updates, input pipelines) runs."""
    return sorted(
        t for t in op_types if "Apply" in t or "Iterator" in t or "Dataset" in t or "AssignAdd" in t
    )


def one_process(build, feeds: dict[str, np.ndarray], checkpoint: str) -> dict[str, np.ndarray]:
    """`build(placeholders)`'s outputs in a v1 graph of its own, every variable restored from `checkpoint`."""
    with tf.Graph().as_default():
        placeholders = {
            k: v1.placeholder(tf.as_dtype(v.dtype), (None, *v.shape[1:])) for k, v in feeds.items()
        }
        outputs = build(placeholders)
        outputs = outputs if isinstance(outputs, dict) else {"outputs": outputs}
        with v1.Session() as session:
            v1.train.Saver().restore(session, checkpoint)
            return session.run(outputs, {placeholders[k]: v for k, v in feeds.items()})


def train_zoo(logdir: str, gin_file: str, steps: int = 12) -> None:
    """A tiny model_zoo run in this process (one local task), checkpoints in `logdir`."""
    gin.clear_config()
    config = cli.train_config(
        [os.path.join(REPO, "gin", gin_file), os.path.join(REPO, "gin", "testing", "tiny.gin")],
        [f"TrainConfig.train_steps={steps}"],
    )
    with tf.Graph().as_default():
        assert zoo_run.run(Cluster.local(), config, logdir) == 0


def keras_model() -> keras.Model:
    """Dense, BatchNormalization, Dense; named, so that every build has the same variable names."""
    return keras.Sequential(
        [
            keras.layers.Dense(16, activation="relu", name="hidden"),
            keras.layers.BatchNormalization(name="norm"),
            keras.layers.Dense(3, name="out"),
        ],
        name="net",
    )


def train_keras(logdir: str) -> keras.Model:
    """The Keras model trained by disttrain.fit in this process: batch norm's moving statistics move.

    Returns the model object, whose variables are those of training's graph.
    """
    with tf.Graph().as_default():
        model = keras_model()

        def loss_fn():
            x = tf.random.normal([32, 8], mean=2.0, stddev=3.0)  # far from the moving statistics' start
            y = tf.random.uniform([32], maxval=3, dtype=tf.int32)
            logits = model(x, training=True)
            return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))

        result = disttrain.fit(
            loss_fn,
            lambda: v1.train.AdamOptimizer(1e-2),
            cluster=Cluster.local(),
            steps=30,
            logdir=logdir,
            batch_size=32,
            log_every_steps=10,
        )
    assert result.global_step == 30
    return model


def features(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


class Case(NamedTuple):
    """One trained model: how one process builds it, what it is fed, its checkpoint, its export."""

    build: Callable
    feeds: dict[str, np.ndarray]
    checkpoint: str
    written: str


def zoo_case(root, name: str, model, gin_file: str) -> Case:
    logdir = str(root / name)
    train_zoo(logdir, gin_file)
    written = disttrain.export(
        logdir, model.serve, str(root / f"{name}_served"), inputs=model.serving_inputs()
    )
    feeds = {"features": features((5, *model.input_shape))}
    return Case(model.serve, feeds, v1.train.latest_checkpoint(logdir), written)


def keras_case(root) -> Case:
    logdir = str(root / "keras")
    trained = train_keras(logdir)
    # The object training called: the export copies it into its own graph.
    written = disttrain.export(logdir, trained, str(root / "keras_served"), inputs=tf.TensorSpec([None, 8]))
    feeds = {"inputs": features((6, 8), seed=1) * 3.0 + 2.0}
    build = lambda placeholders: keras_model()(placeholders["inputs"], training=False)
    return Case(build, feeds, v1.train.latest_checkpoint(logdir), written)


def table():
    return v1.get_variable("bag/table", [50, 4])


def mean_of_rows_padded(inputs):
    """Variable-length ids padded with -1: the mean of the rows of each example's ids."""
    ids = inputs["ids"]
    mask = tf.cast(ids >= 0, tf.float32)[..., None]
    rows = tf.nn.embedding_lookup(table(), tf.maximum(ids, 0)) * mask
    return tf.reduce_sum(rows, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1.0)


def mean_of_rows_sparse(inputs):
    """Variable-length ids as a SparseTensor: the mean of the rows of each example's ids."""
    return tf.nn.embedding_lookup_sparse(table(), inputs["ids"], None, combiner="mean")


def write_checkpoint(logdir: str, build, step: int, values: dict[str, np.ndarray] | None = None) -> str:
    """A checkpoint of what `build()` creates (initialised, then `values` by name) at global step `step`."""
    with tf.Graph().as_default():
        build()
        global_step = v1.train.get_or_create_global_step()
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            session.run(global_step.assign(step))
            for v in v1.global_variables():
                if values and v.op.name in values:
                    v.load(values[v.op.name], session)
            return v1.train.Saver().save(session, os.path.join(logdir, "model.ckpt"), global_step=step)


def variable_length_cases(root) -> dict[str, Case]:
    """The same bag-of-rows model served from padded dense ids and from sparse ids."""
    logdir = str(root / "bag")
    checkpoint = write_checkpoint(logdir, table, 7)
    padded = {"ids": np.array([[1, 2, -1], [3, -1, -1], [4, 5, 6]], np.int64)}
    sparse = tf.compat.v1.SparseTensorValue([[0, 0], [0, 1], [1, 0], [2, 2]], [1, 2, 3, 6], [3, 4])
    feeds = {
        "ids_indices": np.array(sparse.indices, np.int64),
        "ids_values": np.array(sparse.values, np.int64),
    }
    feeds["ids_dense_shape"] = np.array(sparse.dense_shape, np.int64)
    padded_spec = {"ids": tf.TensorSpec([None, None], tf.int64)}
    sparse_spec = {"ids": tf.SparseTensorSpec([None, None], tf.int64)}
    export = lambda serve_fn, name, spec: disttrain.export(logdir, serve_fn, str(root / name), inputs=spec)
    in_one_process = lambda p: mean_of_rows_sparse(
        {"ids": tf.SparseTensor(p["ids_indices"], p["ids_values"], p["ids_dense_shape"])}
    )
    return {
        "padded": Case(
            mean_of_rows_padded, padded, checkpoint, export(mean_of_rows_padded, "padded", padded_spec)
        ),
        "sparse": Case(in_one_process, feeds, checkpoint, export(mean_of_rows_sparse, "sparse", sparse_spec)),
    }


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[dict[str, Case], dict]:
    """Models trained (or written), exported, and served by one plain TF 2 process.

    The tiny MLP and CIFAR-10 CNN of the zoo, a Keras model with batch
    normalization, a table read by variable-length ids (padded, sparse),
    and the best checkpoint an evaluator exported.
    """
    root = tmp_path_factory.mktemp("export")
    cases = {
        "mlp": zoo_case(root, "mlp", MLP(32, (64, 64), 10), "mlp_async.gin"),
        "cifar10": zoo_case(root, "cifar10", Cifar10(width=8), "cifar10_async.gin"),
        "keras": keras_case(root),
        **variable_length_cases(root),
    }
    weights = [(1, 2.0), (2, 3.0), (3, 1.0)]
    best = run_evaluator(str(root / "evaluated"), str(root / "best"), weights, keras_layer=True)
    build = lambda placeholders: keras_scale()(placeholders["inputs"])
    cases["evaluator"] = Case(build, {"inputs": features((4, 1))}, best.checkpoint, best.written)
    return cases, load_in_tf2({n: (c.written, c.feeds) for n, c in cases.items()}, str(root))


@pytest.mark.parametrize("name", ["mlp", "cifar10", "keras", "padded", "sparse", "evaluator"])
def test_served_outputs_equal_one_process_from_the_same_checkpoint(exported, name):
    cases, report = exported
    case = cases[name]
    want = one_process(case.build, case.feeds, case.checkpoint)
    got = report[name]["outputs"]
    assert set(got) == set(want)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=RTOL, atol=ATOL, err_msg=key)
        np.testing.assert_array_equal(report[name]["v1_session_outputs"][key], got[key], err_msg=key)


def test_each_export_is_a_version_named_by_the_global_step_in_tf_servings_layout(exported):
    for case in exported[0].values():
        assert os.path.basename(case.written) == case.checkpoint.rsplit("-", 1)[1]
        assert not os.path.exists(os.path.join(case.written, "checkpoint"))  # nothing of training
    mlp = exported[0]["mlp"]
    assert os.listdir(os.path.dirname(mlp.written)) == [os.path.basename(mlp.written)]  # no temporary left
    assert sorted(os.listdir(mlp.written)) == ["saved_model.pb", "variables"]


@pytest.mark.parametrize("name", ["mlp", "cifar10", "keras"])
def test_the_saved_model_holds_the_model_and_nothing_of_training(exported, name):
    """Its variables are the model's own (no slots, no global step, no Adam powers); no training op."""
    cases, report = exported
    case = cases[name]
    in_checkpoint = tf.train.load_checkpoint(case.checkpoint).get_variable_to_shape_map()
    bookkeeping = ("global_step", "beta1_power", "beta2_power")
    model_variables = {n for n in in_checkpoint if "Adam" not in n and n not in bookkeeping}
    assert set(report[name]["variables"]) == model_variables
    saved = tf.train.load_checkpoint(os.path.join(case.written, "variables", "variables"))
    assert set(saved.get_variable_to_shape_map()) == model_variables
    op_types = saved_op_types(case.written)
    assert "MatMul" in op_types and not training_ops(op_types), op_types


def test_keras_batch_norm_serves_with_its_moving_statistics(exported):
    """Training moved the moving statistics; serving normalises with them, never with the batch's."""
    cases, report = exported
    feeds = cases["keras"].feeds
    reader = tf.train.load_checkpoint(cases["keras"].checkpoint)
    layers = ("hidden/kernel", "hidden/bias", "out/kernel", "out/bias")
    w = {n: reader.get_tensor(f"net/{n}") for n in layers}
    norm = {
        n: reader.get_tensor(f"net/norm/{n}") for n in ("gamma", "beta", "moving_mean", "moving_variance")
    }
    assert np.abs(norm["moving_mean"]).max() > 0.1 and np.abs(norm["moving_variance"] - 1).max() > 0.1

    def logits(mean, variance):
        h = np.maximum(feeds["inputs"] @ w["hidden/kernel"] + w["hidden/bias"], 0)
        h = norm["gamma"] * (h - mean) / np.sqrt(variance + 1e-3) + norm["beta"]
        return h @ w["out/kernel"] + w["out/bias"]

    h = np.maximum(feeds["inputs"] @ w["hidden/kernel"] + w["hidden/bias"], 0)
    served = report["keras"]["outputs"]["outputs"]
    np.testing.assert_allclose(
        served, logits(norm["moving_mean"], norm["moving_variance"]), rtol=1e-4, atol=1e-5
    )
    assert not np.allclose(served, logits(h.mean(0), h.var(0)), rtol=1e-2, atol=1e-2)


# ---- the evaluator's exports -------------------------------------------------------

EVALUATOR_TASK = Cluster(jobs={"worker": ["localhost:1"]}, task_type=EVALUATOR, task_index=0)
PROBE = np.array([[1.0], [2.0]], np.float32)  # the evaluator's held-out input: its loss is 2.5 w^2


def scale_model(inputs) -> tf.Tensor:
    """The evaluator tests' model: one weight, a get_variable."""
    x = inputs["inputs"] if isinstance(inputs, dict) else inputs
    return x * v1.get_variable("scale/w", [1], initializer=v1.ones_initializer())


def keras_scale() -> keras.layers.Layer:
    """The same model in Keras: one layer, built once, that every function of the evaluator calls."""
    return keras.layers.Dense(1, use_bias=False, kernel_initializer="ones", name="scale")


class Exported(NamedTuple):
    checkpoint: str  # the newest checkpoint the evaluator exported
    written: str  # its version directory


def run_evaluator(
    logdir: str, export_dir: str, weights: list[tuple[int, float]], keep: int = 5, keras_layer: bool = False
) -> Exported:
    """fit's evaluator task with export_best, beside checkpoints (step, w) written one measured at a time.

    The held-out loss on PROBE (2.5 w^2) is read through an input pipeline,
    which the export must leave out.
    """
    eval_dir = os.path.join(logdir, "eval")
    paths = {}
    name, shape = ("scale/kernel", (1, 1)) if keras_layer else ("scale/w", (1,))

    def write_in_turn():
        build = (lambda: keras_scale()(PROBE)) if keras_layer else (lambda: scale_model(PROBE))
        for step, w in weights:
            paths[step] = write_checkpoint(logdir, build, step, {name: np.full(shape, w, np.float32)})
            deadline = time.monotonic() + 60
            while step not in dict(scalars(eval_dir, "eval/loss")) and time.monotonic() < deadline:
                time.sleep(0.1)

    writer = threading.Thread(target=write_in_turn)
    writer.start()
    try:
        with tf.Graph().as_default():
            serve_fn = keras_scale() if keras_layer else scale_model

            def held_out_loss():
                probe = v1.data.make_one_shot_iterator(
                    tf.data.Dataset.from_tensors(PROBE).repeat()
                ).get_next()
                return tf.reduce_mean(tf.square(serve_fn(probe)))

            best = disttrain.BestExport(serve_fn, export_dir, inputs=tf.TensorSpec([None, 1]), keep=keep)
            disttrain.fit(
                held_out_loss,
                lambda: v1.train.GradientDescentOptimizer(0.1),
                steps=weights[-1][0],
                logdir=logdir,
                cluster=EVALUATOR_TASK,
                eval_fn=held_out_loss,
                eval_steps=2,
                export_best=best,
                peer_wait_secs=60,
            )
    finally:
        writer.join(timeout=120)
    newest = exporting.versions(export_dir)[-1]
    return Exported(paths[newest], os.path.join(export_dir, str(newest)))


def test_the_evaluator_exports_each_checkpoint_whose_loss_is_the_best_so_far(exported):
    """Losses 10, 22.5, 2.5 at steps 1, 2, 3: steps 1 and 3 are exported, each with its own weights.

    The model is a Keras layer that eval_fn and serve_fn share, as a script's module-level model is.
    """
    cases, report = exported
    case = cases["evaluator"]
    export_dir = os.path.dirname(case.written)
    assert exporting.versions(export_dir) == [1, 3]
    for version, w in ((1, 2.0), (3, 1.0)):
        saved = tf.train.load_checkpoint(os.path.join(export_dir, str(version), "variables", "variables"))
        assert saved.get_variable_to_shape_map() == {"scale/kernel": [1, 1]}
        assert saved.get_tensor("scale/kernel") == [[w]]
    np.testing.assert_allclose(report["evaluator"]["outputs"]["outputs"], case.feeds["inputs"], rtol=RTOL)
    # Built in the evaluator's graph, beside its input pipeline and metrics: none of that was exported.
    op_types = saved_op_types(case.written)
    assert "MatMul" in op_types and not training_ops(op_types), op_types


def test_a_restarted_evaluator_exports_only_what_beats_every_earlier_measurement(tmp_path):
    logdir, export_dir = str(tmp_path / "run"), str(tmp_path / "best")
    run_evaluator(logdir, export_dir, [(1, 1.0)], keep=1)  # loss 2.5: the first, exported
    assert exporting.versions(export_dir) == [1]
    run_evaluator(logdir, export_dir, [(2, 1.5), (3, 0.5)], keep=1)  # 5.6 (worse than 2.5), then 0.6
    assert exporting.versions(export_dir) == [3]  # 2 never exported; 1 removed (keep=1)


def held_out_loss() -> tf.Tensor:
    return tf.reduce_mean(tf.square(scale_model(PROBE)))


def test_export_best_naming_no_metric_of_eval_fn_ends_the_evaluator_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info, tf.Graph().as_default():
        disttrain.fit(
            held_out_loss,
            lambda: v1.train.GradientDescentOptimizer(0.1),
            steps=1,
            logdir=str(tmp_path),
            cluster=EVALUATOR_TASK,
            eval_fn=held_out_loss,
            export_best=disttrain.BestExport(
                scale_model, str(tmp_path / "best"), inputs=tf.TensorSpec([None, 1]), metric="accuracy"
            ),
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    said = "BestExport.metric='accuracy' is not one of eval_fn's metrics (loss): name one of them"
    assert err == [f"disttrain: error: {said}"]
    assert not os.path.exists(tmp_path / "best")


# ---- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, refused",
    [
        (MLP(32, (64, 64, 64), 10), r"has no variable 'fc3/biases', which the serving model reads"),
        (
            MLP(32, (64, 64), 12),
            r"holds \[10\], not \[12\], for 'logits/biases', which the serving model reads",
        ),
        (MLP(32, (64,), 10), r"the serving model does not read 'fc2/biases', which training trained"),
    ],
    ids=["missing", "other_shape", "extra"],
)
def test_a_checkpoint_that_does_not_match_the_serving_model_is_refused_in_one_line(
    exported, tmp_path, model, refused
):
    checkpoint = exported[0]["mlp"].checkpoint
    export_dir = tmp_path / "served"
    with pytest.raises(exporting.MismatchError, match=refused) as error:
        disttrain.export(
            os.path.dirname(checkpoint), model.serve, str(export_dir), inputs=model.serving_inputs()
        )
    assert "\n" not in str(error.value) and isinstance(error.value, ConfigError)
    assert not export_dir.exists()


def functional_model_of_another_graph() -> keras.Model:
    """A Keras model from keras.Input: its variables are made at once, in the graph it is built in
    (as a model built for training before `fit` holds them in training's graph)."""
    with tf.Graph().as_default():
        inputs = keras.Input((32,))
        hidden = keras.layers.BatchNormalization()(keras.layers.Dense(8)(inputs))
        return keras.Model(inputs, keras.layers.Dense(10)(hidden))


class Subclassed(keras.Model):
    """A subclassed Keras model: Keras cannot rebuild it from its config, so it cannot be copied."""

    def __init__(self):
        super().__init__(name="subclassed")
        self.out = keras.layers.Dense(10)

    def call(self, features, training=False):
        return self.out(features["features"])


@pytest.mark.parametrize(
    "change, refused",
    [
        (
            dict(checkpoint="model.ckpt-999"),
            r"no checkpoint 'model.ckpt-999' .* checkpoints there: model.ckpt-",
        ),
        (dict(logdir="/nonexistent"), r"no checkpoint in '/nonexistent'"),
        (dict(inputs=tf.RaggedTensorSpec([None, None])), r"serving input 'inputs' is RaggedTensorSpec"),
        (dict(inputs={}), r"inputs=\{\}: give the serving inputs"),
        (dict(serve_fn=lambda f: {"logits": 1.0}), r"serve_fn's output 'logits' is float, not a tensor"),
        (
            dict(serve_fn=lambda f: f["features"] * v1.placeholder(tf.float32, [], name="temperature")),
            r"need the placeholder 'temperature', which is not one of the inputs",
        ),
        (
            dict(serve_fn=lambda f: functional_model_of_another_graph()(f["features"], training=False)),
            r"serve_fn used variables made in another graph .* give the Keras model itself as serve_fn",
        ),
        (
            dict(serve_fn=Subclassed()),
            r"the Keras model 'subclassed' cannot be copied into the export's graph .* make_model\(\)",
        ),
    ],
    ids=[
        "no_such_checkpoint",
        "no_checkpoint",
        "ragged",
        "no_inputs",
        "not_a_tensor",
        "unfed_placeholder",
        "keras_model_of_training",
        "keras_subclassed",
    ],
)
def test_bad_arguments_are_refused_in_one_line_before_anything_is_written(
    exported, tmp_path, change, refused
):
    checkpoint = exported[0]["mlp"].checkpoint
    model = MLP(32, (64, 64), 10)
    arguments = dict(logdir=os.path.dirname(checkpoint), serve_fn=model.serve, inputs=model.serving_inputs())
    arguments.update(change)
    export_dir = tmp_path / "served"
    with pytest.raises(ConfigError, match=refused) as error:
        disttrain.export(export_dir=str(export_dir), **arguments)
    assert "\n" not in str(error.value)
    assert not export_dir.exists()


def test_an_existing_version_is_never_overwritten(exported):
    case = exported[0]["mlp"]
    before = os.path.getmtime(os.path.join(case.written, "saved_model.pb"))
    with pytest.raises(
        ConfigError, match=r"/12 exists already: remove it, or export another checkpoint or version"
    ):
        disttrain.export(
            os.path.dirname(case.checkpoint),
            MLP(32, (64, 64), 10).serve,
            os.path.dirname(case.written),
            inputs=MLP(32).serving_inputs(),
        )
    assert os.path.getmtime(os.path.join(case.written, "saved_model.pb")) == before


def test_the_console_script_refuses_a_mismatch_with_exit_2_and_one_line(exported, tmp_path):
    """The run's gin files, the model made wider by a binding: refused, nothing written."""
    logdir = os.path.dirname(exported[0]["mlp"].checkpoint)
    export_dir = tmp_path / "served"
    gin_files = ["--gin_file=gin/mlp_async.gin", "--gin_file=gin/testing/tiny.gin"]
    flags = [f"--logdir={logdir}", f"--export_dir={export_dir}", *gin_files, "--gin_param=mlp.num_classes=12"]
    r = subprocess.run(
        [sys.executable, EXPORT_PY, *flags], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert r.returncode == 2, r.stdout + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("disttrain: error: the checkpoint ") and "for 'logits/biases'" in line, line
    hint = "the model came from gin/mlp_async.gin, gin/testing/tiny.gin: give the run's gin files"
    assert line.endswith(hint), line
    assert not export_dir.exists()


# What a full disk does to an export: a 1.3 MB model into a 256 KiB file system (run as root,
# in a mount namespace of its own, so that the mount never outlives the command).
FULL_DISK = """
import sys
import tensorflow as tf
import disttrain
from disttrain.base.errors import DisttrainError
from model_zoo.mlp import MLP

model = MLP(32, (512, 512), 10)
try:
    disttrain.export(sys.argv[1], model.serve, sys.argv[2] + "/served", inputs=model.serving_inputs())
except DisttrainError as e:
    print("REFUSED", e)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare (mount namespaces)"
)
def test_a_write_that_fails_midway_leaves_nothing_in_export_dir(tmp_path):
    logdir, small = tmp_path / "run", tmp_path / "small"
    small.mkdir()
    write_checkpoint(str(logdir), lambda: MLP(32, (512, 512), 10).build_variables(), 5)
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK)
    mount = f"mount -t tmpfs -o size=256k tmpfs {small}"
    command = f"{mount} && {sys.executable} {script} {logdir} {small} && ls -A {small}"
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    refused, *listing = r.stdout.strip().splitlines()
    assert (
        refused.startswith(f"REFUSED could not write {small}/served/5 (")
        and "nothing of it was left" in refused
    )
    assert listing == []  # not even export_dir, which the export had created
