from disttrain import cli, local


def test_each_worker_gets_its_own_gpu_and_ps_none():
    assert local.visible_devices("ps", 0, gpus=4) == ""
    assert [local.visible_devices("worker", i, gpus=4) for i in range(3)] == ["0", "1", "2"]
    assert local.visible_devices("chief", 0, gpus=4) == "0"
    assert local.visible_devices("worker", 1, gpus=4, gpus_per_worker=2) == "2,3"
    assert local.visible_devices("worker", 0, gpus=0) is None  # no GPUs: leave it unset


def test_cluster_layout_and_tf_config():
    c = local.LocalCluster(["x.gin"], "/tmp/l", num_ps=2, num_workers=2, chief=True, evaluator=True)
    assert [t.name for t in c.tasks] == [
        "/job:ps/task:0",
        "/job:ps/task:1",
        "/job:chief/task:0",
        "/job:worker/task:0",
        "/job:worker/task:1",
        "/job:evaluator/task:0",
    ]
    assert set(c.cluster) == {"ps", "chief", "worker"}  # the evaluator serves nothing
    assert all(a.startswith("127.0.0.1:") for job in c.cluster.values() for a in job)  # loopback only
    assert c.chief_task.name == "/job:chief/task:0"


def test_log_follower(tmp_path):
    path = tmp_path / "log"
    follower = local.LogFollower(str(path))
    assert follower.new_lines() == []
    path.write_text("a\nb")
    assert follower.new_lines() == ["a"]
    with open(path, "a") as f:
        f.write("c\n")
    assert follower.new_lines() == ["bc"]


def test_summary_table():
    results = {
        "worker_0": dict(
            local_steps=10,
            examples_per_sec=100.0,
            final_loss=0.5,
            cluster_examples_per_sec=190.0,
            chief=True,
            global_step=20,
        ),
        "worker_1": dict(
            local_steps=10,
            examples_per_sec=90.0,
            final_loss=0.4,
            cluster_examples_per_sec=0.0,
            global_step=20,
        ),
    }
    text = cli.summary(results, {"/job:ps/task:0": 0}, "/tmp/l")
    assert "cluster examples/sec 190.0" in text and "sum over tasks: 190.0" in text
