"""The ImageNet TFRecord reader on real JPEG records written to tmp_path."""

from __future__ import annotations

import types

import numpy as np
import pytest
import tensorflow as tf

from model_zoo import imagenet

tf.compat.v1.disable_eager_execution()
v1 = tf.compat.v1

IMAGE_SIZE = 32
MODEL = types.SimpleNamespace(input_shape=(IMAGE_SIZE, IMAGE_SIZE, 3), num_classes=1000)
SHAPES = [(48, 64), (64, 40), (50, 50)]  # JPEGs of different sizes and aspect ratios


def _encode_jpegs(images: list[np.ndarray]) -> list[bytes]:
    with tf.Graph().as_default():
        pixels = v1.placeholder(tf.uint8, [None, None, 3])
        encoded = tf.io.encode_jpeg(pixels, quality=90)
        with v1.Session() as sess:
            return [sess.run(encoded, {pixels: image}) for image in images]


def _example(jpeg: bytes, label: int) -> bytes:
    feature = {
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"JPEG"])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_shards(directory, num_files: int, per_file: int, seed: int = 0) -> list[int]:
    """`num_files` files `train-0000i-of-...` of JPEG records labelled 1, 2, ... (ImageNet's 1-based)."""
    rng = np.random.default_rng(seed)
    count = num_files * per_file
    images = [rng.integers(0, 256, SHAPES[i % len(SHAPES)] + (3,), dtype=np.uint8) for i in range(count)]
    jpegs = _encode_jpegs(images)
    labels = list(range(1, count + 1))
    for f in range(num_files):
        with tf.io.TFRecordWriter(str(directory / f"train-{f:05d}-of-{num_files:05d}")) as writer:
            for i in range(f * per_file, (f + 1) * per_file):
                writer.write(_example(jpegs[i], labels[i]))
    return labels


def read(num_batches: int, batch_size: int = 2, **kwargs) -> tuple[np.ndarray, np.ndarray]:
    """Run the pipeline in a v1 session and return the concatenated batches."""
    kwargs.setdefault("shuffle_buffer", 0)
    with tf.Graph().as_default():
        dataset = imagenet.imagenet(MODEL, batch_size, **kwargs)
        iterator = v1.data.make_initializable_iterator(dataset)
        next_batch = iterator.get_next()
        with v1.Session() as sess:
            sess.run(iterator.initializer)
            batches = [sess.run(next_batch) for _ in range(num_batches)]
    return np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])


def test_decodes_augments_and_batches(tmp_path):
    labels = write_shards(tmp_path, num_files=4, per_file=3)
    images, got = read(6, file_pattern=str(tmp_path / "train-*"))
    assert images.shape == (12, IMAGE_SIZE, IMAGE_SIZE, 3) and images.dtype == np.float32
    assert got.dtype == np.int32
    assert sorted(got) == [label - 1 for label in labels]  # one epoch, labels 1..12 -> 0..11
    low = (0.0 - np.array(imagenet.MEAN_RGB)) / np.array(imagenet.STDDEV_RGB)
    high = (1.0 - np.array(imagenet.MEAN_RGB)) / np.array(imagenet.STDDEV_RGB)
    assert np.all(np.isfinite(images))
    assert np.all(images >= low - 1e-4) and np.all(images <= high + 1e-4)
    assert images.std() > 0.1  # real pixels, not a constant


def test_replicas_read_disjoint_files(tmp_path):
    write_shards(tmp_path, num_files=4, per_file=3)
    pattern = str(tmp_path / "train-*")
    seen = [set(read(3, file_pattern=pattern, replica_index=r, num_replicas=2)[1]) for r in range(2)]
    assert len(seen[0]) == len(seen[1]) == 6
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(12))
    assert seen[0] == {0, 1, 2, 6, 7, 8}  # files 0 and 2 (inputs.shard_files: whole files per replica)


def test_fewer_files_than_replicas_shards_records(tmp_path):
    write_shards(tmp_path, num_files=1, per_file=6)
    pattern = str(tmp_path / "train-*")
    seen = [
        set(read(1, batch_size=3, file_pattern=pattern, replica_index=r, num_replicas=2)[1]) for r in range(2)
    ]
    assert seen == [{0, 2, 4}, {1, 3, 5}]


def test_shuffled_training_reads_every_record_once_per_epoch(tmp_path):
    write_shards(tmp_path, num_files=4, per_file=3)
    _, got = read(6, file_pattern=str(tmp_path / "train-*"), shuffle_buffer=100, seed=3)
    assert sorted(got) == list(range(12))


def test_evaluation_is_a_deterministic_central_crop(tmp_path):
    write_shards(tmp_path, num_files=2, per_file=3)
    pattern = str(tmp_path / "train-*")
    first = read(3, file_pattern=pattern, training=False)
    second = read(3, file_pattern=pattern, training=False)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], [0, 3, 1, 4, 2, 5])  # files interleaved in a fixed order


def test_label_offset(tmp_path):
    write_shards(tmp_path, num_files=1, per_file=4)
    _, got = read(2, file_pattern=str(tmp_path / "train-*"), label_offset=0)
    assert list(got) == [1, 2, 3, 4]


def test_label_out_of_range_names_label_offset(tmp_path):
    write_shards(tmp_path, num_files=1, per_file=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="label_offset=999"):
        read(1, file_pattern=str(tmp_path / "train-*"), label_offset=999)  # labels 1, 2 -> 1000, 1001


def test_no_files_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="train-\\*"):
        imagenet.imagenet(MODEL, 2, file_pattern=str(tmp_path / "train-*"))
