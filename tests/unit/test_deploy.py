"""deploy/ runs as it is: the manifests against the operator's schema, TF_CONFIG as the operator writes it.

Offline: no cluster, no Docker. The reference is Kubeflow's training operator, release 1.9
(github.com/kubeflow/training-operator, now kubeflow/trainer, tag v1.9.0):
- the TFJob CRD's schema, trimmed, in tests/unit/data/ (the files' headers say how), with a small
  validator for the part of OpenAPI v3 it uses; unknown fields are refused, as `kubectl apply`
  (whose --validate is strict) refuses them;
- the operator's checks outside the schema: its admission webhook
  (pkg/webhooks/tensorflow/tfjob_webhook.go) and the values its constants allow
  (pkg/apis/kubeflow.org/v1/common_types.go, tensorflow_types.go);
- TF_CONFIG as pkg/controller.v1/tensorflow/tensorflow.go writes it (genTFConfigJSONStr,
  genClusterSpec; the port from util.go's GetPortFromTFJob), parsed as disttrain-train parses it.
"""

from __future__ import annotations

import copy
import json
import os
import re

import pytest
import yaml

from disttrain.base import errors
from disttrain.base.cluster import Cluster, resolve
from disttrain.base.errors import ConfigError
from tests import REPO

DATA = os.path.join(REPO, "tests", "unit", "data")


def load(*path: str):
    with open(os.path.join(REPO, *path)) as f:
        return yaml.safe_load(f)


def read(*path: str) -> str:
    with open(os.path.join(REPO, *path)) as f:
        return f.read()


TFJOB = load("deploy", "tfjob.yaml")
PVC = load("deploy", "pvc.yaml")
CRD = load(DATA, "tfjob_crd_v1.9_trimmed.yaml")
(CRD_VERSION,) = CRD["spec"]["versions"]
TFJOB_SCHEMA = CRD_VERSION["schema"]["openAPIV3Schema"]
PVC_SCHEMA = load(DATA, "pvc_schema_v1.9_trimmed.yaml")


# ---- a validator for the part of OpenAPI v3 the schemas use ----------------------------------

KEYWORDS = {
    "type",
    "properties",
    "required",
    "items",
    "enum",
    "additionalProperties",
    "pattern",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-trimmed",  # the trimmed copy's mark of a cut subtree: nothing below it is checked
}
TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "integer": int,
    "number": (int, float),
}


def schema_errors(schema: dict, value, path: str = "") -> list[str]:
    """What is wrong with `value` under `schema`, one line each; [] when it validates.

    As a Kubernetes structural schema: a field that is not among an object's `properties`
    is unknown, and refused, unless `additionalProperties` or
    `x-kubernetes-preserve-unknown-fields` admit it. A keyword this validator does not
    know is an error in the schema, not silently passed.
    """
    unknown = set(schema) - KEYWORDS
    if unknown:
        raise ValueError(f"{path or '.'}: schema keyword(s) the validator does not know: {sorted(unknown)}")
    where = path or "."
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            return [f"{where}: expected an integer or a string, got {value!r}"]
    elif "type" in schema:
        kind = schema["type"]
        if not isinstance(value, TYPES[kind]) or (isinstance(value, bool) and kind != "boolean"):
            return [f"{where}: expected {kind}, got {type(value).__name__} {value!r}"]
    found = []
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        found.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if schema.get("x-trimmed"):
        return found
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", False)
        preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
        found += [
            f"{where}: missing required field {name!r}"
            for name in schema.get("required", ())
            if name not in value
        ]
        for name, item in value.items():
            if name in properties:
                found += schema_errors(properties[name], item, f"{path}.{name}")
            elif isinstance(extra, dict):
                found += schema_errors(extra, item, f"{path}.{name}")
            elif not (extra or preserve):
                found.append(f"{where}: unknown field {name!r}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += schema_errors(schema["items"], item, f"{path}[{i}]")
    return found


def test_the_validator_knows_each_keyword_it_accepts():
    schema = {
        "type": "object",
        "required": ["kind"],
        "properties": {
            "kind": {"type": "string", "enum": ["A", "B"]},
            "open": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"n": {"type": "integer"}},
            },
            "cut": {"type": "object", "x-trimmed": True},
            "map": {"type": "object", "additionalProperties": {"type": "integer"}},
            "list": {"type": "array", "items": {"type": "boolean"}},
        },
    }
    assert (
        schema_errors(
            schema, {"kind": "A", "open": {"n": 1, "any": [1]}, "cut": {"x": {"y": 1}}, "map": {"a": 1}}
        )
        == []
    )
    assert schema_errors(schema, {"kind": "C"}) == [".kind: 'C' is not one of ['A', 'B']"]
    assert schema_errors(schema, {}) == [".: missing required field 'kind'"]
    assert schema_errors(schema, {"kind": "A", "open": {"n": "1"}}) == [
        ".open.n: expected integer, got str '1'"
    ]
    assert schema_errors(schema, {"kind": "A", "map": {"a": True}}) == [
        ".map.a: expected integer, got bool True"
    ]
    assert schema_errors(schema, {"kind": "A", "list": [True, 0]}) == [
        ".list[1]: expected boolean, got int 0"
    ]
    assert schema_errors(schema, {"kind": "A", "knd": "A"}) == [".: unknown field 'knd'"]
    with pytest.raises(ValueError, match="does not know: \\['anyOf'\\]"):
        schema_errors({"anyOf": []}, 1)


# ---- the manifests against the schemas ---------------------------------------------------------


def test_the_tfjob_validates_against_the_operators_crd():
    group, version, kind = CRD["spec"]["group"], CRD_VERSION["name"], CRD["spec"]["names"]["kind"]
    assert (TFJOB["apiVersion"], TFJOB["kind"]) == (f"{group}/{version}", kind)
    assert schema_errors(TFJOB_SCHEMA, TFJOB) == []


def test_the_claim_validates_against_kubernetes_schema():
    assert (PVC["apiVersion"], PVC["kind"]) == ("v1", "PersistentVolumeClaim")
    assert schema_errors(PVC_SCHEMA, PVC) == []


def _container(job, replica="Worker"):
    return job["spec"]["tfReplicaSpecs"][replica]["template"]["spec"]["containers"][0]


def _pod(job, replica="Worker"):
    return job["spec"]["tfReplicaSpecs"][replica]["template"]["spec"]


def _rename(d, old, new):
    d[new] = d.pop(old)


@pytest.mark.parametrize(
    "change, error",
    [
        (
            lambda j: _rename(_container(j), "volumeMounts", "volumeMount"),
            "containers[0]: unknown field 'volumeMount'",
        ),
        (
            lambda j: _rename(j["spec"]["runPolicy"], "backoffLimit", "backOffLimit"),
            "runPolicy: unknown field 'backOffLimit'",
        ),
        (
            lambda j: _rename(j["spec"]["tfReplicaSpecs"]["PS"], "replicas", "replica"),
            "PS: unknown field 'replica'",
        ),
        (
            lambda j: _rename(j["spec"], "tfReplicaSpecs", "replicaSpecs"),
            "missing required field 'tfReplicaSpecs'",
        ),
        (
            lambda j: _rename(_pod(j)["volumes"][0]["persistentVolumeClaim"], "claimName", "claim"),
            "unknown field 'claim'",
        ),
        (
            lambda j: j["spec"]["tfReplicaSpecs"]["Worker"].update(replicas="2"),
            "Worker.replicas: expected integer",
        ),
        (lambda j: _container(j)["ports"][0].update(containerPort="2222"), "containerPort: expected integer"),
        (lambda j: _pod(j).pop("containers"), "Worker.template.spec: missing required field 'containers'"),
        (lambda j: _container(j).update(command="disttrain-train"), "command: expected array"),
    ],
)
def test_a_misspelt_or_mistyped_field_of_the_tfjob_is_refused(change, error):
    job = copy.deepcopy(TFJOB)
    change(job)
    found = schema_errors(TFJOB_SCHEMA, job)
    assert any(error in line for line in found), found


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda c: _rename(c["spec"], "accessModes", "accessMode"), "spec: unknown field 'accessMode'"),
        (
            lambda c: _rename(c["spec"]["resources"], "requests", "request"),
            "resources: unknown field 'request'",
        ),
        (
            lambda c: c["spec"]["resources"]["requests"].update(storage="10GB"),
            "storage: '10GB' does not match",
        ),
    ],
)
def test_a_misspelt_field_of_the_claim_is_refused(change, error):
    claim = copy.deepcopy(PVC)
    change(claim)
    found = schema_errors(PVC_SCHEMA, claim)
    assert any(error in line for line in found), found


# The values the operator's types allow, which its CRD leaves as plain strings and its webhook does not
# check: a misspelt restart policy is copied into the pods (pkg/core/pod.go SetRestartPolicy), which
# Kubernetes then refuses to create.
REPLICA_TYPES = {"Chief", "Master", "PS", "Worker", "Evaluator"}  # tensorflow_types.go
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}  # common_types.go
CLEAN_POD_POLICIES = {"All", "Running", "None"}  # common_types.go
CONTAINER, PORT_NAME, DEFAULT_PORT = "tensorflow", "tfjob-port", 2222  # tensorflow_types.go


def test_the_tfjob_passes_the_operators_own_checks():
    # The webhook: a DNS-1035 name, a container named tensorflow with an image in every replica
    # type, at most one Chief or Master.
    name = TFJOB["metadata"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, name
    specs = TFJOB["spec"]["tfReplicaSpecs"]
    for kind, spec in specs.items():
        containers = spec["template"]["spec"]["containers"]
        assert all(c.get("image") for c in containers), kind
        assert CONTAINER in [c["name"] for c in containers], kind
    assert len({"Chief", "Master"} & set(specs)) <= 1
    assert set(specs) <= REPLICA_TYPES
    assert {spec["restartPolicy"] for spec in specs.values()} <= RESTART_POLICIES
    assert TFJOB["spec"]["runPolicy"]["cleanPodPolicy"] in CLEAN_POD_POLICIES
    assert not TFJOB["spec"].get("enableDynamicWorker")  # its sparse TF_CONFIG: see the last test


def operator_retries(exit_code: int) -> bool:
    """ExitCode's rule, pkg/util/train/train_util.go IsRetryableExitCode: 128 and above are retried."""
    return exit_code >= 128


def test_every_replica_restarts_on_disttrains_transient_exits_and_only_on_them():
    for kind, spec in TFJOB["spec"]["tfReplicaSpecs"].items():
        assert spec["restartPolicy"] == "ExitCode", kind
    permanent = [
        errors.DisttrainError.exit_code,
        errors.EXIT_CONFIG,
        errors.EXIT_DIVERGED,
        errors.EXIT_STALLED,
    ]
    assert not any(operator_retries(code) for code in permanent), permanent
    # a transient fault, Ctrl-C, a kill by a signal (the OOM killer's SIGKILL: 128 + 9)
    assert all(operator_retries(code) for code in (errors.EXIT_TRANSIENT, 130, 128 + 9))


def test_retries_that_never_succeed_end():
    # backoffLimit counts containers' restarts; ExitCode recreates pods instead, which training-operator
    # 1.9 does not count (pkg/core/job.go PastBackoffLimit; kubeflow/trainer#2045). The deadline is what
    # ends a job whose retries never succeed.
    policy = TFJOB["spec"]["runPolicy"]
    assert policy["backoffLimit"] > 0
    assert policy["activeDeadlineSeconds"] > 0


def test_the_claim_the_pods_mount_is_shipped_and_shared():
    claims = set()
    for kind, spec in TFJOB["spec"]["tfReplicaSpecs"].items():
        pod = spec["template"]["spec"]
        volumes = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
        claims |= set(volumes.values())
        (container,) = pod["containers"]
        (mount,) = container["volumeMounts"]
        assert mount["name"] in volumes, kind
        (logdir,) = [a.split("=", 1)[1] for a in container["command"] if a.startswith("--logdir=")]
        assert logdir.startswith(mount["mountPath"].rstrip("/") + "/"), (kind, logdir)
    assert claims == {PVC["metadata"]["name"]}
    assert PVC["spec"]["accessModes"] == ["ReadWriteMany"]  # every pod, on any node, writes the logdir


def test_the_image_names_a_registry_and_the_docs_say_how_to_build_and_push_it():
    images = {
        c["image"]
        for s in TFJOB["spec"]["tfReplicaSpecs"].values()
        for c in s["template"]["spec"]["containers"]
    }
    (image,) = images
    host = image.split("/", 1)[0]
    assert "/" in image and ("." in host or ":" in host or host == "localhost"), image  # Docker's rule
    version = re.search(r'\bversion="([^"]+)"', read("setup.py"))[1]
    assert image.endswith(f":{version}"), (image, version)
    build, push = f"docker build -f deploy/Dockerfile -t {image} .", f"docker push {image}"
    for page in (("deploy", "Dockerfile"), ("docs", "cluster.md")):
        text = read(*page)
        assert build in text and push in text, page


# ---- .dockerignore ----------------------------------------------------------------------------


def dockerignore_rules(text: str) -> list[tuple[bool, re.Pattern]]:
    """(excludes, pattern) per line, as Docker reads .dockerignore (Go's filepath.Match, plus **)."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        assert "[" not in pattern and "\\" not in pattern, f"not handled here: {line}"
        regex = re.sub(r"\\\*\\\*/|\\\*\\\*|\\\*|\\\?", _glob, re.escape(pattern))
        rules.append((not negated, re.compile(regex + "$")))
    return rules


def _glob(m: re.Match) -> str:
    return {r"\*\*/": "(.*/)?", r"\*\*": ".*", r"\*": "[^/]*", r"\?": "[^/]"}[m[0]]


def sent(rules, path: str) -> bool:
    """Whether the build context keeps `path`: the last rule matching it or a folder above it decides."""
    parts = path.split("/")
    keep = True
    for excludes, regex in rules:
        if any(regex.match("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            keep = not excludes
    return keep


def test_the_image_gets_what_pip_install_needs_and_nothing_else():
    rules = dockerignore_rules(read(".dockerignore"))
    needed = ["setup.py", "pyproject.toml"]
    for top in ("disttrain", "model_zoo", "gin"):  # the packages setup.py installs
        for root, dirs, files in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            needed += [os.path.relpath(os.path.join(root, f), REPO).replace(os.sep, "/") for f in files]
    assert "disttrain/bench/data" in " ".join(needed)  # package data too
    assert [p for p in needed if not sent(rules, p)] == []
    left_out = [
        ".git/HEAD",
        "tests/unit/test_deploy.py",
        "docs/cluster.md",
        "build/lib/disttrain/cluster.py",
        "dist/disttrain-0.1.0.tar.gz",
        "disttrain.egg-info/PKG-INFO",
        "BUILD_NOTES.md",
        "deploy/tfjob.yaml",
        "/".join(("disttrain", "__pycache__", "cluster.cpython-311.pyc")),  # (a path no checkout holds)
        "runs/mlp/model.ckpt-1.index",
    ]
    assert [p for p in left_out if sent(rules, p)] == []


# ---- TF_CONFIG as the operator writes it --------------------------------------------------------


def operator_tf_config(job: dict, replica: str, index: int, namespace: str = "default", operator_env=None):
    """The TF_CONFIG training-operator 1.9 puts into the pod of `replica` `index` (None: it sets none).

    tensorflow.go: genClusterSpec lists every replica type of the job (lower case, the evaluator
    too), each task as `<job>-<type>-<index>.<namespace>.svc`, plus `.<domain>` when the operator
    runs with CUSTOM_CLUSTER_DOMAIN set, and the port of the `tensorflow` container's port named
    `tfjob-port` (else 2222); genTFConfigJSONStr adds the task and `"environment": "cloud"`.
    SetClusterSpec writes nothing for a job of a single task (isDistributed).
    """
    specs = job["spec"]["tfReplicaSpecs"]
    if sum(spec.get("replicas", 1) for spec in specs.values()) == 1:
        return None
    domain = (operator_env or {}).get("CUSTOM_CLUSTER_DOMAIN", "")
    cluster = {}
    for kind, spec in specs.items():
        port = DEFAULT_PORT
        for container in spec["template"]["spec"]["containers"]:
            if container["name"] == CONTAINER:
                port = next(
                    (p["containerPort"] for p in container.get("ports", ()) if p.get("name") == PORT_NAME),
                    port,
                )
        hosts = [
            f"{job['metadata']['name']}-{kind.lower()}-{i}".replace("/", "-")
            for i in range(spec.get("replicas", 1))
        ]
        cluster[kind.lower()] = [
            f"{h}.{namespace}.svc" + (f".{domain}" if domain else "") + f":{port}" for h in hosts
        ]
    config = {
        "cluster": dict(sorted(cluster.items())),
        "task": {"type": replica.lower(), "index": index},
        "environment": "cloud",
    }
    return json.dumps(config, separators=(",", ":"))  # Go's json.Marshal: compact, map keys sorted


def tasks(job: dict) -> list[tuple[str, int]]:
    return [
        (kind, i)
        for kind, spec in job["spec"]["tfReplicaSpecs"].items()
        for i in range(spec.get("replicas", 1))
    ]


def parsed(job, kind, index, **kw) -> tuple[Cluster, dict]:
    """The task's cluster as disttrain-train reads it (TF_CONFIG alone, no --job/--task), and TF_CONFIG."""
    text = operator_tf_config(job, kind, index, **kw)
    return resolve(environ={"TF_CONFIG": text}), json.loads(text)


ROLE = {"Chief": "chief", "Master": "chief", "PS": "ps", "Worker": "worker", "Evaluator": "evaluator"}


def check_every_task(job: dict, **kw) -> dict[tuple[str, int], Cluster]:
    """Every task of `job` takes the role, index and addresses the operator gave it."""
    seen = {}
    for kind, index in tasks(job):
        cluster, config = parsed(job, kind, index, **kw)
        # master is the chief's other name; the evaluator serves nothing, so it is no job
        expected = {
            ("chief" if k == "master" else k): v for k, v in config["cluster"].items() if k != "evaluator"
        }
        assert (cluster.task_type, cluster.task_index) == (ROLE[kind], index)
        assert cluster.as_dict() == expected, (kind, index)
        own = config["cluster"][kind.lower()][index]
        assert cluster.address == (None if kind == "Evaluator" else own), (kind, index)
        assert cluster.is_chief == (kind in ("Chief", "Master")), (kind, index)
        seen[kind, index] = cluster
    return seen


def test_every_task_of_the_shipped_tfjob_reads_the_operators_tf_config():
    seen = check_every_task(TFJOB)
    assert sorted(seen) == [("Chief", 0), ("PS", 0), ("PS", 1), ("Worker", 0), ("Worker", 1)]
    worker = seen["Worker", 1]
    assert worker.address == "disttrain-mlp-worker-1.default.svc:2222"
    assert worker.jobs["ps"] == ("disttrain-mlp-ps-0.default.svc:2222", "disttrain-mlp-ps-1.default.svc:2222")
    assert (worker.num_replicas, worker.replica_index, worker.num_ps) == (3, 2, 2)


def _with_evaluator(job):
    job["spec"]["tfReplicaSpecs"]["Evaluator"] = dict(
        copy.deepcopy(job["spec"]["tfReplicaSpecs"]["Worker"]), replicas=1
    )


def _chief_as_master(job):
    _rename(job["spec"]["tfReplicaSpecs"], "Chief", "Master")


def _ps_port(job):
    _container(job, "PS")["ports"][0]["containerPort"] = 2300


def _worker_port_unnamed(job):
    _container(job, "Worker")["ports"][0]["name"] = "grpc"


@pytest.mark.parametrize(
    "change, kw, task, address",
    [
        # The operator lists the evaluator; disttrain leaves it out of the jobs (nobody connects to it).
        (_with_evaluator, {}, ("Evaluator", 0), None),
        (_with_evaluator, {}, ("Worker", 0), "disttrain-mlp-worker-0.default.svc:2222"),
        # Master, the older name of the chief.
        (_chief_as_master, {}, ("Master", 0), "disttrain-mlp-master-0.default.svc:2222"),
        (_chief_as_master, {}, ("PS", 1), "disttrain-mlp-ps-1.default.svc:2222"),
        # The job's namespace, and the operator's CUSTOM_CLUSTER_DOMAIN.
        (None, {"namespace": "ml"}, ("PS", 0), "disttrain-mlp-ps-0.ml.svc:2222"),
        (
            None,
            {"operator_env": {"CUSTOM_CLUSTER_DOMAIN": "cluster.local"}},
            ("Chief", 0),
            "disttrain-mlp-chief-0.default.svc.cluster.local:2222",
        ),
        # The port is the container's port named tfjob-port, per replica type; without one, 2222.
        (_ps_port, {}, ("PS", 1), "disttrain-mlp-ps-1.default.svc:2300"),
        (_worker_port_unnamed, {}, ("Worker", 1), "disttrain-mlp-worker-1.default.svc:2222"),
    ],
)
def test_every_replica_type_reads_the_operators_tf_config(change, kw, task, address):
    job = copy.deepcopy(TFJOB)
    if change:
        change(job)
    seen = check_every_task(job, **kw)
    assert seen[task].address == address
    if change is _with_evaluator:
        cluster, config = parsed(job, "Evaluator", 0)
        assert config["cluster"]["evaluator"] == ["disttrain-mlp-evaluator-0.default.svc:2222"]
        assert "evaluator" not in cluster.jobs and not cluster.is_replica and not cluster.is_chief
    if change is _chief_as_master:
        assert seen["Worker", 0].jobs["chief"] == ("disttrain-mlp-master-0.default.svc:2222",)
    if change is _ps_port:
        assert seen["Worker", 0].jobs["ps"][1] == "disttrain-mlp-ps-1.default.svc:2300"


def test_a_single_task_job_gets_no_tf_config_and_trains_alone():
    job = copy.deepcopy(TFJOB)
    job["spec"]["tfReplicaSpecs"] = {"Worker": dict(job["spec"]["tfReplicaSpecs"]["Worker"], replicas=1)}
    assert operator_tf_config(job, "Worker", 0) is None
    assert resolve(environ={}).is_local


def test_the_sparse_tf_config_of_enable_dynamic_worker_is_refused_in_one_line():
    # With spec.enableDynamicWorker the operator writes a worker only its own address, as a map
    # (convertClusterSpecToSparseClusterSpec): disttrain needs the whole cluster and says so.
    sparse = {
        "cluster": {"worker": {"1": "disttrain-mlp-worker-1.default.svc:2222"}, "ps": []},
        "task": {"type": "worker", "index": 1},
    }
    with pytest.raises(ConfigError, match="cluster.worker must be a list of 'host:port'"):
        resolve(environ={"TF_CONFIG": json.dumps(sparse)})
