"""Synchronous all-reduce: every replica holds the variables; gradients are summed between replicas.

No parameter servers. Each replica (the chief and the workers) keeps its own
copy of every variable on its first compute device. A step averages the
gradients of all replicas with collective all-reduce (a ring on CPUs) and
every replica applies the same update, so the copies stay identical. The
gradients are fused into buckets of about `bucket_bytes` (flatten, concat,
reduce, split) so that a model of many small tensors costs a few large
transfers, and may travel in 16 bits (cast before, cast back to float32 and
divided by N after).

Start-up: the chief initialises or restores its variables and broadcasts all
of them (optimizer slots and the global step included) to the other
replicas, which initialise their own copies and overwrite them with what
they receive. Only the chief saves checkpoints; its copy is the model.
"""

from __future__ import annotations

import dataclasses
import itertools

import tensorflow as tf

from disttrain.base import preemption
from disttrain.base.errors import ConfigError
from disttrain.strategies import autotune as tuning
from disttrain.strategies import sparse, transfer
from disttrain.strategies.base import Strategy

v1 = tf.compat.v1

GROUP_KEY = 1
# Collective broadcast kernels exist for these dtypes only.
_BROADCAST_DTYPES = (tf.float32, tf.float64, tf.float16, tf.int32, tf.int64, tf.bool)


def make_buckets(nbytes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Split tensor indices, in the given order, into consecutive buckets of about `bucket_bytes`.

    A bucket is closed once it holds at least `bucket_bytes`; a tensor larger
    than that gets a bucket of its own.
    """
    buckets, current, size = [], [], 0
    for i, n in enumerate(nbytes):
        if current and size + n > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        buckets.append(current)
    return buckets


def _flatten(tensors):
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def _unflatten(flat, shapes: list[tf.TensorShape]):
    sizes = [shape.num_elements() for shape in shapes]
    return [tf.reshape(p, shape) for p, shape in zip(tf.split(flat, sizes), shapes, strict=True)]


def all_reduce_mean(
    grads: list[tf.Tensor],
    group_size: int,
    bucket_bytes: int,
    transfer_dtype: tf.DType | None = None,
    instance_keys=None,
    group_key: int = GROUP_KEY,
    communication_hint: str = "auto",
    max_subdivs: int = -1,
    divisor: tf.Tensor | None = None,
) -> list[tf.Tensor]:
    """The mean of `grads` over `group_size` replicas, built for one replica on the current device.

    Every replica must call this with tensors of the same shapes and dtypes in
    the same order, and the same `instance_keys` (an iterator of ints), so
    that their collectives pair up. Buckets are formed last-variable first
    (the order backprop produces them) and each starts as soon as its
    gradients are there, beside the others (distinct instance keys pair
    them, not the order; chaining them made a bucket wait for the previous
    one to finish, by then the compute thread was busy). `max_subdivs`
    caps how many pieces TF's ring splits each bucket into, to keep more of
    it in flight at once (-1: TF's default). `divisor`: what the sum is
    divided by instead of `group_size` (a float32 scalar tensor: the towers
    that contributed, under Join).
    """
    if group_size == 1:
        return list(grads)
    keys = instance_keys if instance_keys is not None else itertools.count(1)
    out: list[tf.Tensor | None] = [None] * len(grads)
    order = list(reversed(range(len(grads))))
    by_dtype: dict[tf.DType, list[int]] = {}
    for i in order:
        by_dtype.setdefault(grads[i].dtype, []).append(i)
    for dtype, indices in by_dtype.items():
        sizes = [grads[i].shape.num_elements() * dtype.size for i in indices]
        for bucket in make_buckets(sizes, bucket_bytes):
            members = [indices[k] for k in bucket]
            key = next(keys)
            with tf.name_scope(f"allreduce_bucket_{key}"):
                flat = _flatten([grads[i] for i in members])
                if transfer_dtype is not None and dtype == tf.float32:
                    flat = tf.cast(flat, transfer_dtype)
                summed = tf.raw_ops.CollectiveReduceV2(
                    input=flat,
                    group_size=group_size,
                    group_key=group_key,
                    instance_key=key,
                    ordering_token=[],
                    merge_op="Add",
                    final_op="Id",
                    communication_hint=communication_hint,
                    max_subdivs_per_device=max_subdivs,
                )
                by = tf.constant(group_size, dtype) if divisor is None else tf.cast(divisor, dtype)
                mean = tf.cast(summed, dtype) / by
                for i, part in zip(members, _unflatten(mean, [grads[i].shape for i in members]), strict=True):
                    out[i] = part
    return out


def _gather(tensor, group_size: int, key: int, group_key: int, communication_hint: str):
    """Every replica's `tensor` side by side, along axis 0; its length may change from step to step.

    The V1 op: the V2 one keeps the first run's shape for its instance key
    and fails the next step whose row count differs. It has no bfloat16
    kernel: bfloat16 travels as the same bits read as float16 (a gather
    only copies them).
    """
    if tensor.dtype == tf.bfloat16:
        bits = _gather(tf.bitcast(tensor, tf.float16), group_size, key, group_key, communication_hint)
        return tf.bitcast(bits, tf.bfloat16)
    return tf.raw_ops.CollectiveGather(
        input=tensor,
        group_size=group_size,
        group_key=group_key,
        instance_key=key,
        shape=tf.TensorShape([None] * tensor.shape.rank),
        communication_hint=communication_hint,
    )


def all_gather_mean(
    grads: list[tf.IndexedSlices],
    group_size: int,
    transfer_dtype: tf.DType | None = None,
    instance_keys=None,
    group_key: int = GROUP_KEY,
    communication_hint: str = "auto",
    after=None,
    divisor: tf.Tensor | None = None,
) -> list[tf.IndexedSlices]:
    """The mean of sparse gradients over `group_size` replicas, as rows: every replica's rows, / N.

    Never densifies: each replica sends its own rows and receives everyone
    else's. Gradients of the same dtype and row shape travel together in
    three collectives whatever their number: the row count, the rows (padded
    to the largest count), and the indices, each tagged with which gradient
    it belongs to (index * len(group) + position). Every replica must call it
    with the same gradients' dtypes and row shapes in the same order, and the
    same `instance_keys`. `after`: an op the exchange waits for. `divisor`:
    as all_reduce_mean's.
    """
    if group_size == 1:
        return list(grads)
    keys = instance_keys if instance_keys is not None else itertools.count(1)
    out: list[tf.IndexedSlices | None] = [None] * len(grads)
    groups: dict[tuple, list[int]] = {}
    for i, g in enumerate(grads):
        groups.setdefault((g.values.dtype, tuple(g.values.shape[1:].as_list())), []).append(i)
    common = dict(group_size=group_size, group_key=group_key, communication_hint=communication_hint)
    for (dtype, _), members in groups.items():
        with tf.name_scope("allgather_rows"), tf.control_dependencies([after] if after is not None else []):
            count = len(members)
            values = tf.concat([grads[i].values for i in members], axis=0)
            tagged = tf.concat(
                [tf.cast(grads[i].indices, tf.int64) * count + k for k, i in enumerate(members)], axis=0
            )
            if transfer_dtype is not None and dtype == tf.float32:
                values = tf.cast(values, transfer_dtype)
            rows = tf.shape(tagged, out_type=tf.int32)[:1]
            counts = _gather(rows, key=next(keys), **common)
            # At least one (padding) row each: TF's ring gather of empty tensors crashes the process
            # (a null copy in RingGatherer), and in the step after every pipeline's data has ended
            # no replica has a row to send.
            longest = tf.maximum(tf.reduce_max(counts), 1)
            pad = longest - rows[0]
            values = tf.pad(values, [[0, pad]] + [[0, 0]] * (values.shape.rank - 1))
            tagged = tf.pad(tagged, [[0, pad]])
            all_values = _gather(values, key=next(keys), **common)
            all_tagged = _gather(tagged, key=next(keys), **common)
            after = all_tagged
            real = tf.reshape(tf.sequence_mask(counts, longest), [-1])
            by = tf.constant(group_size, dtype) if divisor is None else tf.cast(divisor, dtype)
            all_values = tf.cast(tf.boolean_mask(all_values, real), dtype) / by
            all_tagged = tf.boolean_mask(all_tagged, real)
            owner = tf.cast(all_tagged % count, tf.int32)
            parts_v = tf.dynamic_partition(all_values, owner, count)
            parts_i = tf.dynamic_partition(all_tagged // count, owner, count)
            for k, i in enumerate(members):
                out[i] = tf.IndexedSlices(parts_v[k], parts_i[k], grads[i].dense_shape)
    return out


class SyncAllReduce(Strategy):
    """Every replica holds the variables; gradients are averaged by collective all-reduce.

    bucket_bytes: gradients are fused into buckets of about this many bytes
      (of float32 gradient) before each all-reduce.
    transfer_dtype: None (float32), 'float16' or 'bfloat16': float32
      gradients travel in this type (half the bytes); the sum is cast back to
      float32 and divided by N there.
    communication_hint: 'auto', 'ring' or 'nccl' (GPUs), given to the collectives.
    max_subdivs: how many pieces TF's ring may split a bucket into, so that
      more of it is in flight at once (None: TF's default, 2). More pieces
      help when the links, not compute, bound the step; they do not change
      the bytes sent.
    densify_below_bytes: a sparse gradient (the rows of an embedding table a
      step looked up) is exchanged as rows with an all-gather, every
      replica's rows to every replica, and applied as a sparse update; only
      a table of at most this many bytes is summed densely with the other
      gradients instead (it rides in a bucket, where rows would cost their
      own collectives). 256 KiB by default: a table that small adds at most
      1/16 of a default bucket.
    autotune: pick bucket_bytes and max_subdivs at start-up: the graph holds
      the all-reduce for every candidate (the configured setting first, used
      until tuned, then `autotune_grid`), and when the session starts every
      replica times each candidate over zeros of the gradients' shapes and
      all take the one fastest summed over the replicas (logged).
      `bucket_bytes` still sizes the initial broadcast.
    autotune_grid: (bucket_bytes, max_subdivs) pairs to try (max_subdivs
      None: TF's default); None: 4, 32 and 128 MiB, each with TF's default
      and 8 pieces.
    autotune_runs: timed all-reduces per candidate (after one untimed).

    One increment of the global step consumes N x batch x towers x accumulate_steps examples.
    The cluster needs no 'ps' job. Every task's server and session must use
    `session_config()` (it names the collective group leader, without which
    collectives hang), and sessions must use `scaffold()`.
    """

    kind = "allreduce"
    dense_over_ring = True
    synchronous = True
    uses_ps = False
    knobs = ("bucket_bytes", "transfer_dtype", "communication_hint", "densify_below_bytes")
    recovers_in_process = False
    aggregate_clipped_at = "the all-reduced mean, on every replica"
    # Each weight gradient as soon as it is computed (TF's gating would hold a layer's weight
    # gradient until the gradient flowing to the layer below is computed too).
    gate_gradients = v1.train.Optimizer.GATE_NONE

    @dataclasses.dataclass
    class Made(Strategy.Made):
        """The ring's pieces of a build: its instance keys (in build order, so they match on every
        task) and the preemption vote of its first step (this replica's flag, the group's mean)."""

        keys: itertools.count | None = None
        vote: tuple[tf.Tensor, tf.Tensor] | None = None

    def __init__(
        self,
        cluster,
        bucket_bytes: int = 4 * 2**20,
        transfer_dtype: str | None = None,
        num_towers: int | None = None,
        communication_hint: str = "auto",
        max_subdivs: int | None = None,
        densify_below_bytes: int = 2**18,
        autotune: bool = False,
        autotune_grid=None,
        autotune_runs: int = 2,
    ):
        super().__init__(cluster, num_towers)
        self.densify_below_bytes = int(densify_below_bytes)
        if bucket_bytes < 1:
            raise ConfigError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        if communication_hint not in ("auto", "ring", "nccl"):
            raise ConfigError(f"communication_hint={communication_hint!r}: expected 'auto', 'ring' or 'nccl'")
        if max_subdivs is not None and max_subdivs < 1:
            raise ConfigError(f"max_subdivs must be >= 1 (or None for TF's default), got {max_subdivs}")
        self.max_subdivs = -1 if max_subdivs is None else int(max_subdivs)
        self.bucket_bytes = int(bucket_bytes)
        self.transfer_dtype = transfer.parse(transfer_dtype, type(self).__name__)
        self.communication_hint = communication_hint
        self.tuner: tuning.Autotuner | None = None
        if autotune:
            first = tuning.Setting(self.bucket_bytes, self.max_subdivs)
            settings = tuning.candidates(first, autotune_grid)
            self.tuner = tuning.Autotuner(settings, self.group_size, GROUP_KEY, autotune_runs)

    @property
    def group_size(self) -> int:
        return 1 if self.cluster.is_local else self.cluster.num_replicas

    @property
    def leader(self) -> str:
        """The collective group leader: the first replica's task (the chief)."""
        job, index = self.cluster.replica_jobs[0]
        return f"/job:{job}/replica:0/task:{index}"

    def examples_per_step(self, batch_size: int) -> int:
        return self.group_size * super().examples_per_step(batch_size)

    def apply_gradients(self, optimizer, grads_and_vars, global_step):
        if self.step_in_run == 0:
            self.start_graph()
        contributed, vote = self.data_weight, None  # towers with real data: this replica's
        if self.group_size > 1:
            grads_and_vars, contributed, vote = self.summed(grads_and_vars, self.step_in_run == 0)
        with tf.device(self.compute_devices[0]):
            grads_and_vars = self.clip_aggregate(grads_and_vars)
        update = self.when_data(
            lambda: optimizer.apply_gradients(grads_and_vars, global_step=global_step), contributed
        )
        return update if vote is None else tf.group(update, vote, name="train_and_vote")

    def start_graph(self) -> None:
        """Before a graph's first step: instance keys start, in build order, so they match on every
        task (a new build's own pieces have no vote yet)."""
        self.made.keys = itertools.count(1)

    def summed(self, grads_and_vars, first_step: bool):
        """The step's gradients summed over the group: (the mean gradients, the group's towers with
        data or None, the step's vote to run with it or None).

        Every step with uneven inputs (Join) votes: the group's count of towers
        with data divides the sums. Without, the preemption flag is voted in a
        run's first step. The vote rides in the step's first gradient bucket
        (two more numbers in its all-reduce, not a collective of its own) where
        there is one to ride in.
        """
        joined = self.data_weight is not None
        if not joined and not first_step:
            return self._all_reduced(grads_and_vars)[0], None, None
        made = self.made
        with tf.device(self.compute_devices[0]), tf.name_scope("preemption_vote"):
            flag = (
                v1.placeholder_with_default(tf.constant(0.0), [], name="preempted_here")
                if made.vote is None
                else made.vote[0]
            )
            ballot = tf.stack([flag, self.data_weight if joined else tf.constant(0.0)])
        if not self._can_ride(grads_and_vars):
            anywhere = self._vote_alone(ballot)
            contributed = anywhere[1] * self.group_size if joined else None
            grads_and_vars, _ = self._all_reduced(grads_and_vars, contributed)
        else:
            grads_and_vars, anywhere = self._all_reduced(grads_and_vars, ballot=ballot)
            contributed = anywhere[1] * self.group_size if joined else None
        if made.vote is None:
            made.vote = (flag, anywhere)
        return grads_and_vars, contributed, anywhere

    def _can_ride(self, grads_and_vars) -> bool:
        """A float32 gradient all-reduced densely to carry the vote, and its counts exact in the transfer
        type (16-bit floats hold integers exactly up to 256 at least)."""
        dense32 = any(
            g is not None and g.dtype == tf.float32 and not self._as_rows(g, v) for g, v in grads_and_vars
        )
        exact = self.transfer_dtype is None or self.group_size * max(len(self.compute_devices), 1) <= 256
        return dense32 and exact

    def _vote_alone(self, ballot: tf.Tensor) -> tf.Tensor:
        """The vote in an all-reduce of its own (no float32 gradient to ride in): the group's mean of
        [preemption flag, towers with data] = [> 0 if any replica is being preempted, towers / N]."""
        with tf.device(self.compute_devices[0]), tf.name_scope("preemption_vote"):
            (anywhere,) = all_reduce_mean([ballot], self.group_size, 4, instance_keys=self.made.keys)
        return anywhere

    def _all_reduced(self, grads_and_vars, contributed: tf.Tensor | None = None, ballot=None):
        """The gradients summed over the group and divided by the towers that contributed.

        Without Join by the group's size, as a mean of every replica's
        (tower-averaged) gradient; with Join each replica sends its gradient
        times its towers with data, and the sum is divided by the group's count
        of them (at least 1): `contributed`, or, with a `ballot` ([flag, towers
        with data]), the count the ballot carries in the first bucket, beside
        the gradients. Returns (the gradients, the ballot's mean over the group
        or None without a ballot).
        """
        joined = self.data_weight is not None
        grads = [self._dense_or_rows(g, v) for g, v in grads_and_vars]
        if joined:
            with tf.device(self.compute_devices[0]), tf.name_scope("join_weight"):
                grads = [sparse.scaled(g, self.data_weight) for g in grads]
        dense = [i for i, g in enumerate(grads) if not sparse.is_sparse(g)]
        rows = [i for i, g in enumerate(grads) if sparse.is_sparse(g)]
        # Buckets start from the end of the list (where backprop starts): the ballot, last, is in the first.
        dense_grads = [grads[i] for i in dense] + ([ballot] if ballot is not None else [])
        with tf.device(self.compute_devices[0]), tf.name_scope("allreduce"):
            if joined and ballot is not None:  # sums, divided below by the count the ballot carries
                divisor = tf.constant(1.0)
            else:
                divisor = None if contributed is None else tf.maximum(contributed, 1.0)
            common = dict(
                transfer_dtype=self.transfer_dtype,
                instance_keys=self.made.keys,
                communication_hint=self.communication_hint,
                divisor=divisor,
            )
            reduced = self._reduced_dense(dense_grads, common)
            anywhere = None
            if ballot is not None:
                anywhere = reduced.pop()
                if joined:  # sums: [flags, towers with data]; the count divides every sum
                    count = tf.maximum(anywhere[1], 1.0)
                    reduced = [g / tf.cast(count, g.dtype) for g in reduced]
                    common["divisor"] = count
                    anywhere = anywhere / self.group_size
            gathered = all_gather_mean(
                [grads[i] for i in rows],
                self.group_size,
                after=tf.group(*reduced) if reduced else None,
                **common,
            )
        for i, g in zip(dense + rows, reduced + gathered, strict=True):
            grads[i] = g
        return [(g, v) for g, (_, v) in zip(grads, grads_and_vars, strict=True)], anywhere

    def _reduced_dense(self, dense_grads: list, common: dict) -> list:
        """The dense gradients all-reduced in buckets, by the tuner's setting where it tunes, else as set."""

        def reduce_dense(tensors, setting: tuning.Setting, keys):
            return all_reduce_mean(
                tensors,
                self.group_size,
                setting.bucket_bytes,
                max_subdivs=setting.max_subdivs,
                **{**common, "instance_keys": keys},
            )

        if self.tuner is not None:
            return self.tuner.reduce(dense_grads, reduce_dense, self.made.keys, self.step_in_run == 0)
        return reduce_dense(dense_grads, tuning.Setting(self.bucket_bytes, self.max_subdivs), self.made.keys)

    @property
    def votes_on_preemption(self) -> bool:
        """With other replicas: a preempted replica cannot leave alone (the others' collectives would
        wait for it); every step carries its flag, and all stop after the step that carried one."""
        return self.made.vote is not None

    def _as_rows(self, grad, var) -> bool:
        """A sparse gradient of a table larger than densify_below_bytes travels as rows."""
        return sparse.is_sparse(grad) and var.shape.num_elements() * var.dtype.size > self.densify_below_bytes

    def _dense_or_rows(self, grad, var):
        """How a gradient travels: rows (`_as_rows`) or dense."""
        if self._as_rows(grad, var):
            return grad
        grad = tf.convert_to_tensor(grad)
        return grad if grad.shape.is_fully_defined() else tf.reshape(grad, var.shape)

    def hooks(self, last_step: int | None = None, notice: preemption.Notice | None = None) -> list:
        """The preemption vote; the autotuner's search at session start, when there is one."""
        vote = self.made.vote
        hooks = [_PreemptionVote(*vote, preemption.given(notice))] if vote is not None else []
        return hooks + ([self.tuner.hook()] if self.tuner is not None and self.group_size > 1 else [])

    # ---- sessions ----------------------------------------------------------

    def scaffold(self, saver=None) -> v1.train.Scaffold:
        """Each replica initialises its own variables; the chief's are broadcast to the others.

        The chief initialises or restores (its session creator does that) and
        then sends every global variable in its local-init op; the others do
        not wait for the chief's variables (they cannot see them): their
        local-init op initialises their copies and overwrites them with the
        chief's values. Call after minimize(), before the graph is finalized.
        """
        if self.group_size == 1:
            return v1.train.Scaffold(saver=saver)
        if self.made.keys is None:
            raise RuntimeError("SyncAllReduce.scaffold() needs minimize() first")
        variables = v1.global_variables()
        for var in variables:
            if var.dtype.base_dtype not in _BROADCAST_DTYPES:
                raise ConfigError(
                    f"cannot broadcast variable {var.op.name} of dtype {var.dtype.base_dtype.name}"
                )
        default_local_init = v1.train.Scaffold.default_local_init_op()
        with tf.device(self.compute_devices[0]), tf.name_scope("broadcast_variables"):
            if self.cluster.is_chief:
                sent = self._broadcast(variables, send=True)
                local_init = tf.group(default_local_init, *sent)
                return v1.train.Scaffold(saver=saver, local_init_op=local_init)
            with tf.control_dependencies([v1.global_variables_initializer(), default_local_init]):
                received = self._broadcast(variables, send=False)
            local_init = tf.group(*received)
        return v1.train.Scaffold(
            saver=saver,
            local_init_op=local_init,
            # This replica's variables are its own: nothing to wait for before local init.
            ready_for_local_init_op=tf.constant([], dtype=tf.string),
        )

    def _broadcast(self, variables, send: bool) -> list:
        """Send (chief) or receive and assign (others) every variable, fused by dtype and size."""
        out = []
        by_dtype: dict[tf.DType, list] = {}
        for var in variables:
            by_dtype.setdefault(var.dtype.base_dtype, []).append(var)
        for dtype, group in by_dtype.items():
            sizes = [var.shape.num_elements() * dtype.size for var in group]
            for bucket in make_buckets(sizes, self.bucket_bytes):
                members = [group[k] for k in bucket]
                key = next(self.made.keys)
                common = dict(group_size=self.group_size, group_key=GROUP_KEY, instance_key=key)
                if send:
                    flat = _flatten([var.read_value() for var in members])
                    out.append(tf.raw_ops.CollectiveBcastSendV2(input=flat, **common))
                else:
                    length = sum(var.shape.num_elements() for var in members)
                    flat = tf.raw_ops.CollectiveBcastRecvV2(shape=[length], T=dtype, **common)
                    for var, value in zip(
                        members, _unflatten(flat, [var.shape for var in members]), strict=True
                    ):
                        out.append(var.assign(value, read_value=False))
        return out

    # ---- servers -------------------------------------------------------------

    def device_filters(self) -> list[str]:
        """Every replica: they all talk to each other."""
        if self.cluster.is_local:
            return []
        return [f"/job:{job}/task:{index}" for job, index in self.cluster.replica_jobs]

    def session_config(self, intra_op_threads: int = 0, inter_op_threads: int = 0) -> v1.ConfigProto:
        config = super().session_config(intra_op_threads, inter_op_threads)
        if not self.cluster.is_local:
            config.experimental.collective_group_leader = self.leader
        if self.use_gpus and self.communication_hint == "nccl":
            config.experimental.collective_nccl = True  # graph mode picks NCCL only when told
        return config


class _PreemptionVote(v1.train.SessionRunHook):
    """Feeds this replica's preemption flag into each step; stops every replica after the step that had one.

    A replica preempted between steps feeds 1 into its next step, whose
    all-reduce carries it to all: each then stops after that same step, the
    chief checkpoints it (disttrain.runtime.recovery.PreemptionHook), and all exit
    with the transient code, so a restart resumes from that very step.
    """

    def __init__(self, flag: tf.Tensor, anywhere: tf.Tensor, notice: preemption.Notice):
        self._flag, self._anywhere, self._notice = flag, anywhere, notice

    def before_run(self, run_context):
        feed = {self._flag: 1.0 if self._notice.requested() else 0.0}
        return v1.train.SessionRunArgs(self._anywhere, feed_dict=feed)

    def after_run(self, run_context, run_values):
        if run_values.results[0] > 0:
            self._notice.request("a replica of the all-reduce group is being preempted")
            run_context.request_stop()
