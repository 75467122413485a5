"""Exports of checkpoints written by real 2-PS clusters equal what one process (and training) computes.

Two runs, shared by every test of this module:
- the zoo's tiny DLRM under AsyncParameterServer with overlap, 2 PS and 2
  workers, its tables large enough to be split by rows over both PS, then
  exported by `bin/export.py` with nothing but --logdir and --export_dir
  (the model from the run's own operative config);
- README's first example (the MLP, narrowed) on 2 PS and 2 workers under
  SyncParameterServer with `piece_bytes`, every variable cut into pieces,
  exporting itself on the chief as README's last lines do. A probe hook
  computes the training graph's own predictions (the chief's graph, reading
  the pieces on the PS) after the last step; sync, so that no update lands
  between them and the final checkpoint.
One plain TF 2 process (eager, no disttrain) then serves both SavedModels.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import variable_pb2

from disttrain.edges.local import free_port
from disttrain.runtime import exporting
from model_zoo.dlrm import DLRM
from tests import REPO
from tests.cluster.helpers import TINY, describe_failure, run_timed
from tests.cluster.test_own_model import logs, readme_examples, run_all, start_all
from tests.unit.test_export import ATOL, EXPORT_PY, RTOL, load_in_tf2, one_process

pytestmark = pytest.mark.cluster

v1 = tf.compat.v1

VOCAB = (300, 200, 150)  # at least 64 rows a part: each table is split over both PS
DLRM_PARAMS = [f"dlrm.vocab_sizes = {VOCAB}", "TrainConfig.train_steps = 16"]
PIECE_BYTES = 8192  # the narrowed MLP's fc1 and fc3 (64 KiB) in 8 pieces, fc2 (16 KiB) in 2
PROBE = np.linspace(-2.0, 2.0, 3 * 256, dtype=np.float32).reshape(3, 256)

# Appended to README's example (after the fit call is given hooks=[Probe()]): the training graph's
# predictions on PROBE, from the chief, after its last step.
PROBE_HOOK = """
import json
import os
import sys

import numpy as np


class Probe(v1.train.SessionRunHook):
    def begin(self):  # in the training graph: the variables in pieces on the PS tasks
        with v1.variable_scope(v1.get_variable_scope(), reuse=True):
            probe = np.linspace(-2.0, 2.0, 3 * 256, dtype=np.float32).reshape(3, 256)
            self.outputs = model(tf.constant(probe))

    def end(self, session):
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        if task == {"type": "worker", "index": 0}:
            np.save(os.path.join(os.path.dirname(__file__), "probe.npy"), session.run(self.outputs))
"""


def readme_script(tmp_path) -> str:
    """README's first example, narrowed, on SyncParameterServer with pieces, with the probe hook."""
    code = readme_examples()["get_variable"]
    edits = {
        "strategy=disttrain.AsyncParameterServer": "strategy=functools.partial("
        f"disttrain.SyncParameterServer, piece_bytes={PIECE_BYTES})",
        "steps=1000": "steps=24, hooks=[Probe()]",
        '"/tmp/mlp"': f'"{tmp_path / "logdir"}"',
        '"/tmp/mlp_served"': f'"{tmp_path / "served"}"',
        "4096": "64",
    }
    for old, new in edits.items():
        assert old in code, old
        code = code.replace(old, new)
    head, fit_call = code.split("result = disttrain.fit(")
    code = f"import functools\n{head}{PROBE_HOOK}\n\nresult = disttrain.fit({fit_call}"
    path = tmp_path / "readme_mlp.py"
    path.write_text(code)
    return str(path)


def parts(checkpoint: str) -> dict[str, int]:
    """Each trained variable of the checkpoint's training graph -> how many parts it was cut into."""
    meta = v1.MetaGraphDef()
    with open(checkpoint + ".meta", "rb") as f:
        meta.ParseFromString(f.read())
    counts: dict[str, int] = {}
    for serialized in meta.collection_def["trainable_variables"].bytes_list.value:
        variable = variable_pb2.VariableDef.FromString(serialized)
        name = variable.save_slice_info_def.full_name or variable.variable_name[:-2]
        counts[name] = counts.get(name, 0) + 1
    return counts


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both runs trained and exported, and both exports served by plain TF 2."""
    root = tmp_path_factory.mktemp("cluster_export")
    dlrm_dir = root / "dlrm"
    cluster, _ = run_timed(
        dlrm_dir, ["gin/dlrm_async.gin", TINY], num_ps=2, num_workers=2, gin_params=DLRM_PARAMS, timeout=240
    )
    r = subprocess.run(
        [sys.executable, EXPORT_PY, f"--logdir={dlrm_dir}", f"--export_dir={root / 'dlrm_served'}"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + describe_failure(cluster)
    dlrm_written = r.stdout.strip().splitlines()[-1]

    mlp_dir = root / "mlp"
    mlp_dir.mkdir()
    hosts = {job: [f"127.0.0.1:{free_port()}" for _ in range(2)] for job in ("ps", "worker")}
    codes = run_all(start_all(readme_script(mlp_dir), mlp_dir, hosts), mlp_dir)
    assert set(codes.values()) == {0}, (codes, logs(mlp_dir))
    (version,) = exporting.versions(str(mlp_dir / "served"))
    mlp_written = str(mlp_dir / "served" / str(version))

    rng = np.random.default_rng(3)
    dlrm_feeds = {
        "dense": rng.normal(size=(6, 13)).astype(np.float32),
        "ids": np.stack([rng.integers(0, n, 6) for n in VOCAB], axis=1).astype(np.int64),
    }
    exports = {"dlrm": (dlrm_written, dlrm_feeds), "mlp": (mlp_written, {"inputs": PROBE})}
    return {
        "dlrm": (v1.train.latest_checkpoint(str(dlrm_dir)), dlrm_written, dlrm_feeds),
        "mlp": (v1.train.latest_checkpoint(str(mlp_dir / "logdir")), mlp_written, mlp_dir),
        "served": load_in_tf2(exports, str(root)),
    }


def test_dlrm_with_tables_split_over_2_ps_serves_what_one_process_computes(runs):
    checkpoint, written, feeds = runs["dlrm"]
    tables = {name: n for name, n in parts(checkpoint).items() if name.endswith("/table")}
    assert sorted(tables.values()) == [2, 2, 2], tables  # each table was split by rows over both PS
    model = DLRM(vocab_sizes=VOCAB, embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(16,))
    want = one_process(model.serve, feeds, checkpoint)
    got = runs["served"]["dlrm"]["outputs"]
    assert set(got) == {"logits", "probabilities"}
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=RTOL, atol=ATOL, err_msg=key)
    # Each table was read back whole from its row slices: row i is the checkpoint's row i.
    saved = tf.train.load_checkpoint(os.path.join(written, "variables", "variables"))
    reader = tf.train.load_checkpoint(checkpoint)
    for name in tables:
        np.testing.assert_array_equal(saved.get_tensor(name), reader.get_tensor(name))
    assert os.path.basename(written) == checkpoint.rsplit("-", 1)[1]  # the global step


def model(x):
    """README's model, narrowed as the run narrowed it."""
    h = tf.nn.relu(tf.matmul(x, v1.get_variable("fc1", [256, 64])))
    h = tf.nn.relu(tf.matmul(h, v1.get_variable("fc2", [64, 64])))
    return tf.matmul(h, v1.get_variable("fc3", [64, 256]))


def test_readme_export_of_a_2_ps_run_in_pieces_serves_what_the_training_graph_computed(runs):
    checkpoint, written, run_dir = runs["mlp"]
    assert parts(checkpoint) == {"fc1": 8, "fc2": 2, "fc3": 8}  # in pieces over the 2 PS
    served = runs["served"]["mlp"]
    assert served["variables"] == ["fc1", "fc2", "fc3"]  # whole, and nothing of the optimizer
    got = served["outputs"]["outputs"]
    training = np.load(run_dir / "probe.npy")
    np.testing.assert_allclose(got, training, rtol=RTOL, atol=ATOL)
    want = one_process(lambda p: model(p["inputs"]), {"inputs": PROBE}, checkpoint)["outputs"]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert os.path.basename(written) == checkpoint.rsplit("-", 1)[1] == "24"
