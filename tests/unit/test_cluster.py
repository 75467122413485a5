import json

import pytest

from disttrain.base.cluster import Cluster, resolve
from disttrain.base.errors import ConfigError

SPEC = {"chief": ["c:2220"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222", "p1:2222"]}


def test_tf_config_as_kubeflow_writes_it():
    c = Cluster.from_tf_config(
        json.dumps({"cluster": SPEC, "task": {"type": "worker", "index": 1}, "environment": "cloud"})
    )
    assert (c.task_type, c.task_index, c.num_ps, c.num_replicas) == ("worker", 1, 2, 3)
    assert c.replica_index == 2 and not c.is_chief
    assert c.address == "w1:2222"
    assert c.task_name == "/job:worker/task:1"


def test_master_means_chief_and_extra_keys_are_ignored():
    spec = {"master": ["m:1"], "worker": ["w:1"], "ps": ["p:1"]}
    c = Cluster.from_tf_config(
        {"cluster": spec, "task": {"type": "master", "index": 0}, "job": {}, "trial": "7"}
    )
    assert c.task_type == "chief" and c.is_chief and c.replica_index == 0
    assert c.as_dict() == {"chief": ["m:1"], "worker": ["w:1"], "ps": ["p:1"]}


def test_evaluator_missing_from_cluster_is_accepted():
    c = Cluster.from_tf_config({"cluster": SPEC, "task": {"type": "evaluator", "index": 0}})
    assert c.task_type == "evaluator" and c.address is None and not c.is_replica


def test_worker_zero_is_chief_without_chief_job():
    spec = {"worker": ["a:1", "b:1"], "ps": ["p:1"]}
    assert Cluster.from_tf_config({"cluster": spec, "task": {"type": "worker", "index": 0}}).is_chief
    assert not Cluster.from_tf_config({"cluster": spec, "task": {"type": "worker", "index": 1}}).is_chief


@pytest.mark.parametrize(
    "tf_config, message",
    [
        ("{not json", "malformed TF_CONFIG: not JSON"),
        ('["a"]', "malformed TF_CONFIG: expected a JSON object"),
        ('{"cluster": {"worker": ["a:1"]}}', "expected keys 'cluster' (object) and 'task'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "driver", "index": 0}}', "unknown job 'driver'"),
        (
            '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 5}}',
            "task index 5 out of range: job 'worker' has 2 tasks",
        ),
        ('{"cluster": {"worker": ["nohostport"]}, "task": {"type": "worker"}}', "bad address 'nohostport'"),
        ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps"}}', "no 'worker' or 'chief' task"),
        ('{"cluster": {"gpu": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker"}}', "unknown job 'gpu'"),
    ],
)
def test_bad_tf_config_says_what_is_wrong(tf_config, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Cluster.from_tf_config(tf_config)


def test_resolve_flags_override_task_of_tf_config():
    env = {"TF_CONFIG": json.dumps({"cluster": SPEC, "task": {"type": "worker", "index": 0}})}
    c = resolve(job="ps", task=1, environ=env)
    assert (c.task_type, c.task_index) == ("ps", 1)


def test_resolve_hosts_and_local():
    c = resolve("worker", 1, ps_hosts=["p:1"], worker_hosts=["a:1", "b:1"], environ={})
    assert c.num_ps == 1 and c.replica_index == 1
    assert resolve(environ={}).is_local
    with pytest.raises(ConfigError, match="no cluster is given"):
        resolve(job="worker", task=0, environ={})


def test_describe_marks_this_task():
    text = Cluster.from_tf_config({"cluster": SPEC, "task": {"type": "ps", "index": 1}}).describe()
    assert "/job:ps/task:1  p1:2222  <- this task" in text
