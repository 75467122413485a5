"""Synchronous strategies on real clusters: equivalence, backup workers, 16-bit transfer, shutdown.

Every run is a LocalCluster of bin/train.py processes on loopback, bounded
in time, with every task's log shown on failure.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from disttrain.edges.local import LocalCluster
from disttrain.edges.private_network import PrivateNetwork
from disttrain.launch import read_results
from model_zoo.mlp import MLP
from tests.cluster.helpers import TINY, describe_failure, run_timed, train_py, variables

pytestmark = pytest.mark.cluster

v1 = tf.compat.v1

SYNC_PS = "gin/mlp_sync.gin"
STRAGGLER = "tests/cluster/straggler.gin"  # SyncParameterServer whose listed replicas sleep before sending
ALLREDUCE = "gin/mlp_allreduce.gin"
START = 5  # the common start is a checkpoint at this step: replicas must resume from it
STEPS = 10
BATCH = 4  # per worker; the single process takes 2 x BATCH
# Same data split between replicas, same start, plain SGD: the runs must agree.
EQUIVALENCE = [
    "TrainConfig.input_fn = @sequence_input",
    "TrainConfig.optimizer = @SGD",
    "SGD.learning_rate = 0.1",
    f"TrainConfig.train_steps = {START + STEPS}",
    "TrainConfig.save_checkpoint_steps = 1000",
    "TrainConfig.log_every_steps = 5",
]
SHUTDOWN_BOUND_SECS = 30.0
MEASURED: dict[str, object] = {}  # printed at the end of the module (pytest -s shows it)


# ---- running clusters --------------------------------------------------------------------


def initial_checkpoint(logdir: str, seed: int = 7) -> None:
    """The tiny MLP (gin/testing/tiny.gin's shape) at step START from a fixed seed: every run's start."""
    os.makedirs(logdir, exist_ok=True)
    with tf.Graph().as_default():
        v1.set_random_seed(seed)
        MLP(32, (64, 64), 10).build_variables()
        step = v1.train.get_or_create_global_step()
        saver = v1.train.Saver()
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            session.run(step.assign(START))
            saver.save(session, os.path.join(logdir, "model.ckpt"), global_step=START)


def shutdown_secs(cluster: LocalCluster, exited: dict[str, float]) -> float:
    """From the chief's end of training (its result.json, written after the final checkpoint)
    to the last task's exit."""
    chief = cluster.chief_task
    done = os.path.getmtime(
        os.path.join(cluster.logdir, "tasks", f"{chief.job}_{chief.index}", "result.json")
    )
    return max(exited.values()) - done


def assert_same_variables(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    assert int(got["global_step"]) == int(want["global_step"]) == START + STEPS
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: one process, no cluster, batch 2 x BATCH, from the common start."""
    logdir = str(tmp_path_factory.mktemp("one_process"))
    initial_checkpoint(logdir)
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    params = [*EQUIVALENCE, f"TrainConfig.batch_size = {2 * BATCH}"]
    args = [f"--logdir={logdir}", f"--gin_file={SYNC_PS}", f"--gin_file={TINY}"]
    r = train_py(args + [f"--gin_param={p}" for p in params], env=env, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return variables(logdir)


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if MEASURED:
        print("\nmeasured by tests/cluster/test_sync.py:")
        for key, value in MEASURED.items():
            print(f"  {key}: {value}")


# ---- equivalence --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "piece_bytes", [pytest.param(None, id="whole", marks=pytest.mark.quick), pytest.param(2048, id="pieces")]
)
def test_sync_ps_two_workers_equal_one_process_with_the_summed_batch(tmp_path, one_process, piece_bytes):
    initial_checkpoint(str(tmp_path))
    params = [*EQUIVALENCE, f"TrainConfig.batch_size = {BATCH}"]
    if piece_bytes:  # every weight in 2 KB pieces, read in ordered waves
        params.append(f"SyncParameterServer.piece_bytes = {piece_bytes}")
    # Two PS: the plan splits the larger weights, so partitioned accumulators are covered too.
    cluster, exited = run_timed(tmp_path, [SYNC_PS, TINY], num_ps=2, num_workers=2, gin_params=params)
    assert_same_variables(variables(cluster.logdir), one_process)
    assert [r["local_steps"] for r in read_results(cluster.logdir).values()] == [STEPS, STEPS]
    assert f"{STEPS} steps closed, per replica [{STEPS}, {STEPS}]" in open(cluster.chief_task.log_path).read()
    secs = shutdown_secs(cluster, exited)
    MEASURED["shutdown, sync PS 2 PS + 2 workers (s)"] = round(secs, 1)
    assert secs < SHUTDOWN_BOUND_SECS, describe_failure(cluster)


@pytest.mark.quick
def test_all_reduce_two_workers_with_two_towers_equal_one_process(tmp_path, one_process):
    """Towers on 2 virtual CPUs per worker; the chief restores the start and broadcasts it.

    Both towers of a worker read its rows, so the worker's gradient is that of
    its rows, and the all-reduce mean is the one process's gradient.
    """
    initial_checkpoint(str(tmp_path))
    params = [*EQUIVALENCE, f"TrainConfig.batch_size = {BATCH}", "SyncAllReduce.num_towers = 2"]
    cluster, exited = run_timed(tmp_path, [ALLREDUCE, TINY], num_ps=0, num_workers=2, gin_params=params)
    assert_same_variables(variables(cluster.logdir), one_process)
    r = read_results(cluster.logdir)
    # The other replica took the chief's restored step from the broadcast and ran in lockstep.
    assert r["worker_1"]["global_step"] == START + STEPS and r["worker_1"]["local_steps"] == STEPS
    MEASURED["shutdown, all-reduce 2 workers (s)"] = round(shutdown_secs(cluster, exited), 1)
    assert shutdown_secs(cluster, exited) < SHUTDOWN_BOUND_SECS


# ---- backup workers -------------------------------------------------------------------------


def test_backup_worker_lets_steps_go_at_the_pace_of_the_fastest(tmp_path):
    """3 workers, b=1; worker 2 sleeps 0.5 s between computing and sending its gradients.

    Steps must close with the other two (each in every step: two reports of one
    fast worker never make a step), the straggler's stale gradients are
    dropped, and once the chief is done the straggler, still waiting, stops.
    """
    params = [
        "StragglerSyncParameterServer.backup_workers = 1",
        "StragglerSyncParameterServer.delay_replicas = (2,)",
        "StragglerSyncParameterServer.step_delay_secs = 0.5",
        "TrainConfig.train_steps = 100",
    ]
    cluster, exited = run_timed(
        tmp_path, [SYNC_PS, TINY, STRAGGLER], num_ps=1, num_workers=3, gin_params=params
    )
    r = read_results(cluster.logdir)
    chief, slow = r["worker_0"], r["worker_2"]
    assert chief["global_step"] == 100
    global_rate = chief["global_step"] / chief["seconds"]
    slow_rate = slow["local_steps"] / slow["seconds"]
    MEASURED["straggler: global steps/s vs the slow worker's steps/s"] = (
        f"{global_rate:.1f} vs {slow_rate:.2f}"
    )
    assert global_rate > 4 * slow_rate, (global_rate, slow_rate)

    log = open(cluster.chief_task.log_path).read()
    m = re.search(r"sync aggregator: (\d+) steps closed, per replica \[(.*?)\], (\d+) stale", log)
    assert m, describe_failure(cluster)
    steps, per_replica, stale = int(m.group(1)), [int(x) for x in m.group(2).split(",")], int(m.group(3))
    assert steps == 100
    # Two distinct replicas in every step, none counted twice; almost always the two fast ones
    # (the straggler may make the first step if the others start late).
    assert sum(per_replica) == 2 * 100 and max(per_replica) <= 100, per_replica
    assert per_replica[2] <= 2 and stale >= 1, (per_replica, stale)
    secs = shutdown_secs(cluster, exited)
    MEASURED["shutdown, sync PS with a straggler (s)"] = round(secs, 1)
    assert secs < SHUTDOWN_BOUND_SECS, describe_failure(cluster)


def test_a_straggling_chief_ends_with_the_others(tmp_path):
    """3 workers, b=1, the chief is the straggler: the others close the last step and leave.

    The chief's stale step is released without an update, so its stop check
    (fed the global step it read at the start) missed the end, and its next
    step read the last step and reported for a step nobody else would join:
    it waited for ever (1 run in 6 of the correctness test's backup mode).
    """
    params = [
        "StragglerSyncParameterServer.backup_workers = 1",
        "StragglerSyncParameterServer.delay_replicas = (0,)",
        "StragglerSyncParameterServer.step_delay_secs = 0.3",
        "TrainConfig.train_steps = 60",
    ]
    cluster, _ = run_timed(
        tmp_path, [SYNC_PS, TINY, STRAGGLER], timeout=90, num_ps=1, num_workers=3, gin_params=params
    )
    r = read_results(cluster.logdir)
    assert r["worker_0"]["global_step"] == 60
    log = open(cluster.chief_task.log_path).read()
    m = re.search(r"sync aggregator: (\d+) steps closed.*?(\d+) stale reports dropped", log)
    assert m and int(m.group(1)) == 60 and int(m.group(2)) >= 1, describe_failure(cluster)


# ---- 16-bit transfer -----------------------------------------------------------------------


def _netns_supported() -> bool:
    network = PrivateNetwork()
    opened = network.open()
    network.close()
    return opened


class PrivateLoopback(PrivateNetwork):
    """A network namespace of its own: its loopback counters count only our cluster's traffic.

    The machine's own `lo` is shared with every other process, so its counters
    cannot attribute bytes. Here every task runs in one fresh namespace (the
    one `bin/launch_local.py` gives its tasks as root), and
    /proc/<holder>/net/dev gives that namespace's loopback bytes: exactly what
    the tasks sent each other.
    """

    def lo_bytes(self) -> int:
        with open(f"/proc/{self.holder.pid}/net/dev") as f:
            for line in f:
                if line.strip().startswith("lo:"):
                    return int(line.split(":", 1)[1].split()[8])  # transmitted bytes (= received, on lo)
        raise AssertionError("no loopback in the private namespace")


@pytest.mark.skipif(not _netns_supported(), reason="needs network namespaces (root or user namespaces)")
def test_16_bit_transfer_converges_and_halves_the_bytes_on_the_wire(tmp_path):
    """Bytes on the wire, counted on a private loopback, for float32, float16 and bfloat16 gradients.

    Each run trains the same MLP (307 KB of float32 gradients per step) for
    the same number of steps on 2 workers, alone in its own network
    namespace; the namespace's loopback transmit counter is every byte the
    two tasks sent each other (gRPC framing and the start-up broadcast
    included, which is why the ratio is a little above 0.5). The graph-level
    count (the collectives' input bytes) is checked exactly in
    tests/unit/test_sync_strategies.py.
    """
    steps = 30
    params = [
        "mlp.hidden_sizes = (256, 256)",
        f"TrainConfig.train_steps = {steps}",
        "Adam.learning_rate = 0.001",
    ]
    per_step = {}
    for name, transfer in (("float32", "None"), ("float16", "'float16'"), ("bfloat16", "'bfloat16'")):
        logdir = tmp_path / name
        with PrivateLoopback() as ns:
            before = ns.lo_bytes()
            cluster, _ = run_timed(
                logdir,
                [ALLREDUCE, TINY],
                num_ps=0,
                num_workers=2,
                gin_params=[*params, f"SyncAllReduce.transfer_dtype = {transfer}"],
                popen=ns.popen,
            )
            per_step[name] = (ns.lo_bytes() - before) / steps
        r = read_results(cluster.logdir)["worker_0"]
        assert r["global_step"] == steps
        if name != "float32":
            log = open(cluster.chief_task.log_path).read()
            first_loss = float(re.search(r"step \d+\s+loss ([\d.]+)", log)[1])
            assert r["final_loss"] < 0.9 * first_loss, (first_loss, r["final_loss"])
    ratios = {name: per_step[name] / per_step["float32"] for name in ("float16", "bfloat16")}
    MEASURED["wire bytes per step, float32 / float16 / bfloat16 (2 workers, 307 KB model)"] = (
        " / ".join(f"{per_step[name] / 1e3:.0f} KB" for name in per_step)
        + ", ratios "
        + ", ".join(f"{r:.3f}" for r in ratios.values())
    )
    assert all(0.45 < r < 0.6 for r in ratios.values()), per_step
