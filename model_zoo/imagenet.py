"""ImageNet-style TFRecords: JPEG decode, standard augmentation, batches for one replica.

The records are those of TensorFlow's `build_imagenet_data.py` (and
tensorflow_datasets' exports): `image/encoded` holds the JPEG bytes and
`image/class/label` an int64 label. Those files number the 1000 classes
1..1000 (0 was a background class), so the default `label_offset=-1` maps
them to 0..999; pass `label_offset=0` for 0-based labels. A label outside
[0, num_classes) after the offset stops the input with an error naming it.

Training augmentation is the usual Inception/ResNet one: a random crop of
8%-100% of the area with aspect ratio 3/4-4/3 (`sample_distorted_bounding_box`,
decoding only the crop), resized to the model's image size, and a random
left-right flip. Evaluation takes the central 87.5% instead. Pixels are
scaled to [0, 1] and normalised with the ImageNet channel mean and std.

It does not read bounding-box annotations, and it runs on the worker's CPU
(the device setter puts dataset ops there).
"""

from __future__ import annotations

import tensorflow as tf

from disttrain.base.errors import NoFilesError
from disttrain.graph.input_context import shard_files

MEAN_RGB = (0.485, 0.456, 0.406)
STDDEV_RGB = (0.229, 0.224, 0.225)


def _crop_window(image_bytes, training: bool):
    """[y, x, height, width] of the crop to decode."""
    shape = tf.io.extract_jpeg_shape(image_bytes)
    if training:
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape,
            bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
            min_object_covered=0.1,
            aspect_ratio_range=(3.0 / 4.0, 4.0 / 3.0),
            area_range=(0.08, 1.0),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        return tf.stack([begin[0], begin[1], size[0], size[1]])
    height, width = shape[0], shape[1]
    side = tf.cast(0.875 * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
    return tf.stack([(height - side) // 2, (width - side) // 2, side, side])


def preprocess(image_bytes, image_size: int, training: bool):
    """JPEG bytes -> float32 [image_size, image_size, 3], augmented when training."""
    image = tf.image.decode_and_crop_jpeg(image_bytes, _crop_window(image_bytes, training), channels=3)
    image = tf.image.resize(image, [image_size, image_size], method="bilinear")
    if training:
        image = tf.image.random_flip_left_right(image)
    image = image / 255.0
    return (image - tf.constant(MEAN_RGB)) / tf.constant(STDDEV_RGB)


def _files(file_pattern: str) -> list[str]:
    """The TFRecord files of `file_pattern`; NoFilesError when there are none."""
    files = tf.io.gfile.glob(file_pattern) if file_pattern else []
    if not files:
        raise NoFilesError(f"no ImageNet TFRecord files match file_pattern={file_pattern!r}")
    return files


def _replica_records(
    files: list[str],
    replica_index: int,
    num_replicas: int,
    shuffle_files: bool,
    seed: int,
    cycle_length: int,
) -> tf.data.Dataset:
    """This replica's records: its files interleaved, or every num_replicas-th record if files are few."""
    files, by_record = shard_files(files, replica_index, num_replicas)
    if by_record:
        return tf.data.TFRecordDataset(files).shard(num_replicas, replica_index)
    dataset = tf.data.Dataset.from_tensor_slices(files)
    if shuffle_files:
        dataset = dataset.shuffle(len(files), seed=seed)
    return dataset.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(cycle_length, len(files)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=not shuffle_files,
    )


def _parser(image_size: int, num_classes: int, label_offset: int, training: bool):
    """record -> (preprocessed image, label + label_offset), the label checked to be in [0, num_classes)."""
    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        label = tf.cast(example["image/class/label"], tf.int32) + label_offset
        in_range = tf.debugging.Assert(
            tf.logical_and(label >= 0, label < num_classes),
            [
                f"ImageNet label out of range [0, {num_classes}) after label_offset={label_offset}"
                " (ImageNet TFRecords number classes 1..1000: use -1; 0-based labels: use 0); label:",
                label,
            ],
        )
        with tf.control_dependencies([in_range]):
            label = tf.identity(label)
        return preprocess(example["image/encoded"], image_size, training), label

    return parse


def imagenet(
    model,
    batch_size: int,
    replica_index: int = 0,
    num_replicas: int = 1,
    file_pattern: str = "",
    label_offset: int = -1,
    training: bool = True,
    shuffle_buffer: int = 10000,
    seed: int = 0,
    cycle_length: int = 8,
):
    """Batches of (images, labels) for one replica, forever.

    `model` gives the image size (`input_shape[0]`, square images) and
    `num_classes`. Replicas read disjoint files when there are at least as
    many files as replicas, else every num_replicas-th record (see
    `disttrain.graph.input_context.shard_files`). `shuffle_buffer=0` keeps the file order (tests).
    """
    files = _files(file_pattern)
    image_size = int(model.input_shape[0])
    num_classes = int(model.num_classes)
    shuffle_files = bool(training and shuffle_buffer)
    dataset = _replica_records(files, replica_index, num_replicas, shuffle_files, seed, cycle_length)
    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    parse = _parser(image_size, num_classes, label_offset, training)
    dataset = dataset.repeat().map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
