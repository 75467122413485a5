"""Every replica and tower reads its own examples, once, across restarts (real clusters).

The data are 256 distinct ids in TFRecord files. A loss function that takes
the input context shards them (`ctx.shard`) and reads them through
`ctx.get_next`, and records every id it trains on (`ctx.data_present()`) in
a file of its own; the dataset does not repeat, so its end ends training.
2 workers x 2 towers (virtual CPUs): 4 pipelines. Evenly: 8 files of 32,
2 whole files a pipeline. Unevenly (Join): 5 files of 24, 40, 64, 112 and 16
records (pipelines of 40, 40, 64 and 112: they end after 10, 10, 16 and 28
steps of 4; the chief's two first), or 2 files of 125 and 131 (fewer files than pipelines: every
4th record, 64 a pipeline, in batches of 5: the last batch of each is 4).
"""

from __future__ import annotations

import collections
import os
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

from disttrain.edges.local import free_port
from tests import extended_beyond
from tests.cluster.helpers import wait_for_line
from tests.cluster.test_own_model import logs, run_all, start, start_all

pytestmark = pytest.mark.cluster

IDS, FILES, BATCH = 256, 8, 4

SCRIPT = """
import os
import time

import numpy as np
import tensorflow as tf

import disttrain

v1 = tf.compat.v1
OUT = {out!r}


def record(ids, present, replica, tower):
    time.sleep({pause})  # a step as slow as a real one: the restart test kills worker 1 mid-run
    if present:  # not the stand-in batch of a pipeline whose data has ended
        with open(os.path.join(OUT, f"ids_{{os.getpid()}}_{{replica}}_{{tower}}.txt"), "a") as f:
            f.write("".join(f"{{i}}\\n" for i in ids))
    return np.int64(len(ids))


def loss_fn(ctx):
    records = ctx.shard({pattern!r})
    ids = ctx.get_next(records.map(lambda r: tf.io.parse_single_example(
        r, {{"id": tf.io.FixedLenFeature([], tf.int64)}})["id"]).batch(ctx.batch_size))
    read = tf.numpy_function(record, [ids, ctx.data_present(), ctx.replica_index, ctx.tower_index], tf.int64)
    w = v1.get_variable("w", [], initializer=v1.zeros_initializer())
    table = v1.get_variable("table", [{ids}, 1], initializer=v1.zeros_initializer())
    # w's gradient is the batch's mean id / IDS, row i of the table's is 1 / batch for the batch that
    # holds id i: the final values tell which batches each step applied, and with what weight.
    rows = tf.reduce_mean(tf.nn.embedding_lookup(table, ids))
    # State each step updates from its batch beside the loss, as batch norm's moving statistics do:
    # in UPDATE_OPS (tf.compat.v1.layers), and an assignment left unrun (Keras 3). Running them must
    # not make any other op of the strategy (the sync aggregator's, the overlap's transfer loop) read
    # a batch: that batch would never be trained on.
    mean_id = v1.get_variable("mean_id", [], initializer=v1.zeros_initializer(), trainable=False)
    v1.add_to_collection(
        v1.GraphKeys.UPDATE_OPS, mean_id.assign(tf.reduce_mean(tf.cast(ids, tf.float32)), read_value=False)
    )
    last_id = v1.get_variable("last_id", [], tf.int64, initializer=v1.zeros_initializer(), trainable=False)
    last_id.assign(tf.reduce_max(ids), read_value=False)
    return w * tf.reduce_mean(tf.cast(ids, tf.float32)) / {ids} + rows + 0.0 * tf.cast(read, tf.float32)


disttrain.fit(
    loss_fn,
    lambda: v1.train.GradientDescentOptimizer({lr}),
    steps=100000,
    logdir={logdir!r},
    strategy=lambda cluster: disttrain.{strategy}(cluster, num_towers=2{knobs}),
    batch_size={batch},
    log_every_steps=2,
    save_checkpoint_steps=2,
    ps_linger_secs=120,
    stall_steps=0,
    {settings}
)
"""


# Records per file: 8 files of 32 (each file holds every 8th id); or uneven, in ids 0..255 in order.
EVEN = [32] * FILES
# Replica 0 (the chief: pipelines 0 and 1, files 0, 1 and 4) has the least data: its training ends first.
UNEVEN_FILES = [24, 40, 64, 112, 16]
FEWER_FILES = [125, 131]


def write_ids(directory, sizes: list[int] = EVEN) -> str:
    directory.mkdir()
    if sizes == EVEN:
        files = [range(f, IDS, FILES) for f in range(FILES)]
    else:
        starts = np.cumsum([0, *sizes])
        files = [range(a, b) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    assert sum(len(ids) for ids in files) == IDS
    for f, ids in enumerate(files):
        with tf.io.TFRecordWriter(str(directory / f"ids-{f}.tfrecord")) as writer:
            for i in ids:
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
                    )
                )
                writer.write(example.SerializeToString())
    return str(directory / "ids-*.tfrecord")


def setup(
    tmp_path, strategy: str, lr: float = 0.01, sizes=EVEN, batch=BATCH, knobs="", pause=0.1, settings=""
) -> tuple[str, dict]:
    out = tmp_path / "read"
    out.mkdir()
    path = tmp_path / "model.py"
    path.write_text(
        SCRIPT.format(
            out=str(out),
            pattern=write_ids(tmp_path / "data", sizes),
            logdir=str(tmp_path / "logdir"),
            strategy=strategy,
            batch=batch,
            lr=lr,
            knobs=knobs,
            pause=pause,
            ids=IDS,
            settings=settings,
        )
    )
    cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(2)]}
    if strategy != "SyncAllReduce":
        cluster["ps"] = [f"127.0.0.1:{free_port()}"]
    return str(path), cluster


def ids_read(tmp_path) -> tuple[collections.Counter, dict[tuple[str, str], list[int]]]:
    """How often each id was read, and the ids each (replica, tower) read."""
    counts, by_pipeline = collections.Counter(), collections.defaultdict(list)
    for name in os.listdir(tmp_path / "read"):
        _, _, replica, tower = name[: -len(".txt")].split("_")
        ids = [int(x) for x in (tmp_path / "read" / name).read_text().split()]
        counts.update(ids)
        by_pipeline[(replica, tower)] += ids
    return counts, by_pipeline


@pytest.mark.parametrize("strategy", ["AsyncParameterServer", "SyncParameterServer", "SyncAllReduce"])
def test_every_id_is_read_exactly_once_per_epoch(tmp_path, strategy):
    path, cluster = setup(tmp_path, strategy)
    procs = start_all(path, tmp_path, cluster)
    codes = run_all(procs, tmp_path)
    assert set(codes.values()) == {0}, (codes, logs(tmp_path))
    counts, by_pipeline = ids_read(tmp_path)
    assert sorted(counts) == list(range(IDS)) and set(counts.values()) == {1}, counts.most_common(5)
    # Four pipelines (2 replicas x 2 towers), each its own two whole files.
    assert len(by_pipeline) == 4 and all(len(ids) == IDS // 4 for ids in by_pipeline.values())
    for ids in by_pipeline.values():
        assert len({i % FILES for i in ids}) == FILES // 4


def pipelines(sizes: list[int], batch: int) -> list[list[np.ndarray]]:
    """Each of the 4 pipelines' batches of ids, as ctx.shard and batch() make them."""
    starts = np.cumsum([0, *sizes])
    files = [np.arange(a, b) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    if len(files) >= 4:  # whole files: pipeline k reads files k, k + 4, ...
        shares = [np.concatenate(files[k::4]) for k in range(4)]
    else:  # every 4th record of all files
        shares = [np.concatenate(files)[k::4] for k in range(4)]
    return [[share[i : i + batch] for i in range(0, len(share), batch)] for share in shares]


def expected(
    sizes: list[int], batch: int, lr: float, by_replica: bool, accumulate: int = 1, alone: bool = False
) -> tuple[float, np.ndarray]:
    """w and the table after training, by the Join rules: each update, the batches that are still data.

    An update takes `accumulate` batches of each pipeline (micro-batches). By pipeline (all-reduce,
    and the hybrid's dense half): each batch weighs 1 / the batches of the update. By replica (sync
    PS, and the hybrid's tables): 1 / the replicas with data, times 1 / that replica's batches
    (replica r feeds pipelines 2r and 2r + 1); `alone` (async PS: each replica's update is applied
    by itself): 1 / that replica's batches. The gradients do not depend on the weights, so the order
    of async updates does not matter.
    """
    batches = pipelines(sizes, batch)
    w, table = 0.0, np.zeros(IDS)
    for update in range(-(-max(len(b) for b in batches) // accumulate)):
        steps = range(update * accumulate, (update + 1) * accumulate)
        have = [[s for s in steps if s < len(b)] for b in batches]
        mine = [len(have[2 * r]) + len(have[2 * r + 1]) for r in range(2)]
        for p, b in enumerate(batches):
            for s in have[p]:
                if alone:
                    weight = 1 / mine[p // 2]
                elif by_replica:
                    weight = 1 / (sum(1 for t in mine if t) * mine[p // 2])
                else:
                    weight = 1 / sum(mine)
                w -= lr * weight * b[s].mean() / IDS
                table[b[s]] -= lr * weight / len(b[s])
    return w, table


# Micro-batches and runs that outlast a pipeline's data: 3 per update, 2 updates per run.
BOTH = "accumulate_steps=3, steps_per_run=2,"


# CI runs each strategy on uneven files, the overlapped async PS (its transfer loop runs ops of its own)
# on fewer files than pipelines, and the hybrid with micro-batches and runs that outlast a pipeline's
# data; the other cases, repeats of those paths, are in the extended tier (CI's time).
IN_CI = {
    "async-files",
    "async-overlap-records",
    "sync-files",
    "allreduce-files",
    "hybrid-files",
    "hybrid-files-accumulate-per-run",
}
CASES = {
    "async-files": ("AsyncParameterServer", UNEVEN_FILES, 4, "", ""),
    "sync-files": ("SyncParameterServer", UNEVEN_FILES, 4, "", ""),
    # The table as rows (all-gathered), not summed whole: the step in which every pipeline has ended
    # gathers no row from anyone.
    "allreduce-files": ("SyncAllReduce", UNEVEN_FILES, 4, ", densify_below_bytes=0", ""),
    "async-overlap-records": ("AsyncParameterServer", FEWER_FILES, 5, ", overlap=True", ""),
    "sync-backup-records": ("SyncParameterServer", FEWER_FILES, 5, ", backup_workers=1", ""),
    "allreduce-records": ("SyncAllReduce", FEWER_FILES, 5, "", ""),
    "async-overlap-files-accumulate-per-run": (
        "AsyncParameterServer",
        UNEVEN_FILES,
        4,
        ", overlap=True",
        BOTH,
    ),
    "sync-files-accumulate-per-run": ("SyncParameterServer", UNEVEN_FILES, 4, "", BOTH),
    "allreduce-files-accumulate-per-run": ("SyncAllReduce", UNEVEN_FILES, 4, "", BOTH),
    # The table (IDS x 1) on the PS: small tables would stay with the ring's dense half by default.
    "hybrid-files": ("SyncHybrid", UNEVEN_FILES, 4, ", densify_below_bytes=0", ""),
    "hybrid-files-accumulate-per-run": ("SyncHybrid", UNEVEN_FILES, 4, ", densify_below_bytes=0", BOTH),
}


@pytest.mark.parametrize(
    "strategy, sizes, batch, knobs, settings",
    [
        pytest.param(*case, id=name, marks=[] if name in IN_CI else [pytest.mark.extended])
        for name, case in CASES.items()
    ],
)
def test_uneven_inputs_end_every_task_with_every_id_read_once(
    tmp_path, strategy, sizes, batch, knobs, settings
):
    """Pipelines whose data ends first wait with zero weight (Join): nobody hangs, nothing is skipped."""
    path, cluster = setup(
        tmp_path, strategy, sizes=sizes, batch=batch, knobs=knobs, pause=0.0, settings=settings
    )
    codes = run_all(start_all(path, tmp_path, cluster), tmp_path, timeout=180)
    assert set(codes.values()) == {0}, (codes, logs(tmp_path))
    counts, by_pipeline = ids_read(tmp_path)
    assert [i for i, n in counts.items() if n > 1] == [], "an id was trained on twice"
    assert sorted(set(range(IDS)) - set(counts)) == [], "ids left unread"
    if sizes == UNEVEN_FILES:  # pipeline k reads files k and k + 4
        assert sorted(len(ids) for ids in by_pipeline.values()) == [40, 40, 64, 112]
    else:
        assert sorted(len(ids) for ids in by_pipeline.values()) == [64] * 4
    text = logs(tmp_path)
    assert "has ended" in text, text
    said = "files do not divide evenly among 4 pipelines" if sizes == UNEVEN_FILES else "one record in 4"
    assert said in text, text
    if strategy == "SyncParameterServer" and "backup" not in knobs:  # every read batch was applied
        assert "0 stale reports dropped" in text, text
    if "backup" not in knobs:  # every batch read is in the final checkpoint, weighed as the strategy says
        saved = tf.train.load_checkpoint(str(tmp_path / "logdir"))
        ring, tables = strategy in ("SyncAllReduce", "SyncHybrid"), strategy != "SyncAllReduce"
        accumulate, alone = 3 if settings == BOTH else 1, strategy == "AsyncParameterServer"
        w, _ = expected(sizes, batch, 0.01, by_replica=not ring, accumulate=accumulate, alone=alone)
        _, table = expected(sizes, batch, 0.01, by_replica=tables, accumulate=accumulate, alone=alone)
        assert saved.get_tensor("w") == pytest.approx(w, rel=1e-4)
        np.testing.assert_allclose(saved.get_tensor("table")[:, 0], table, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("per_run", extended_beyond([1, 3], {1}))  # three steps per run: extended
def test_a_restarted_replica_goes_on_from_its_saved_position(tmp_path, per_run):
    path, cluster = setup(tmp_path, "AsyncParameterServer", lr=0.001, settings=f"steps_per_run={per_run},")
    procs = start_all(path, tmp_path, cluster)
    task_dir = tmp_path / "logdir" / "tasks" / "worker_1"
    try:
        # Killed once it has saved a position and read more since.
        wait_for_line(tmp_path / "worker_1.log", r"worker/task:1 step \d+ ", timeout=180)
        deadline = time.monotonic() + 60
        while not list(task_dir.glob("input-r2t2-*.index")):
            assert time.monotonic() < deadline, "worker 1 never saved its input position"
            time.sleep(0.05)
        assert procs["worker_1"].poll() is None, "worker 1 ended before it could be killed"
        os.kill(procs["worker_1"].pid, signal.SIGKILL)
        procs["worker_1"].wait()
        procs["worker_1"] = start(path, tmp_path, cluster, "worker", 1, tag="_restarted")
        codes = run_all(procs, tmp_path)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    assert set(codes.values()) == {0}, (codes, logs(tmp_path))
    assert "input position restored from" in (tmp_path / "worker_1_restarted.log").read_text()
    counts, _ = ids_read(tmp_path)
    assert sorted(counts) == list(range(IDS)), "an id was skipped"
    repeated = [i for i, n in counts.items() if n > 1]
    # Only worker 1's ids, and at most what it read between its last save and the kill: the save
    # interval (2 steps, at run boundaries) and the run in flight, 2 towers x BATCH ids each.
    assert all(n == 2 for n in counts.values() if n > 1)
    steps = 3 if per_run == 1 else 2 * per_run
    assert len(repeated) <= steps * 2 * BATCH, sorted(repeated)
    # Worker 1's pipelines are 2 and 3 of 4, and pipeline k reads files k and k + 4.
    assert all(i % FILES in (2, 3, 6, 7) for i in repeated), sorted(repeated)
