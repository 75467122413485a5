"""Embedding tables in every strategy, on built graphs and in-process: rows move, tables never do.

The model is what a user would write: a `get_variable` table looked up with
`tf.nn.embedding_lookup` (ids repeated in the batch), a dense layer, Adagrad;
or the same with the table a Keras 3 `Embedding` layer, whose lookups
`sparse.gather_on_tables` moves onto the table.
"""

import itertools
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from disttrain import AsyncParameterServer, Cluster, SyncAllReduce, SyncParameterServer
from disttrain.base.errors import ConfigError
from disttrain.edges.local import free_port
from disttrain.graph import placement
from disttrain.graph.optimizers import LazyAdamOptimizer
from disttrain.strategies import allreduce, sparse, sync_ps, transfer

v1 = tf.compat.v1

ROWS, DIM = 1000, 8
KERAS_ROWS = 10_000  # 320 KB: above sparse.READ_WHOLE_MAX_BYTES, so looked up by rows
IDS = [[1, 5, 5, 999], [3, 3, 3, 500]]


def ps_cluster(num_ps=2, task=0):
    return Cluster.from_hosts("worker", task, [f"p{i}:1" for i in range(num_ps)], ["w0:1", "w1:1"])


def loss_fn(lookup=tf.nn.embedding_lookup, initial=None):
    """The get_variable model; `initial`: the table's first values (default: TF's initializer)."""

    def build():
        init = None if initial is None else v1.constant_initializer(initial)
        table = v1.get_variable("emb", [ROWS, DIM] if initial is None else initial.shape, initializer=init)
        return head(lookup(table, tf.constant(IDS, tf.int64)), seeded=initial is not None)

    return build


def keras_loss_fn(initial=None):
    """The same model with the table a Keras 3 Embedding: one layer, built by the first call, shared."""
    init = "uniform" if initial is None else keras.initializers.Constant(initial)
    layer = keras.layers.Embedding(KERAS_ROWS, DIM, embeddings_initializer=init, name="emb")

    def build():
        return head(layer(tf.constant(IDS, tf.int64)), seeded=initial is not None)

    return build


def head(rows, seeded=False):
    x = tf.reduce_sum(rows, axis=1)
    w = v1.get_variable("w", [DIM, 1], initializer=v1.constant_initializer(0.1) if seeded else None)
    return tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))


MODELS = {"embedding_lookup": loss_fn, "keras": keras_loss_fn}


STRATEGIES = {
    "async": lambda: AsyncParameterServer(ps_cluster()),
    "async_overlap": lambda: AsyncParameterServer(ps_cluster(), overlap=True),
    "async_two_towers": lambda: AsyncParameterServer(ps_cluster(), num_towers=2),
    "sync_ps": lambda: SyncParameterServer(ps_cluster()),
    "allreduce": lambda: SyncAllReduce(ps_cluster(num_ps=0), densify_below_bytes=0),
}


def build(make, lookup=tf.nn.embedding_lookup, model=None):
    graph = tf.Graph()
    with graph.as_default():
        strategy = make()
        with strategy.scope():
            train_op = strategy.minimize(v1.train.AdagradOptimizer(0.1), model or loss_fn(lookup))
    return graph, strategy, train_op


def step_fetches(strategy, train_op) -> list:
    """Everything a step of this replica and its helpers run: transfer loop, sync update."""
    fetches = [train_op]
    if getattr(strategy, "transfer_op", None) is not None:
        fetches.append(strategy.transfer_op)
    if isinstance(strategy, SyncParameterServer):
        fetches += strategy.made.sync.update_and_release  # the chief's update
    return fetches


def table_parts(graph) -> list[tf.Operation]:
    return [
        op
        for op in graph.get_operations()
        if op.type == "VarHandleOp" and re.fullmatch(r"emb(/part_\d+)?|(tower_0/)?emb/embeddings", op.name)
    ]


def ancestors(fetches) -> set[tf.Operation]:
    ops = set()
    for fetch in fetches:
        ops |= transfer.ancestors([fetch if isinstance(fetch, tf.Operation) else fetch.op])
    return ops


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_no_op_of_a_step_reads_a_whole_table_and_updates_are_sparse(name, model):
    graph, strategy, train_op = build(STRATEGIES[name], model=MODELS[model]())
    parts = table_parts(graph)
    assert parts
    step = ancestors(step_fetches(strategy, train_op))
    handles = {p.outputs[0].name for p in parts}
    reads = [op for op in step if op.type == "ReadVariableOp" and op.inputs[0].name in handles]
    assert not reads, f"a step reads a whole table: {[op.name for op in reads]}"
    gathers = [op for op in step if op.type == "ResourceGather" and op.inputs[0].name in handles]
    assert gathers, "the step looks rows up in the table itself"
    for gather in gathers:
        assert gather.device == gather.inputs[0].op.device, "a lookup gathers where its part is"
    sparse_updates = {op.inputs[0].name for op in step if op.type == "ResourceSparseApplyAdagrad"}
    assert handles <= sparse_updates, "every part of the table gets a sparse update"
    dense_updates = {op.inputs[0].name for op in step if op.type == "ResourceApplyAdagrad"}
    assert not handles & dense_updates
    if strategy.uses_ps:  # no worker-side copy of a table (the overlap mode copies dense variables)
        copies = [
            op.name
            for op in graph.get_operations()
            if op.type == "VarHandleOp"
            and tf.DeviceSpec.from_string(op.device).job == "worker"
            and [d.size for d in op.get_attr("shape").dim][-1:] == [DIM]
        ]
        assert not copies


@pytest.mark.parametrize("name", ["async", "sync_ps"])
def test_tables_are_split_by_rows_across_the_ps_and_reported_apart(name):
    graph, strategy, _ = build(STRATEGIES[name])
    assert strategy.plan.tables == {"emb"} and strategy.plan.parts["emb"] == (0, 2)
    tasks = sorted(tf.DeviceSpec.from_string(p.device).task for p in table_parts(graph))
    assert tasks == [0, 1]
    text = placement.report(graph, 2)
    assert "MiB in embedding tables" in text and text.count("tables ") == 2


def test_sync_ps_accumulates_table_gradients_as_rows_on_the_ps():
    graph, _, _ = build(STRATEGIES["sync_ps"])
    sparse_accs = [op for op in graph.get_operations() if op.type == "SparseConditionalAccumulator"]
    assert len(sparse_accs) == 2
    assert {tf.DeviceSpec.from_string(op.device).job for op in sparse_accs} == {"ps"}
    dense_shapes = [
        [d.size for d in op.get_attr("shape").dim]
        for op in graph.get_operations()
        if op.type == "ResourceConditionalAccumulator"
    ]
    assert all(not s or s[0] != ROWS // 2 for s in dense_shapes)


def test_allreduce_sums_no_table_densely():
    graph, _, _ = build(STRATEGIES["allreduce"])
    reduced = sum(
        op.inputs[0].shape.num_elements()
        for op in graph.get_operations()
        if op.type == "CollectiveReduceV2" and "preemption_vote" not in op.name
    )
    assert reduced == DIM + 2  # w's gradient alone, and the step's vote riding beside it
    assert [op for op in graph.get_operations() if op.type == "CollectiveGather"]


def test_allreduce_densifies_only_tables_below_the_threshold():
    graph, _, _ = build(lambda: SyncAllReduce(ps_cluster(num_ps=0)))  # 32 KB table, under 256 KiB
    assert not [op for op in graph.get_operations() if op.type == "CollectiveGather"]


def test_a_mod_lookup_of_a_split_table_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"emb .*partition_strategy='mod': use tf.nn.embedding_lookup"):
        build(STRATEGIES["async"], lookup=v1.nn.embedding_lookup)
    build(lambda: AsyncParameterServer(ps_cluster(num_ps=1)), lookup=v1.nn.embedding_lookup)  # not split


def test_a_planned_split_table_finds_id_i_in_row_i():
    spec = placement.VariableSpec("t", (10, 4), 4, table=True)
    plan = placement.make_plan([spec], 3)
    assert plan.parts["t"] == (0, 3)
    ids = [0, 3, 4, 7, 9, 9]
    with tf.Graph().as_default():
        with v1.variable_scope("", custom_getter=placement.partitioning_getter(plan)):
            table = v1.get_variable("t", [10, 4], initializer=v1.random_normal_initializer(seed=1))
        assert len(list(table)) == 3
        rows = tf.nn.embedding_lookup(table, tf.constant(ids))
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            got, full = session.run([rows, tf.concat(list(table), axis=0)])
    np.testing.assert_array_equal(got, full[ids])


def test_tables_split_by_rows_and_no_piece_exceeds_one_grpc_message():
    wide = placement.make_plan(
        [placement.VariableSpec("t", (10, 1000), 4, table=True), placement.VariableSpec("d", (10, 1000), 4)],
        4,
    )
    assert wide.parts["t"][0] == 0 and wide.parts["d"][0] == 1
    huge = placement.make_plan([placement.VariableSpec("t", (3 * 2**26, 4), 4, table=True)], num_ps=1)
    assert huge.parts["t"] == (0, 2)  # 3 GiB on one PS: two pieces of 1.5 GiB


def dense(indexed, shape) -> np.ndarray:
    """A sparse gradient's value (indices, values) as the dense array it stands for."""
    out = np.zeros(shape, np.float32)
    np.add.at(out, np.asarray(indexed.indices), np.asarray(indexed.values))
    return out


def slices(rows: dict, shape):
    return tf.IndexedSlices(
        tf.constant([rows[i] for i in rows], tf.float32),
        tf.constant(list(rows), tf.int64),
        tf.constant(shape, tf.int64),
    )


def test_sync_sparse_mean_divides_by_gradients_not_by_rows_and_drops_stale_ones():
    shape = [4, 2]
    with tf.Graph().as_default():
        var = v1.get_variable("v", shape)
        acc = sync_ps._SparseMean(var)  # noqa: SLF001
        g1 = acc.apply(slices({0: [1, 1], 1: [2, 2]}, shape), tf.constant(0, tf.int64))
        g2 = acc.apply(slices({1: [4, 4], 3: [6, 6]}, shape), tf.constant(0, tf.int64))
        stale = acc.apply(slices({2: [9, 9]}, shape), tf.constant(0, tf.int64))
        fresh = acc.apply(slices({2: [8, 8]}, shape), tf.constant(1, tf.int64))
        take2, take1 = acc.take(2), acc.take(1)
        with v1.Session() as session:
            session.run([g1, g2])
            mean = session.run(take2)  # the accumulator's step is now 1
            session.run([stale, fresh])
            later = session.run(take1)
    # Row 0 was in one gradient of two: its mean is half of it (TF's MEAN would give all of it).
    np.testing.assert_allclose(dense(mean, shape), [[0.5, 0.5], [3, 3], [0, 0], [3, 3]])
    np.testing.assert_allclose(dense(later, shape), [[0, 0], [0, 0], [8, 8], [0, 0]])


def test_all_gather_mean_of_rows_of_different_counts_is_exact_on_every_replica():
    shape = [6, 3]
    rng = np.random.default_rng(0)
    replicas = [({0: 1, 2: 1, 5: 1}, {1: 1}), ({2: 1, 4: 1}, {0: 1, 1: 1, 3: 1, 5: 1})]
    values = [[{i: rng.normal(size=3).tolist() for i in rows} for rows in tables] for tables in replicas]
    with tf.Graph().as_default() as graph:
        outs = []
        for device, tables in enumerate(values):
            with tf.device(f"/device:CPU:{device}"):
                grads = [slices(rows, shape) for rows in tables]
                outs.append(allreduce.all_gather_mean(grads, 2, instance_keys=itertools.count(1)))
        assert len([op for op in graph.get_operations() if op.type == "CollectiveGather"]) == 2 * 3
        with v1.Session(config=v1.ConfigProto(device_count={"CPU": 2})) as session:
            got = session.run(outs)
    for table in range(2):
        want = np.zeros(shape)
        for r in range(2):
            for row, value in values[r][table].items():
                want[row] += np.asarray(value) / 2
        for replica in range(2):
            np.testing.assert_allclose(dense(got[replica][table], shape), want, rtol=1e-6)


def adam_run(optimizer, ids_per_step, steps=3):
    """A 6 x 2 table trained on the sum of the looked-up rows; the table after `steps` steps."""
    with tf.Graph().as_default():
        table = v1.get_variable(
            "t", [6, 2], initializer=v1.constant_initializer(np.arange(12.0).reshape(6, 2))
        )
        ids = v1.placeholder(tf.int64, [None])
        train = optimizer.minimize(tf.reduce_sum(tf.square(tf.nn.embedding_lookup(table, ids))))
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            for step in range(steps):
                session.run(train, {ids: ids_per_step[step % len(ids_per_step)]})
            return session.run(table)


def test_lazy_adam_is_adam_on_the_rows_it_sees_and_leaves_the_others_alone():
    every_row = [[0, 1, 2, 3, 4, 5]]
    np.testing.assert_allclose(
        adam_run(LazyAdamOptimizer(0.1), every_row),
        adam_run(v1.train.AdamOptimizer(0.1), every_row),
        rtol=1e-6,
    )
    some = adam_run(LazyAdamOptimizer(0.1), [[1, 3, 3]])
    np.testing.assert_array_equal(some[[0, 2, 4, 5]], np.arange(12.0).reshape(6, 2)[[0, 2, 4, 5]])
    assert not np.allclose(some[[1, 3]], np.arange(12.0).reshape(6, 2)[[1, 3]])
    # TF's Adam moves rows no step looked up once their moments are non-zero: row 1 after steps on row 3.
    dense_adam = adam_run(v1.train.AdamOptimizer(0.1), [[1], [3]], steps=3)
    lazy = adam_run(LazyAdamOptimizer(0.1), [[1], [3]], steps=3)
    assert not np.allclose(dense_adam[1], lazy[1])


def test_overlap_in_one_process_copies_no_table_either():
    graph, strategy, _ = build(lambda: AsyncParameterServer(Cluster.local(), overlap=True))
    assert strategy.tables == {"emb"} and strategy.plan is None
    shapes = [
        [d.size for d in op.get_attr("shape").dim]
        for op in graph.get_operations()
        if op.type == "VarHandleOp"
    ]
    assert shapes.count([ROWS, DIM]) == 2  # the table and its Adagrad accumulator, no copy
    assert [DIM, 1] in shapes and shapes.count([DIM, 1]) == 3  # w, its accumulator and w's copy


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("name", ["async", "async_overlap", "async_two_towers", "sync_ps"])
def test_no_round_trip_to_a_ps_in_a_step_but_the_lookup(name, model):
    """What a worker sends a PS comes back only as looked-up rows: the gradient of the rows is not
    computed on the table's PS (TF 2's tf.gradients colocates gradients with the gather there)."""
    graph, strategy, train_op = build(STRATEGIES[name], model=MODELS[model]())
    step = ancestors(step_fetches(strategy, train_op))

    def job(op):
        return tf.DeviceSpec.from_string(op.device).job

    for op in step:
        if job(op) != "ps" or op.type == "ResourceGather":
            continue
        if not any(job(t.op) == "worker" and t.dtype != tf.resource for t in op.inputs):
            continue
        todo, seen = [op], {op}
        while todo:  # forward through this PS's ops: none may feed the worker
            for consumer in {c for t in todo.pop().outputs for c in t.consumers()} & step - seen:
                seen.add(consumer)
                assert job(consumer) == "ps", f"{op.name} on a PS takes the worker's tensor and returns it"
                todo.append(consumer)


@pytest.mark.parametrize("num_ps", [2, 3])
def test_every_ps_holds_a_share_of_every_table_so_lookups_balance_too(num_ps):
    # Tables of very different sizes: by bytes alone the medium ones would sit whole on one PS,
    # which then serves most of the distinct rows a step looks up.
    sizes = [140_000, 140_000, 93_145, 14_992, 5_683, 583, 24]
    specs = [placement.VariableSpec(f"t{i}", (rows, 64), 4, table=True) for i, rows in enumerate(sizes)]
    specs.append(placement.VariableSpec("dense", (512, 256), 4))
    plan = placement.make_plan(specs, num_ps)
    for i in range(len(sizes) - 1):
        axis, parts = plan.parts[f"t{i}"]
        assert axis == 0 and parts == num_ps
        assert sorted(plan.devices[f"t{i}/part_{p}"] for p in range(parts)) == list(range(num_ps))
    assert "t6" not in plan.parts  # 24 rows: whole, placed by bytes
    assert plan.max_over_mean <= 1.05


# ---- Keras 3 Embedding: lookups moved onto the table ------------------------------------------


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_keras_tables_gradient_is_rows(name):
    with tf.Graph().as_default():
        strategy = STRATEGIES[name]()
        with strategy.scope():
            pairs = strategy.compute_gradients(v1.train.AdagradOptimizer(0.1), keras_loss_fn())
    grads = {v.op.name.removeprefix("tower_0/"): g for g, v in pairs}
    assert isinstance(grads["emb/embeddings"], tf.IndexedSlices)
    assert grads["emb/embeddings"].values.shape[-1] == DIM and not isinstance(grads["w"], tf.IndexedSlices)


def test_only_plain_reads_gathered_by_rows_are_moved_and_every_consumer_follows():
    with tf.Graph().as_default() as graph:
        var = v1.get_variable("t", [6, 2], initializer=v1.constant_initializer(np.arange(12.0).reshape(6, 2)))
        ids = tf.constant([4, 1, 4])
        kept, read = var.value(), var.value()  # two reads (ReadVariableOp)
        left = [
            tf.gather(kept, ids),  # a read the caller keeps (a worker-side copy)
            tf.gather(tf.cast(read, tf.float64), ids),  # a cast between read and gather
            tf.gather(read, [1], axis=1),  # not rows
        ]
        moved = tf.gather(read, ids)
        consumers = [moved + 1.0, tf.reduce_sum(moved)]
        assert sparse.gather_on_tables(graph.get_operations()) == 0  # 48 bytes: read whole
        assert sparse.gather_on_tables(graph.get_operations(), keep=[kept], min_bytes=0) == 1
        assert [c.op.inputs[0].op.type for c in consumers] == ["ResourceGather", "ResourceGather"]
        assert all(t.op.type == "GatherV2" for t in left) and not moved.consumers()
        assert sparse.gather_on_tables(graph.get_operations(), min_bytes=0) == 0  # nothing left to move
        with v1.Session() as session:
            session.run(var.initializer)
            got = session.run(consumers)
    np.testing.assert_array_equal(got[0], np.arange(12.0).reshape(6, 2)[[4, 1, 4]] + 1)


@pytest.fixture(scope="module")
def servers():
    """An in-process PS and a worker with two CPU devices (for two towers); their hosts."""
    hosts = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    spec = tf.train.ClusterSpec({"ps": hosts[:1], "worker": hosts[1:]})
    two_cpus = v1.ConfigProto(device_count={"CPU": 2})
    ps, worker = (tf.distribute.Server(spec, job, 0, config=two_cpus) for job in ("ps", "worker"))
    return worker.target, Cluster.from_hosts("worker", 0, hosts[:1], hosts[1:])


IN_PROCESS = {
    "async": lambda cluster: AsyncParameterServer(cluster),
    "async_overlap": lambda cluster: AsyncParameterServer(cluster, overlap=True),
    "async_two_towers": lambda cluster: AsyncParameterServer(cluster, num_towers=2),
    "sync_ps": lambda cluster: SyncParameterServer(cluster),  # one replica: applied directly
    "allreduce_two_towers": lambda _: SyncAllReduce(Cluster.local(), num_towers=2),  # no PS
}


def trained(make, model, target, steps=3) -> tuple[list, np.ndarray, np.ndarray]:
    """Train `model` for `steps` steps with Adagrad; return its losses, table and w."""
    with tf.Graph().as_default():
        strategy = make()
        with strategy.scope():
            train_op = strategy.minimize(v1.train.AdagradOptimizer(0.1), model)
        table = next(v for v in v1.trainable_variables() if v.shape == (KERAS_ROWS, DIM))
        w = next(v for v in v1.trainable_variables() if v.shape == (DIM, 1))
        init, scaffold = v1.global_variables_initializer(), strategy.scaffold()
        scaffold.finalize()
        with v1.Session(target if strategy.uses_ps else "", config=strategy.session_config()) as session:
            session.run([init, scaffold.local_init_op])
            losses = []
            for _ in range(steps):
                losses.append(session.run([strategy.loss, train_op])[0])
                if getattr(strategy, "transfer_op", None) is not None:
                    session.run(strategy.transfer_op)
            return losses, *session.run([table, w])


@pytest.mark.parametrize("name", sorted(IN_PROCESS))
def test_a_keras_table_trains_exactly_as_a_get_variable_table(servers, name):
    target, cluster = servers
    initial = np.random.default_rng(0).normal(size=(KERAS_ROWS, DIM)).astype(np.float32)
    keras_run = trained(lambda: IN_PROCESS[name](cluster), keras_loss_fn(initial), target)
    lookup_run = trained(lambda: IN_PROCESS[name](cluster), loss_fn(initial=initial), target)
    for got, want in zip(keras_run, lookup_run, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert not np.allclose(keras_run[1], initial)  # training moved the looked-up rows
    np.testing.assert_array_equal(keras_run[1][0], initial[0])  # and no other
