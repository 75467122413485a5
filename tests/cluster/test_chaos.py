"""The chaos soak (tests/chaos.py), short: a few random SIGKILLs and SIGTERMs per strategy in 1-2 minutes.

DISTTRAIN_CHAOS_SECS=1200 runs the long soak (20 minutes of faults per
strategy; raise DISTTRAIN_CHAOS_STEPS so that training outlasts it, and set
DISTTRAIN_CHAOS_EVERY, the mean seconds between faults, for more of them
than one every SECS/6).
"""

import os

import pytest
import tensorflow as tf

from tests.chaos import ids_read, soak
from tests.cluster.helpers import TINY

pytestmark = [pytest.mark.cluster, pytest.mark.fault]

SECS = float(os.environ.get("DISTTRAIN_CHAOS_SECS", "50"))
CHECKPOINT_STEPS, LOG_STEPS = 200, 25
# gin file, more settings, training steps that outlast the short soak on a loaded 2-core machine
STRATEGIES = {
    "async_ps": ("gin/mlp_async.gin", [], 12000),
    "sync_ps": ("gin/mlp_sync.gin", ["SyncParameterServer.backup_workers=1"], 2400),
    "allreduce": ("gin/mlp_allreduce.gin", [], 4800),
}


# A replica that hangs in a step (the first of a recovered session, where two soaks once hung for
# good, silently) is ended by its watchdog and restarted: the soak fails on a lost step, a step
# going back, a bad exit code, or a cluster that outlasts its timeout.
@pytest.mark.timeout(SECS + 900)  # the long soak outlasts pytest's default limit
# Every soak is extended (-m extended): 2-3.5 minutes each on a slow CPU, and CI's 90 minutes are a
# hard limit; CI keeps the targeted fault tests (test_faults, test_preemption, test_waits).
@pytest.mark.extended
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_chaos_soak(tmp_path, strategy):
    gin, settings, steps = STRATEGIES[strategy]
    steps = int(os.environ.get("DISTTRAIN_CHAOS_STEPS", steps))
    report = soak(
        [gin, TINY],
        str(tmp_path / "logdir"),
        gin_params=[
            f"TrainConfig.train_steps={steps}",
            f"TrainConfig.save_checkpoint_steps={CHECKPOINT_STEPS}",
            f"TrainConfig.log_every_steps={LOG_STEPS}",
            *settings,
        ],
        duration_secs=SECS,
        every_secs=float(os.environ.get("DISTTRAIN_CHAOS_EVERY", max(20.0, SECS / 6))),
        seed=int(os.environ.get("DISTTRAIN_CHAOS_SEED", "1")),
        num_ps=2 if strategy != "allreduce" else 0,
        num_workers=2,
        timeout_secs=SECS + 600,
        last_step=steps,
    )
    print(f"chaos soak, {strategy}:\n{report}")
    (tmp_path / "report.txt").write_text(str(report))
    assert report.faults, report
    assert set(report.codes.values()) == {0}, report
    assert not report.went_back_without_restore, report
    for fault in report.faults:
        bound = 0 if fault.signal == "SIGTERM" else CHECKPOINT_STEPS + LOG_STEPS
        assert fault.lost <= bound, (fault, str(report))
    assert report.final_step >= steps


USER_SCRIPT = """
import disttrain

import os
import time

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def record(ids, present):
    time.sleep(0.04)  # a step long enough for the soak's faults to land mid-epoch
    if present:
        with open(os.path.join({out!r}, f"ids_{{os.getpid()}}.txt"), "a") as f:
            f.write("".join(f"{{i}}\\n" for i in ids))
    return np.int64(0)


def loss_fn(ctx):
    records = ctx.shard({pattern!r})
    ids = ctx.get_next(records.map(lambda r: tf.io.parse_single_example(
        r, {{"id": tf.io.FixedLenFeature([], tf.int64)}})["id"]).batch(ctx.batch_size))
    read = tf.numpy_function(record, [ids, ctx.data_present()], tf.int64)
    w = v1.get_variable("w", [], initializer=v1.zeros_initializer())
    return tf.square(w - 1.0) + 0.0 * tf.cast(read, tf.float32)


disttrain.fit(
    loss_fn,
    lambda: v1.train.GradientDescentOptimizer(0.001),
    steps=10**9,  # the end of the data ends training
    logdir={logdir!r},
    strategy=lambda cluster: disttrain.SyncParameterServer(cluster, num_towers=2),
    batch_size={batch},
    log_every_steps={log_steps},
    save_checkpoint_steps={checkpoint_steps},
    save_checkpoint_secs=None,
    stall_steps=0,
)
"""
# 18,000 ids in 7 files that do not divide among 4 pipelines (5,850, 3,690, 6,030 and 2,430 records).
USER_FILES = [2700, 1980, 3690, 2430, 3150, 1710, 2340]
USER_BATCH, USER_TOWERS, USER_REPLICAS = 4, 2, 2


def write_user_files(directory) -> str:
    directory.mkdir()
    first = 0
    for f, size in enumerate(USER_FILES):
        with tf.io.TFRecordWriter(str(directory / f"ids-{f}.tfrecord")) as writer:
            for i in range(first, first + size):
                feature = tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))
                example = tf.train.Example(features=tf.train.Features(feature={"id": feature}))
                writer.write(example.SerializeToString())
        first += size
    return str(directory / "ids-*.tfrecord")


@pytest.mark.timeout(SECS + 900)
# Extended (CI's time). Its last CI run (11-27, two test files at a time) failed: 184 ids read twice
# against a bound of 32 after a PS's SIGTERM whose chief outlived preempt_secs (decision 0023).
@pytest.mark.extended
def test_chaos_soak_with_the_users_own_uneven_files(tmp_path):
    """Replicas read their own sharded files (Join at the end); faults at random; every id accounted for.

    A SIGKILLed replica goes on from its last saved input position, and after a PS is lost every
    replica goes back to the position saved with the checkpoint the chief restores: ids are read
    again (at most the steps since the last save, per fault), never skipped.
    """
    out = tmp_path / "read"
    out.mkdir()
    logdir = tmp_path / "logdir"
    script = tmp_path / "users_model.py"
    script.write_text(
        USER_SCRIPT.format(
            out=str(out),
            pattern=write_user_files(tmp_path / "data"),
            logdir=str(logdir),
            batch=USER_BATCH,
            log_steps=LOG_STEPS,
            checkpoint_steps=CHECKPOINT_STEPS // 4,
        )
    )
    report = soak(
        [],
        str(logdir),
        script=str(script),
        duration_secs=SECS,
        every_secs=float(os.environ.get("DISTTRAIN_CHAOS_EVERY", max(20.0, SECS / 6))),
        seed=int(os.environ.get("DISTTRAIN_CHAOS_SEED", "1")),
        num_ps=2,
        num_workers=USER_REPLICAS,
        timeout_secs=SECS + 600,
    )
    ids = ids_read(str(out), sum(USER_FILES))
    print(f"chaos soak, the user's own files:\n{report}\n{ids}")
    (tmp_path / "report.txt").write_text(f"{report}\n{ids}")
    assert report.faults, report
    assert set(report.codes.values()) == {0}, report
    assert ids.lost == [], (str(ids), ids.lost[:20])
    per_step = USER_BATCH * USER_TOWERS
    # Per SIGKILL, the steps since the last save and the one in flight, of one replica (of every
    # replica when a PS is lost); per SIGTERM, the step in flight.
    bound = sum(
        (CHECKPOINT_STEPS // 4 + 2) * per_step * (USER_REPLICAS if f.task.startswith("/job:ps") else 1)
        if f.signal == "SIGKILL"
        else per_step * USER_REPLICAS
        for f in report.faults
    )
    assert ids.repeated <= bound, (str(ids), bound, str(report))
