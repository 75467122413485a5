"""DLRM, its embedding layer and its click inputs, on real TF graphs in one process."""

import numpy as np
import pytest
import tensorflow as tf

import model_zoo
from disttrain.graph import placement
from model_zoo import inputs, layers

v1 = tf.compat.v1

TINY = dict(vocab_sizes=(100, 50, 20), embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(16,))


def tiny_dlrm():
    return model_zoo.get("dlrm")(**TINY)


def batches(model, count, **kwargs):
    """The first `count` batches of criteo_synthetic as numpy ((dense, ids), labels)."""
    with tf.Graph().as_default():
        batch = v1.data.make_one_shot_iterator(inputs.criteo_synthetic(model, 64, **kwargs)).get_next()
        with v1.Session() as session:
            return [session.run(batch) for _ in range(count)]


def test_default_size():
    # 26 tables, Criteo Kaggle's vocabularies capped at 140,000: 1,120,543 rows x 64 float32.
    # MLPs: bottom 13-512-256-64 (154,944); top (27*26/2 + 64 = 415)-512-256-1 (344,577).
    specs = placement.collect_variables(model_zoo.get("dlrm")().build_variables)
    tables = [s for s in specs if s.table]
    assert len(tables) == 26 and sum(s.shape[0] for s in tables) == 1_120_543
    assert sum(s.nbytes for s in tables) == 286_859_008
    assert sum(s.nbytes for s in specs if not s.table) == 4 * 499_521
    assert sum(int(np.prod(s.shape)) for s in specs) == 72_214_273
    assert sum(s.nbytes for s in specs) == 288_857_092


def test_bottom_mlp_must_end_in_embedding_dim():
    with pytest.raises(ValueError, match=r"bottom_mlp=\(16, 4\) must end in embedding_dim=8"):
        model_zoo.get("dlrm")(**{**TINY, "bottom_mlp": (16, 4)})


def test_lookups_name_the_built_tables():
    model = tiny_dlrm()
    with tf.Graph().as_default() as graph:
        model.build_variables()
        tables = {s.name for s in placement.variable_specs(graph) if s.table}
        trainable = {v.op.name for v in v1.trainable_variables()}
        ids = tf.constant([[1, 2, 3]], tf.int64)
        found = model.lookups((tf.zeros([1, 13]), ids))
    assert set(found) == tables == {f"dlrm/embedding_{c}/table" for c in range(3)}
    assert tables <= trainable
    with v1.Session(graph=graph) as session:
        assert session.run(found["dlrm/embedding_2/table"]).tolist() == [3]


def test_table_gradients_are_rows_of_distinct_ids():
    model = tiny_dlrm()
    ids = np.array([[7, 1, 3], [7, 2, 3], [9, 1, 3], [7, 1, 0]])
    with tf.Graph().as_default():
        logits = model((tf.ones([4, 13]), tf.constant(ids, tf.int64)), training=True)
        loss = model.loss(logits, tf.constant([1, 0, 1, 0]))
        names = sorted(model.lookups((None, ids)))
        tables = [v for v in v1.trainable_variables() if v.op.name in names]
        grads = tf.gradients(loss, tables)
        assert all(isinstance(g, tf.IndexedSlices) for g in grads)
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            indices = session.run([g.indices for g in grads])
    for column, rows in enumerate(indices):
        assert sorted(rows.tolist()) == sorted(set(ids[:, column].tolist()))  # each id once


def values_by_row(values):
    """An initializer with these values whole, or the rows of a part of a partitioned variable."""

    def init(shape, dtype=None, partition_info=None):
        begin = partition_info.var_offset[0] if partition_info is not None else 0
        return tf.constant(values[begin : begin + shape[0]], dtype=dtype)

    return init


def test_partitioned_table_looks_up_the_same_rows():
    # Parts of 4, 3 and 3 rows: a "div" lookup finds id i in row i; a "mod" one would not.
    values = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    ids = np.array([[9, 0, 3], [3, 4, 9], [5, 6, 7], [8, 1, 2]])
    with tf.Graph().as_default():
        with v1.variable_scope("split", partitioner=v1.fixed_size_partitioner(3)):
            split = layers.embedding(tf.constant(ids), 10, 4, "emb", initializer=values_by_row(values))
        whole = layers.embedding(tf.constant(ids), 10, 4, "emb", initializer=values_by_row(values))
        parts = [v for v in v1.global_variables() if v.op.name.startswith("split/emb/table/part_")]
        assert [p.shape[0] for p in parts] == [4, 3, 3]
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            split, whole = session.run([split, whole])
    assert split.shape == (4, 3, 4)
    np.testing.assert_array_equal(split, whole)
    np.testing.assert_array_equal(whole, values[ids])


def test_tiny_dlrm_learns_criteo_synthetic():
    model = tiny_dlrm()
    with tf.Graph().as_default():
        v1.set_random_seed(0)
        features, labels = v1.data.make_one_shot_iterator(inputs.criteo_synthetic(model, 128)).get_next()
        train = v1.train.AdagradOptimizer(0.1).minimize(model.loss(model(features, training=True), labels))
        # Held out: replica 1's batches (the same labelling function, other examples).
        held_out = inputs.criteo_synthetic(model, 1024, replica_index=1).take(1).repeat()
        features, labels = v1.data.make_one_shot_iterator(held_out).get_next()
        with v1.variable_scope(v1.get_variable_scope(), reuse=True):
            logits = model(features, training=False)
        metrics = [model.loss(logits, labels), model.accuracy(logits, labels)]
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            loss_before, _ = session.run(metrics)
            for _ in range(200):
                session.run(train)
            loss_after, accuracy = session.run(metrics)
    assert loss_after < 0.9 * loss_before, (loss_before, loss_after)
    assert accuracy > 0.78  # a quarter clicks: always "no" scores about 0.76


def test_criteo_synthetic_batches():
    model = tiny_dlrm()
    first = batches(model, 3)
    again = batches(model, 3)
    other = batches(model, 1, replica_index=1)
    for ((dense, ids), labels), ((dense2, ids2), labels2) in zip(first, again, strict=True):
        np.testing.assert_array_equal(ids, ids2)  # a pure function of the seed
        np.testing.assert_array_equal(dense, dense2)
        np.testing.assert_array_equal(labels, labels2)
        assert dense.shape == (64, 13) and dense.dtype == np.float32 and (dense > 0).all()
        assert ids.shape == (64, 3) and ids.dtype == np.int64
        assert ((ids >= 0) & (ids < np.array(TINY["vocab_sizes"]))).all()
        assert set(np.unique(labels)) == {0, 1}
    assert not np.array_equal(first[0][0][1], first[1][0][1])  # new ids every batch
    assert not np.array_equal(first[0][0][1], other[0][0][1])  # and every replica
    assert not np.array_equal(first[0][0][1], batches(model, 1, seed=1)[0][0][1])


def test_criteo_synthetic_ids_follow_a_power_law():
    model = model_zoo.get("dlrm")(**{**TINY, "vocab_sizes": (100_000,)})
    ids = np.concatenate([ids[:, 0] for (_, ids), _ in batches(model, 16)])  # 1024 ids
    distinct, counts = np.unique(ids, return_counts=True)
    # Uniform ids would be ~1019 distinct; these have a few hot rows and a long tail.
    assert len(distinct) < 0.8 * len(ids) and counts.max() > 20
    assert ids.max() > 10_000  # the hot rows are spread over the table, not the first rows


def write_clicks(path, rows):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(rows):
            feature = {
                "dense": tf.train.Feature(float_list=tf.train.FloatList(value=[float(i)] * 13)),
                "categorical": tf.train.Feature(int64_list=tf.train.Int64List(value=[i, 50 + i, 1000 + i])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def test_criteo_tfrecord_reads_records(tmp_path):
    write_clicks(tmp_path / "clicks.tfrecord", 6)
    model = tiny_dlrm()
    pattern = str(tmp_path / "*.tfrecord")
    with tf.Graph().as_default():
        dataset = inputs.criteo_tfrecord(model, 4, file_pattern=pattern, shuffle_buffer=0)
        (dense, ids), labels = v1.data.make_one_shot_iterator(dataset).get_next()
        with v1.Session() as session:
            dense, ids, labels = session.run([dense, ids, labels])
    np.testing.assert_array_equal(dense, np.repeat(np.arange(4.0), 13).reshape(4, 13))
    assert ids.tolist() == [[i, i, (1000 + i) % 20] for i in range(4)]  # modulo each vocabulary
    assert labels.tolist() == [0, 1, 0, 1] and labels.dtype == np.int32


def test_accuracy_of_binary_and_class_logits():
    with tf.Graph().as_default(), v1.Session() as session:
        binary = tiny_dlrm().accuracy(tf.constant([2.0, -1.0, 0.5, -3.0]), tf.constant([1, 0, 0, 1]))
        classes = model_zoo.get("mlp")().accuracy(tf.constant([[1.0, 2.0], [3.0, 0.0]]), tf.constant([1, 1]))
        assert session.run([binary, classes]) == [0.5, 0.5]
