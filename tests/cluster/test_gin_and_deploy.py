"""Every shipped config runs, and the TFJob manifest's commands parse (with the checkout's bin/train.py)."""

import glob
import json
import os

import pytest
import yaml

from tests import REPO, extended_beyond
from tests.cluster.helpers import TINY, moved_weights, saved_steps, train_py
from tests.cluster.test_zoo_matrix import EXPERIMENTS as ZOO_FILES

pytestmark = pytest.mark.cluster

EXPERIMENTS = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "gin", "*.gin")))


def test_gin_folder_is_not_a_python_package():
    # gin/__init__.py would shadow the gin-config library for anything run from the repo root.
    assert not glob.glob(os.path.join(REPO, "gin", "**", "__init__.py"), recursive=True)
    assert len(EXPERIMENTS) >= 2


# The files the zoo matrix trains on a cluster (tests/cluster/test_zoo_matrix.py): their one-process runs
# here are the extended tier's (CI's time); CI runs the others.
@pytest.mark.parametrize("gin_file", extended_beyond(EXPERIMENTS, set(EXPERIMENTS) - set(ZOO_FILES.values())))
def test_every_shipped_config_trains_with_the_tiny_overlay(gin_file, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    r = train_py(
        [f"--gin_file={gin_file}", f"--gin_file={TINY}", f"--logdir={tmp_path}"], env=env, timeout=300
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "finished:" in r.stdout, r.stdout[-3000:]
    # It trained: the tiny overlay's 30 steps moved the weights from the start's checkpoint.
    saved = saved_steps(str(tmp_path))
    assert saved[0] == 0 and saved[-1] == 30, saved
    assert moved_weights(str(tmp_path), 0, 30), f"{gin_file}: no variable changed in 30 steps"


def operator_tf_config(replica_specs, task_type, index, job="disttrain-mlp"):
    """TF_CONFIG as Kubeflow's training operator writes it (lower-case types, service DNS names)."""
    cluster = {
        kind.lower(): [f"{job}-{kind.lower()}-{i}.default.svc:2222" for i in range(spec["replicas"])]
        for kind, spec in replica_specs.items()
    }
    return json.dumps(
        {"cluster": cluster, "task": {"type": task_type, "index": index}, "environment": "cloud"}
    )


def test_tfjob_manifest_commands_parse_with_dry_run():
    with open(os.path.join(REPO, "deploy", "tfjob.yaml")) as f:
        manifest = yaml.safe_load(f)
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert set(specs) == {"Chief", "PS", "Worker"}
    for kind, spec in specs.items():
        (container,) = spec["template"]["spec"]["containers"]
        command = container["command"]
        assert command[0] == "disttrain-train"  # the console script of the installed package
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        env["TF_CONFIG"] = operator_tf_config(specs, kind.lower(), spec["replicas"] - 1)
        r = train_py(command[1:] + ["--dry_run"], env=env)
        assert r.returncode == 0, (kind, r.stderr[-3000:])
        assert f"role: {kind.lower()}" in r.stdout, r.stdout
        assert "busiest PS / mean" in r.stdout and "operative gin config" in r.stdout
