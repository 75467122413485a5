"""A gin experiment's model as the cost model sees it: bytes, pieces per PS, one step's time.

The variables are read from the model's graph built once in a scratch graph,
as placement does (`config.model.build_variables`); disttrain's layout is
`placement.make_plan` on those shapes, TF's is its round robin by count in
creation order (`tf_default`: embedding tables cut into P parts first). R,
the rows a step looks up, comes from the benchmark's own measurement
(`traffic.model_bytes`). No training and no server: building even
ResNet-152's variables takes seconds on a CPU.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import time
from collections.abc import Callable

import tensorflow as tf

from disttrain.base.cluster import PS, WORKER, Cluster
from disttrain.base.config import TrainConfig
from disttrain.graph import placement, schedules
from disttrain.plan import cost, traffic, transports

v1 = tf.compat.v1


def variables(config: TrainConfig) -> tuple[list[placement.VariableSpec], frozenset[str]]:
    """Every variable of the model in creation order, and the names of the trainable ones."""
    with tf.Graph().as_default() as graph:
        config.model.build_variables()
        trainable = frozenset(v.op.name for v in v1.trainable_variables())
        return placement.variable_specs(graph), trainable


def disttrain_layout(
    specs: list[placement.VariableSpec], trainable: frozenset[str], ps: int, max_imbalance: float = 0.05
) -> cost.PsLayout:
    """disttrain's plan: each PS's share of the dense trainable bytes and its pieces (tables apart: R)."""
    plan = placement.make_plan(specs, ps, max_imbalance)
    dense = [0] * ps
    pieces = [0] * ps
    for spec in specs:
        if spec.name not in trainable or spec.table:
            continue
        axis, parts = plan.parts.get(spec.name, (0, 1))
        for piece in placement.spec_pieces(spec, axis, parts):
            dense[plan.devices[piece.name]] += piece.nbytes
            pieces[plan.devices[piece.name]] += 1
    return _layout(dense, pieces, plan.max_over_mean)


def round_robin_layout(
    specs: list[placement.VariableSpec], trainable: frozenset[str], ps: int
) -> cost.PsLayout:
    """TF's `replica_device_setter`: the i-th variable op created goes to PS i mod P, whatever its size.

    Tables are created as P parts (tf_default's fixed_size_partitioner), dealt
    in turn like any variable. Checked against the real device setter in
    tests/unit/test_plan.py.
    """
    dealt = itertools.count()
    return _dealt_layout(specs, trainable, ps, lambda loads: next(dealt) % ps)


def greedy_layout(specs: list[placement.VariableSpec], trainable: frozenset[str], ps: int) -> cost.PsLayout:
    """TF 1's greedy placement: each variable op, as created, on the least-loaded PS.

    `GreedyLoadBalancingStrategy(ps, byte_size_load_fn)`: load is bytes;
    ties go to the lowest task (TF's `min` over the loads).
    tf_cnn_benchmarks' parameter_server mode placed variables so
    (VariableMgrDistributedFetchFromPS, tensorflow/benchmarks at abe3c80). A
    variable is never split: one larger than the rest still lands whole on
    one PS. Tables are P parts, dealt like any variable.
    """
    return _dealt_layout(specs, trainable, ps, lambda loads: min(range(ps), key=lambda j: loads[j]))


def _dealt_layout(
    specs, trainable: frozenset[str], ps: int, choose: Callable[[list[int]], int]
) -> cost.PsLayout:
    """Each variable op in creation order (a table as P parts) on the task `choose(loads)` names."""
    loads, dense, pieces = [0] * ps, [0] * ps, [0] * ps
    for spec in specs:
        parts = ps if spec.table else 1
        size = spec.nbytes // parts
        for _ in range(parts):
            task = choose(loads)
            loads[task] += size
            if spec.name in trainable and not spec.table:
                dense[task] += size
                pieces[task] += 1
    return _layout(dense, pieces, placement.max_over_mean(loads))


def _layout(dense: list[int], pieces: list[int], balance: float) -> cost.PsLayout:
    total = sum(dense)
    shares = tuple(d / total for d in dense) if total else tuple(1 / len(dense) for _ in dense)
    return cost.PsLayout(shares, tuple(pieces), balance)


def model_from_config(config: TrainConfig, step_time: float, name: str | None = None) -> cost.Model:
    """The cost model's view of `config`'s model at its batch size, one GPU step taking `step_time`."""
    specs, trainable = variables(config)
    tables = ()
    if any(s.table for s in specs):
        sizes = traffic.model_bytes(config)  # measures R from the input pipeline
        dense, rows = sizes.dense, sizes.sparse
        tables = tuple((t.nbytes, t.bytes_per_step) for t in sizes.tables)
    else:
        dense, rows = sum(s.nbytes for s in specs if s.name in trainable), 0.0

    @functools.cache
    def layout(ps: int, kind: str) -> cost.PsLayout:
        if kind == cost.ROUND_ROBIN:
            return round_robin_layout(specs, trainable, ps)
        if kind == cost.GREEDY:
            return greedy_layout(specs, trainable, ps)
        return disttrain_layout(specs, trainable, ps)

    return cost.Model(
        name=name or type(config.model).__name__,
        dense_bytes=dense,
        sparse_bytes=rows,
        tables=tables,
        step_time=step_time,
        batch_size=config.batch_size,
        layout=layout,
        tensors=sum(1 for s in specs if s.name in trainable and not s.table),
    )


def measure_step_time(config: TrainConfig, steps: int = 5, warmup: int = 2) -> float:
    """One process's step time here (median of `steps`), with the config's model, input, optimizer and batch.

    Runs in a scratch graph with the config's thread counts (0: TF's default);
    no cluster, no checkpoint. The planner divides it by the user's speed factor.
    """
    if steps < 1:
        raise cost.PlanError(f"need at least 1 measured step, got {steps}")
    model = config.model
    # One process: its batch is the global batch (for a recipe's scaled learning rate).
    with tf.Graph().as_default(), schedules.global_batch(config.batch_size):
        dataset = config.input_fn(model, config.batch_size, 0, 1)
        features, labels = v1.data.make_one_shot_iterator(dataset).get_next()
        loss = model.training_loss(features, labels, config.regularization)
        train_op = config.optimizer().minimize(loss, global_step=v1.train.get_or_create_global_step())
        session_config = v1.ConfigProto(
            intra_op_parallelism_threads=config.intra_op_threads,
            inter_op_parallelism_threads=config.inter_op_threads,
        )
        with v1.Session(config=session_config) as session:
            session.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            for _ in range(warmup):
                session.run(train_op)
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                session.run(train_op)
                times.append(time.perf_counter() - start)
    return statistics.median(times)


def strategy_from_config(
    config: TrainConfig, kind: str, placement_kind: str = cost.DISTTRAIN
) -> cost.Strategy:
    """The settings of `config.strategy` (as gin bound them) for the cost model.

    Builds the strategy once for a stand-in cluster of 64 replicas (and one PS
    when it uses PS) to read the settings its class names in `knobs`; nothing
    starts. A knob the cost model has no field for is left out; a setting the
    strategy has no knob for keeps the cost model's default. The cost model
    checks the settings against the planned cluster (backup workers < workers).
    The transport is what disttrain uses on GPUs: gRPC for PS and for
    all-reduce's 'auto' and 'ring' hints, NCCL (over TCP) for the 'nccl' hint.
    """
    jobs = {WORKER: [f"localhost:{i + 1}" for i in range(64)]}
    if kind != cost.ALLREDUCE:
        jobs[PS] = ["localhost:100"]
    built = config.strategy(Cluster(jobs=jobs, task_type=WORKER, task_index=0))
    settings = {}
    for knob in type(built).knobs:
        if knob in _KNOBS:
            field, convert = _KNOBS[knob]
            settings[field] = convert(getattr(built, knob))
    return cost.Strategy(kind=kind, placement=placement_kind, **settings)


# Strategy knob -> (cost.Strategy field, the knob's value as that field wants it).
_KNOBS = {
    "overlap": ("overlap", bool),
    "piece_bytes": ("piece_bytes", lambda b: b),
    "bucket_bytes": ("bucket_bytes", int),
    "transfer_dtype": ("transfer_bits", lambda dtype: 16 if dtype is not None and dtype.size == 2 else 32),
    "backup_workers": ("backup_workers", int),
    "densify_below_bytes": ("densify_below_bytes", int),
    "communication_hint": ("transport", lambda hint: transports.NCCL_TCP if hint == "nccl" else None),
}
