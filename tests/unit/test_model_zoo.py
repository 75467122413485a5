import numpy as np
import pytest
import tensorflow as tf

import model_zoo
from disttrain.graph import input_context, placement
from model_zoo import inputs, layers
from model_zoo.registry import register

v1 = tf.compat.v1


def test_registry_duplicate_and_unknown_names():
    with pytest.raises(ValueError, match="'mlp' is already registered"):
        register("mlp")(type("Other", (), {}))
    with pytest.raises(KeyError, match="unknown model 'mlpp': known models are .*cifar10.*mlp"):
        model_zoo.get("mlpp")


@pytest.mark.parametrize(
    "name, params, bytes_", [("mlp", 18_882_816, 75_531_264), ("cifar10", 1_068_298, 4_273_192)]
)
def test_foundation_model_sizes(name, params, bytes_):
    # mlp: 256-4096-4096-256 (fc2 alone 64 MiB); cifar10: TF's tutorial CNN (1.07M parameters).
    specs = placement.collect_variables(model_zoo.get(name)().build_variables)
    assert sum(np.prod(s.shape) for s in specs) == params
    assert sum(s.nbytes for s in specs) == bytes_


def test_batch_norm_moving_statistics_update_in_graph_mode():
    with tf.Graph().as_default():
        x = tf.random.normal([64, 4, 4, 3], mean=5.0, stddev=2.0, seed=1)
        y = layers.batch_norm(x, training=True, name="bn", momentum=0.5)
        updates = v1.get_collection(v1.GraphKeys.UPDATE_OPS)
        assert len(updates) == 2
        with tf.control_dependencies(updates):
            step = tf.identity(y)
        with v1.variable_scope("bn", reuse=True):
            mean = v1.get_variable("moving_mean")
            var = v1.get_variable("moving_variance")
        assert mean not in v1.trainable_variables()
        with v1.Session() as s:
            s.run(v1.global_variables_initializer())
            for _ in range(20):
                out = s.run(step)
            m, v = s.run([mean, var])
    assert np.allclose(m, 5.0, atol=0.5) and np.allclose(
        v, 4.0, atol=1.0
    )  # they moved to the data's statistics
    assert abs(out.mean()) < 0.1 and abs(out.std() - 1.0) < 0.1  # and training normalises with the batch's


def test_batch_norm_inference_uses_moving_statistics():
    with tf.Graph().as_default():
        x = tf.fill([2, 3], 7.0)
        y = layers.batch_norm(x, training=False, name="bn")
        assert not v1.get_collection(v1.GraphKeys.UPDATE_OPS)
        with v1.Session() as s:
            s.run(v1.global_variables_initializer())
            assert np.allclose(s.run(y), 7.0 / np.sqrt(1 + 1e-5))  # mean 0, variance 1 initially


def test_shard_files():
    files = [f"f{i}" for i in range(5)]
    assert input_context.shard_files(files, 1, 2) == (["f1", "f3"], False)
    assert input_context.shard_files(files[:1], 1, 2) == (
        ["f0"],
        True,
    )  # fewer files than replicas: shard records


def write_records(path, rows, dim):
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(rows):
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "features": tf.train.Feature(float_list=tf.train.FloatList(value=[float(i)] * dim)),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    }
                )
            )
            w.write(example.SerializeToString())


def read_labels(model, pattern, replica, replicas, batches):
    with tf.Graph().as_default():
        ds = inputs.tfrecord(model, 2, replica, replicas, file_pattern=pattern, shuffle_buffer=0)
        features, labels = v1.data.make_one_shot_iterator(ds).get_next()
        with v1.Session() as s:
            out = [s.run([features, labels]) for _ in range(batches)]
    for f, lab in out:
        assert f.shape == (2,) + model.input_shape
        assert np.allclose(f[:, 0], lab)
    return sorted(int(x) for _, lab in out for x in lab)


def test_tfrecord_input_shards_records_between_replicas(tmp_path):
    model = model_zoo.get("mlp")(input_dim=4)
    write_records(tmp_path / "one.tfrecord", 8, 4)
    pattern = str(tmp_path / "*.tfrecord")
    first, second = (read_labels(model, pattern, r, 2, 2) for r in (0, 1))
    assert first == [0, 2, 4, 6] and second == [1, 3, 5, 7]


def test_tfrecord_input_shards_files_between_replicas(tmp_path):
    model = model_zoo.get("mlp")(input_dim=4)
    for i in range(2):
        write_records(tmp_path / f"part{i}.tfrecord", 4, 4)
    pattern = str(tmp_path / "*.tfrecord")
    assert read_labels(model, pattern, 0, 2, 2) == [0, 1, 2, 3]  # replica 0 reads part0 whole


def test_tfrecord_input_without_files_says_so(tmp_path):
    with tf.Graph().as_default(), pytest.raises(FileNotFoundError, match="no files match .*none"):
        inputs.tfrecord(model_zoo.get("mlp")(), 2, file_pattern=str(tmp_path / "none*"))
