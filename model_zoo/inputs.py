"""Input pipelines as tf.data datasets of (features, labels) batches.

They run on the worker's CPU (the device setter puts dataset and iterator
ops there). Each takes the replica's index and the replica count so that
every replica reads a different shard.
"""

from __future__ import annotations

import time

import tensorflow as tf


def synthetic(
    model,
    batch_size: int,
    replica_index: int = 0,
    num_replicas: int = 1,
    seed: int = 0,
    slow_after_batches: int = 0,
    slow_batch_secs: float = 0.0,
):
    """One fixed random batch, repeated: measures the system, not the data.

    The batch is fixed per replica, so a model can fit it and the loss falls.
    `slow_after_batches`/`slow_batch_secs` make the pipeline wait that long
    for every batch after the first N: a real slowdown, for testing what
    watches throughput.
    """
    del num_replicas
    features = tf.random.stateless_uniform(
        (batch_size,) + tuple(model.input_shape), seed=[seed, replica_index], dtype=tf.float32
    )
    labels = tf.random.stateless_uniform(
        (batch_size,), seed=[seed + 1, replica_index], maxval=model.num_classes, dtype=tf.int32
    )
    dataset = tf.data.Dataset.from_tensors((features, labels)).repeat()
    if slow_batch_secs > 0:
        dataset = dataset.enumerate().map(
            lambda i, batch: _wait_after(i, batch, slow_after_batches, slow_batch_secs)
        )
    return dataset


def _wait_after(index, batch, after: int, secs: float):
    def wait(i):
        if i >= after:
            time.sleep(secs)
        return i

    done = tf.numpy_function(wait, [index], tf.int64)
    with tf.control_dependencies([done]):
        return tuple(tf.identity(t) for t in batch)


def shard_files(files: list[str], replica_index: int, num_replicas: int) -> tuple[list[str], bool]:
    """This replica's files, and whether records must be sharded instead.

    With at least as many files as replicas each replica reads whole files
    (no replica reads bytes it throws away); with fewer, every replica reads
    all files and keeps every num_replicas-th record.
    """
    files = sorted(files)
    if len(files) >= num_replicas:
        return files[replica_index::num_replicas], False
    return files, True


def tfrecord(
    model,
    batch_size: int,
    replica_index: int = 0,
    num_replicas: int = 1,
    file_pattern: str = "",
    shuffle_buffer: int = 1000,
    seed: int = 0,
):
    """Records with `features` (float list of the model's input size) and `label` (int64)."""
    files = tf.io.gfile.glob(file_pattern)
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {file_pattern!r}")
    files, by_record = shard_files(files, replica_index, num_replicas)
    dataset = tf.data.TFRecordDataset(files)
    if by_record:
        dataset = dataset.shard(num_replicas, replica_index)
    spec = {
        "features": tf.io.FixedLenFeature(model.input_shape, tf.float32),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        return example["features"], tf.cast(example["label"], tf.int32)

    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    dataset = dataset.repeat().map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(2)


def sequence(model, batch_size: int, replica_index: int = 0, num_replicas: int = 1, seed: int = 0):
    """A fixed batch, split between replicas: for testing that N replicas equal one big batch.

    The cluster's batch has num_replicas x batch_size rows, a pure function of
    its shape and `seed`; replica r gets rows [r*b, (r+1)*b), repeated every
    step. N replicas at batch b therefore see exactly the rows one process
    sees at batch N*b.
    """
    rows = batch_size * num_replicas
    features = tf.random.stateless_uniform(
        (rows,) + tuple(model.input_shape), seed=[seed, 1], dtype=tf.float32
    )
    labels = tf.random.stateless_uniform((rows,), seed=[seed, 2], maxval=model.num_classes, dtype=tf.int32)
    begin = replica_index * batch_size
    batch = (features[begin : begin + batch_size], labels[begin : begin + batch_size])
    return tf.data.Dataset.from_tensors(batch).repeat()
