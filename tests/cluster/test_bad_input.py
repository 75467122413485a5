"""Bad input: one clear line naming the problem, a non-zero exit, no traceback wall."""

import json
import os
import socket

import pytest

from disttrain.base.errors import EXIT_CONFIG, EXIT_TRANSIENT
from disttrain.edges.local import free_port
from tests.cluster.helpers import TINY, train_py

pytestmark = pytest.mark.cluster

GIN = ["--gin_file=gin/mlp_async.gin", f"--gin_file={TINY}"]


def tf_config(task_type="worker", index=0, ps_port=None, worker_port=None):
    cluster = {
        "ps": [f"127.0.0.1:{ps_port or free_port()}"],
        "worker": [f"127.0.0.1:{worker_port or free_port()}"],
    }
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def check_one_line(result, code, *words):
    assert result.returncode == code, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("disttrain: error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def env_with(**extra):
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def test_malformed_tf_config():
    r = train_py(GIN + ["--dry_run"], env=env_with(TF_CONFIG='{"cluster": {"worker": ["a:1"]'))
    check_one_line(r, EXIT_CONFIG, "malformed TF_CONFIG", "not JSON")


def test_unknown_job_name():
    r = train_py(GIN + ["--job=driver", "--task=0"], env=env_with(TF_CONFIG=tf_config()))
    check_one_line(r, EXIT_CONFIG, "unknown job 'driver'", "ps, worker, chief, evaluator")


def test_task_index_out_of_range():
    r = train_py(GIN + ["--job=worker", "--task=3"], env=env_with(TF_CONFIG=tf_config()))
    check_one_line(r, EXIT_CONFIG, "task index 3 out of range: job 'worker' has 1 tasks")


def test_missing_gin_file():
    r = train_py(["--gin_file=gin/no_such.gin"], env=env_with())
    check_one_line(r, EXIT_CONFIG, "gin/no_such.gin", "not found")


@pytest.mark.parametrize(
    "binding, named",
    [
        ("TrainConfig.bogus_steps=3", "bogus_steps"),
        ("no_such_model.depth=3", "no_such_model"),
        ("mlp.depth=(", ""),
    ],
)
def test_unknown_gin_binding(binding, named):
    r = train_py(GIN + [f"--gin_param={binding}", "--dry_run"], env=env_with())
    check_one_line(r, EXIT_CONFIG, "bad gin config", named)


def test_a_required_argument_left_unset_is_named(tmp_path):
    """The issue's command: gin's 30-line traceback ('Caller supplied values for: ['self']'), exit 1."""
    args = ["--gin_file=gin/mlp_async.gin", "--gin_param=TrainConfig.optimizer=@SGD", f"--logdir={tmp_path}"]
    check_one_line(train_py(args, env=env_with()), EXIT_CONFIG, "SGD.learning_rate is not set")


def test_port_already_in_use():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        r = train_py(GIN + ["--job=ps", "--task=0"], env=env_with(TF_CONFIG=tf_config("ps", 0, ps_port=port)))
    check_one_line(r, EXIT_CONFIG, f"port {port}", "/job:ps/task:0", "already in use")


def test_unreachable_peer_is_named_after_a_bounded_wait():
    r = train_py(
        GIN + ["--gin_param=TrainConfig.peer_wait_secs=2"],
        env=env_with(TF_CONFIG=tf_config("worker", 0)),  # nobody serves the PS port
    )
    check_one_line(r, EXIT_TRANSIENT, "/job:ps/task:0", "unreachable after 2 s")
