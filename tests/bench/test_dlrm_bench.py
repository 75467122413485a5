"""gin/bench/dlrm.gin at tiny size: R measured from its input, and a graph for every strategy to compare."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

import gin
import pytest
import tensorflow as tf

from disttrain.base.cluster import PS, WORKER, Cluster
from disttrain.base.config import TrainConfig
from disttrain.bench import runner
from disttrain.edges import configurables, zoo_run
from disttrain.graph import placement
from disttrain.plan import traffic
from disttrain.strategies import TFDefault
from tests import REPO

DLRM = os.path.join(REPO, "gin", "bench", "dlrm.gin")
TINY = os.path.join(REPO, "gin", "testing", "tiny.gin")
# What the benchmark binds for each strategy it can compare on this config (runner.STRATEGIES).
RUNS = {
    "async_ps": [],
    "async_ps_overlap": ["AsyncParameterServer.overlap=True"],
    "sync_ps": [runner.STRATEGIES["sync_ps"].binding],
    "allreduce": [runner.STRATEGIES["allreduce"].binding],
    "tf_default": [runner.TF_DEFAULT.binding],
}


@contextlib.contextmanager
def parsed(files, bindings=()) -> Iterator[TrainConfig]:
    """The TrainConfig of these gin files, with gin's config live (the optimizer is gin-bound)."""
    configurables.register_all()
    gin.add_config_file_search_path(REPO)
    gin.clear_config()
    try:
        gin.parse_config_files_and_bindings(list(files), list(bindings), skip_unknown=False)
        yield configurables.train_config().validate()
    finally:
        gin.clear_config()


def test_rows_a_tiny_dlrm_step_looks_up():
    with parsed([DLRM, TINY]) as config:
        sizes = traffic.model_bytes(config)
    # Three tables of 100, 50 and 20 rows x 8 float32 (32 bytes a row): 5,440 bytes in all.
    assert [(t.name, t.nbytes, t.row_bytes) for t in sizes.tables] == [
        (f"dlrm/embedding_{c}/table", rows * 32, 32) for c, rows in enumerate((100, 50, 20))
    ]
    # A batch of 8 looks up at most 8 distinct ids per table, at least 1.
    for t in sizes.tables:
        assert 1 <= t.rows_per_step <= 8
    assert 0 < sizes.sparse < sizes.table_bytes
    assert sizes.sparse == sum(t.rows_per_step * (32 + 8) for t in sizes.tables)
    assert sizes.total == 2_468 + 5_440  # the MLPs, 617 float32, and the tables
    assert config.strategy.__name__ == "AsyncParameterServer" and config.batch_size == 8


def test_full_size_is_over_256_mb_of_tables_at_batch_1024():
    with parsed([DLRM]) as config:
        assert config.batch_size == 1024 and (config.intra_op_threads, config.inter_op_threads) == (1, 1)
        assert type(config.optimizer()).__name__ == "AdagradOptimizer"
        specs = placement.collect_variables(config.model.build_variables)
    assert sum(s.nbytes for s in specs if s.table) >= 256 * 2**20


def view(num_ps: int) -> Cluster:
    jobs = {WORKER: ["localhost:1", "localhost:2"], PS: [f"localhost:{i + 3}" for i in range(num_ps)]}
    return Cluster(jobs=jobs, task_type=WORKER, task_index=0)


@pytest.mark.parametrize("run", RUNS, ids=str)
def test_every_strategy_builds(run):
    # The graph each run of the benchmark builds on worker 0, as `zoo_run.dry_run` does.
    num_ps = 0 if run == "allreduce" else 2
    with parsed([DLRM, TINY], RUNS[run]) as config, tf.Graph().as_default():
        strategy = config.strategy(view(num_ps))
        built = zoo_run.build_zoo(view(num_ps), config, strategy)
    assert getattr(strategy, "overlap", False) == (run == "async_ps_overlap")
    if num_ps:
        loads = placement.ps_loads(built.graph, num_ps, include_slots=False)
        assert all(loads), loads


@pytest.mark.parametrize("num_ps", [2, 3])
def test_tf_default_splits_dlrm_tables_round_robin(num_ps):
    with parsed([DLRM, TINY], RUNS["tf_default"]) as config, tf.Graph().as_default():
        strategy = config.strategy(view(num_ps))
        graph = zoo_run.build_zoo(view(num_ps), config, strategy).graph
    assert isinstance(strategy, TFDefault)
    tables = {f"dlrm/embedding_{c}/table" for c in range(3)}
    assert strategy.tables == tables
    ops = [op for op in graph.get_operations() if op.type == "VarHandleOp" and "Adagrad" not in op.name]
    for table in tables:
        parts = [op for op in ops if re.fullmatch(re.escape(table) + r"/part_\d+", op.name)]
        assert len(parts) == num_ps
        assert {tf.DeviceSpec.from_string(op.device).task for op in parts} == set(range(num_ps))
    tasks = [tf.DeviceSpec.from_string(op.device).task for op in ops]
    assert tasks == [(tasks[0] + i) % num_ps for i in range(len(ops))]  # round robin by count
    assert not any("/part_" in op.name for op in ops if "embedding" not in op.name)  # dense whole
