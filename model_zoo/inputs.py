"""Input pipelines as tf.data datasets of (features, labels) batches.

They run on the worker's CPU (the device setter puts dataset and iterator
ops there). Each takes the replica's index and the replica count so that
every replica reads a different shard.
"""

from __future__ import annotations

import time

import tensorflow as tf

from disttrain.graph.input_context import shard_records


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


def replica_records(file_pattern: str, replica_index: int, num_replicas: int) -> tf.data.Dataset:
    """This replica's share of the TFRecord files matching `file_pattern` (`shard_files`' rule).

    The zoo builds one input pipeline per replica (its towers take turns at
    it); a user's loss function shares the same rule per tower through
    `InputContext.shard`.
    """
    return shard_records(file_pattern, replica_index, num_replicas)


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
    dataset = replica_records(file_pattern, replica_index, num_replicas)
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


# ---- click data for DLRM-style models (features: dense float32, ids int64; labels 0/1) -------------

_CLICK_BIAS = -2.0  # about a quarter of the labels are clicks, as in Criteo
_SPREAD = 2_654_435_761  # a prime: for any vocabulary V < 3.4e9, id * _SPREAD mod V is a bijection in int64
_SIGNAL_COLUMNS = 3  # the categorical columns the synthetic labels depend on


def criteo_synthetic(
    model,
    batch_size: int,
    replica_index: int = 0,
    num_replicas: int = 1,
    seed: int = 0,
    zipf_exponent: float = 1.05,
    split_cluster_batch: bool = False,
):
    """Criteo-like click batches, new every step, for a model with `num_dense` and `vocab_sizes`.

    Batch n of a replica is a pure function of (seed, replica_index, n)
    (stateless random ops), so runs repeat and replicas differ. Per example:

    - dense: softplus(z), z standard normal per feature: positive and skewed
      like Criteo's counts after DLRM's log(1 + x).
    - ids: column c's id follows a power law over its vocabulary V, p(k) ~
      (k + 1)^-zipf_exponent for k in [0, V) (inverse CDF of a truncated
      Pareto), so a few ids are hot and most are a long tail. Ids are then
      scattered over the table (k * a large prime mod V), as hashing spreads
      them in real data, so the hot rows are not all in the first part of a
      table split by rows. At the default exponent and DLRM's default
      vocabularies, a third of a batch of 1024's ids are distinct (45% at
      256, 28% at 2048): a step reads each distinct row once.
    - label: Bernoulli(sigmoid(s)), s = 1.5 z.w (w fixed by `seed`) + a +-1
      hash of each of the first three id columns - 2: about a quarter
      clicks, learnable from the dense features at once and from the hot
      ids as their rows train, so the loss visibly falls in a short run.

    With `split_cluster_batch`, batch n of replica r is rows [r*b, (r+1)*b)
    of one batch of num_replicas x b made from (seed, n) alone, so N
    replicas see together exactly what one process sees at N x b (for
    equivalence tests; each replica then generates the whole cluster batch).

    Generating a batch costs a few elementwise ops per id: far below a step
    of the model at batch 256-2048. Not Criteo's statistics beyond that.
    """
    rows, first = (
        (batch_size * num_replicas, batch_size * replica_index) if split_cluster_batch else (batch_size, 0)
    )
    stream = 0 if split_cluster_batch else replica_index
    num_dense, vocab_sizes = model.num_dense, tuple(model.vocab_sizes)
    weights = tf.random.stateless_normal([num_dense, 1], seed=[seed, -1]) / num_dense**0.5
    columns = min(_SIGNAL_COLUMNS, len(vocab_sizes))

    def batch(index):
        key = tf.random.experimental.stateless_fold_in(tf.constant([seed, stream], tf.int64), index)
        keys = tf.random.experimental.stateless_split(key, num=3)
        z = tf.random.stateless_normal([rows, num_dense], seed=keys[0])
        ids = _power_law_ids(keys[1], rows, vocab_sizes, zipf_exponent)
        signal = 1.5 * tf.squeeze(tf.matmul(z, weights), axis=1) + _CLICK_BIAS
        signal += tf.reduce_sum(_hash_sign(ids[:, :columns], seed), axis=1)
        clicks = tf.random.stateless_uniform([rows], seed=keys[2]) < tf.sigmoid(signal)
        mine = slice(first, first + batch_size)
        return (tf.nn.softplus(z[mine]), ids[mine]), tf.cast(clicks[mine], tf.int32)

    return tf.data.Dataset.counter().map(batch).prefetch(2)


def _power_law_ids(key, batch_size: int, vocab_sizes: tuple[int, ...], exponent: float) -> tf.Tensor:
    """[batch_size, len(vocab_sizes)] int64 ids, column c in [0, vocab_sizes[c]), p(k) ~ (k + 1)^-exponent."""
    u = tf.random.stateless_uniform([batch_size, len(vocab_sizes)], seed=key, dtype=tf.float64)
    top = tf.constant(vocab_sizes, tf.float64) + 1.0
    if abs(exponent - 1.0) < 1e-9:  # p ~ 1/x on [1, V + 1): x = (V + 1)^u
        x = tf.pow(top, u)
    else:  # the inverse CDF of p ~ x^-s on [1, V + 1)
        q = 1.0 - exponent
        x = tf.pow(1.0 + u * (tf.pow(top, q) - 1.0), 1.0 / q)
    vocab = tf.constant(vocab_sizes, tf.int64)
    ranks = tf.minimum(tf.cast(x, tf.int64) - 1, vocab - 1)  # x < V + 1, but rounding
    return tf.math.floormod(ranks * _SPREAD, vocab)


def _hash_sign(ids: tf.Tensor, seed: int) -> tf.Tensor:
    """A fixed pseudo-random +-1.0 per (id, column, seed)."""
    columns = tf.range(tf.shape(ids)[1], dtype=tf.int64)
    mixed = (ids + 7919 * columns + 104_729 * seed) * _SPREAD
    return tf.cast(tf.bitwise.bitwise_and(tf.bitwise.right_shift(mixed, 17), 1), tf.float32) * 2.0 - 1.0


def criteo_tfrecord(
    model,
    batch_size: int,
    replica_index: int = 0,
    num_replicas: int = 1,
    file_pattern: str = "",
    shuffle_buffer: int = 10_000,
    seed: int = 0,
):
    """Click records from TFRecord files, for a model with `num_dense` and `vocab_sizes`.

    Each record is a tf.train.Example with
    - `dense`: float list of num_dense values (e.g. Criteo's counts as log(1 + x)),
    - `categorical`: int64 list of one id per vocabulary, already hashed into
      it; ids are taken modulo the vocabulary size here all the same,
    - `label`: int64, 0 or 1.
    Files are sharded between replicas as `tfrecord` shards them. Yields
    ((dense float32 [B, num_dense], ids int64 [B, C]), labels int32 [B]).
    """
    dataset = replica_records(file_pattern, replica_index, num_replicas)
    vocab = tf.constant(model.vocab_sizes, tf.int64)
    spec = {
        "dense": tf.io.FixedLenFeature([model.num_dense], tf.float32),
        "categorical": tf.io.FixedLenFeature([len(model.vocab_sizes)], tf.int64),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(records):
        example = tf.io.parse_example(records, spec)
        ids = tf.math.floormod(example["categorical"], vocab)
        return (example["dense"], ids), tf.cast(example["label"], tf.int32)

    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    dataset = dataset.repeat().batch(batch_size, drop_remainder=True)
    return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)
