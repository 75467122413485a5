"""Synchronous hybrid: embedding tables on the PS tasks, every other variable mirrored and summed over a ring.

A recommendation model's tables (tens of GB at production sizes) do not fit
one worker, and its dense layers, small and read whole every step, are what
a ring does best. Each step, every replica

1. reads its global step t (its own copy: the replicas step together),
2. computes its gradients, the tables' rows gathered on the PS that holds
   them (only the rows a step looks up cross the network),
3. sums the dense gradients over the ring, fused into buckets and overlapped
   with backprop as `SyncAllReduce` does, and applies them to its own copy
   of the dense variables, incrementing its global step,
4. adds the tables' sparse gradients, tagged t, to accumulators on their PS,
   reports and waits for its release token: the chief's aggregator applies
   the mean of the tables' gradients once every replica has reported, as
   `SyncParameterServer` does, and increments the tables' step.

So one synchronous step is one global step for both halves, and the update
is one process's with N times the batch. A replica holds no copy of a table.
The replicas' steps share one step id (TF synchronises it for the ring's
collectives), so a step closes for all of them at once, those whose data
has ended included: the first to end a step cleans it up on the PS, which
would abort another's part of it still waiting there.
The tables' update has an optimizer of its own (the same class and settings:
its state, such as Adam's step powers, lives beside the tables on the PS).
"""

from __future__ import annotations

import copy
import dataclasses

import tensorflow as tf

from disttrain.graph import placement
from disttrain.strategies import allreduce, waves
from disttrain.strategies.allreduce import SyncAllReduce
from disttrain.strategies.sync_ps import SyncParameterServer

v1 = tf.compat.v1

TABLE_STEP = "hybrid_table_step"


class SyncHybrid(SyncParameterServer):
    """Tables on the PS tasks (cut by rows, sparse synchronous updates); the rest mirrored, ring-summed.

    Tables are the variables the model reads by rows (a gather), as the
    plan finds them from a scratch build (get_variable, `tf.nn.embedding_lookup`)
    or, for Keras' `Embedding`, in the built graph. Every replica must take
    part in every step (no backup workers: the ring waits for all of them).

    bucket_bytes, communication_hint: the ring's, as `SyncAllReduce` takes
    them (the dense half).
    transfer_dtype: both halves' (the ring's buckets; the rows read from the
    PS and their gradients), as the two strategies take it.
    piece_bytes: the tables' pieces, as `SyncParameterServer` takes them.
    densify_below_bytes: a table of at most this many bytes stays on the
      workers with the dense variables and its gradient is summed densely in
      the ring's buckets, as `SyncAllReduce` sums it (256 KiB by default).
      On the PS it would cost a step a lookup and a push per table for a few
      rows (DLRM's 26 tables include 11 of at most 633 rows). 0 puts every
      table on the PS.

    One increment of the global step consumes N x batch x towers examples.
    Every task's server and session must use `session_config()` (it names
    the ring's collective group leader), and sessions must use `scaffold()`:
    the chief initialises or restores the tables and its copy of the rest,
    and sends that copy to the other replicas. After a lost task every
    replica restarts from the last checkpoint (the dense half lived in the
    replicas): the chief restores the checkpoint over the tables too, so
    both halves are of one step.
    """

    kind = "hybrid"
    dense_over_ring = True
    synchronous = True
    uses_ps = True
    knobs = ("bucket_bytes", "transfer_dtype", "communication_hint", "piece_bytes", "densify_below_bytes")
    recovers_in_process = False
    adopts_live_ps_state = False
    closes_with_every_replica = True
    aggregate_clipped_at = None  # two halves, two places: clip per replica (clip_where='replica')
    gate_gradients = SyncAllReduce.gate_gradients

    def __init__(
        self,
        cluster,
        num_towers: int | None = None,
        max_imbalance: float = 0.05,
        bucket_bytes: int = 4 * 2**20,
        transfer_dtype: str | None = None,
        communication_hint: str = "auto",
        piece_bytes: int | None = None,
        densify_below_bytes: int = 2**18,
    ):
        # The tables' half sends rows and their gradients in `transfer_dtype` too.
        super().__init__(cluster, 0, num_towers, max_imbalance, piece_bytes, transfer_dtype=transfer_dtype)
        # The dense half is SyncAllReduce's ring, built by this strategy's steps.
        self.ring = SyncAllReduce(
            cluster,
            bucket_bytes=bucket_bytes,
            transfer_dtype=transfer_dtype,
            num_towers=self.num_towers,
            communication_hint=communication_hint,
            densify_below_bytes=densify_below_bytes,
        )
        self.densify_below_bytes = self.ring.densify_below_bytes
        self.bucket_bytes, self.communication_hint = bucket_bytes, communication_hint

    @dataclasses.dataclass
    class Made(SyncParameterServer.Made):
        """The hybrid's pieces of a build, beside the sync PS's (the ring keeps its own)."""

        table_optimizer: object = None  # the tables' update's own optimizer, made by the run's first step

    # ---- placement: tables on the PS, the rest where the replica computes --------

    def plan_from(self, specs) -> placement.Plan | None:
        """The plan of the tables alone over the PS tasks; every other variable stays on the worker."""
        return super().plan_from([s for s in specs if self._on_tables_ps(s.table, s.nbytes)])

    def _on_tables_ps(self, table: bool, nbytes: int) -> bool:
        """Whether a variable lives on the PS tasks: a table larger than densify_below_bytes."""
        return table and nbytes > self.densify_below_bytes

    def device_setter(self):
        """The base's, but a variable the plan did not place stays on the worker, not a PS."""
        setter = super().device_setter()
        setter.unplanned_device = self.variable_devices_local
        return setter

    @property
    def variable_devices_local(self) -> str:
        """Where a replica keeps its copy of the dense variables: its first compute device."""
        return self.compute_devices[0]

    def place_remaining(self, global_step) -> None:
        """Tables the plan did not know (Keras' Embedding: found by their gathers) go whole to the PS.

        Only tables larger than densify_below_bytes: a smaller one stays with the dense variables.
        """
        if not self.cluster.num_ps:
            return
        tables = [
            part.op
            for var in v1.global_variables()
            for part in placement.variable_parts(var)
            if not _on_ps(part) and self._on_tables_ps(placement.is_table(part.op), waves.static_bytes(part))
        ]
        loads = self.plan.loads if self.plan is not None else ()
        if tables:
            _, self._record.placed.placed_whole = placement.place_whole(tables, self.cluster.num_ps, loads)

    # ---- the step ---------------------------------------------------------------

    def apply_gradients(self, optimizer, grads_and_vars, global_step):
        tables = [(g, v) for g, v in grads_and_vars if _on_ps(v)]
        dense = [(g, v) for g, v in grads_and_vars if not _on_ps(v)]
        ring = self.ring
        made = self.made
        if self.step_in_run == 0:
            with ring.building_within(self.building):  # the ring's pieces are part of this build
                ring.start_graph()
            # The tables' optimizer: state of its own, made once (every step of a run updates it).
            made.table_optimizer = _own_state(optimizer)
        contributed, vote = self.data_weight, None
        if self.cluster.num_replicas > 1 and not self.cluster.is_local:
            with ring.building_within(self.building):  # the ring reads this step's data weight
                dense, contributed, vote = ring.summed(dense, self.step_in_run == 0)
        dense_update = self.when_data(
            lambda: optimizer.apply_gradients(dense, global_step=global_step), contributed
        )
        if not tables or self.cluster.is_local:
            # One process, or no table: the whole update is one process's.
            table_update = (
                self.when_data(lambda: made.table_optimizer.apply_gradients(tables), contributed)
                if tables
                else tf.no_op()
            )
        else:
            table_update = super().apply_gradients(made.table_optimizer, tables, self._table_step())
            table_update = self._every_replica_released(table_update)
        votes = [vote] if vote is not None else []
        return tf.group(dense_update, table_update, *votes, name="hybrid_train_op")

    def _every_replica_released(self, release: tf.Operation) -> tf.Tensor:
        """`release` (this replica's token), then a barrier of the ring: no replica ends the step first.

        The replicas' steps share one step id (the ring's collectives have TF synchronise it), and
        the first master to end a step cleans that id up on the PS, aborting what another
        replica's part of the step still has pending there: its token, released by the same run
        but not yet received (seen under load: "Cleanup <id>" on a token dequeue). After this
        small all-reduce, which waits for every replica's token, nothing of the step is pending
        on the PS when any replica ends it.
        """
        with (
            tf.device(self.compute_devices[0]),
            tf.name_scope("released"),
            tf.control_dependencies([release]),
        ):
            (barrier,) = allreduce.all_reduce_mean(
                [tf.zeros([1])], self.ring.group_size, 4, instance_keys=self.ring.made.keys
            )
        return barrier

    def _table_step(self) -> tf.Variable:
        """The tables' own step on the first PS: the aggregator's update increments it, the queues live there.

        It equals the global step at every step boundary (both increment once per step) and is
        checkpointed with it.
        """
        with tf.device("/job:ps/task:0"):
            return v1.get_variable(
                TABLE_STEP,
                [],
                tf.int64,
                v1.zeros_initializer(),
                trainable=False,
                collections=[v1.GraphKeys.GLOBAL_VARIABLES],
            )

    def hooks(self, last_step: int | None = None, notice=None) -> list:
        return super().hooks(last_step, notice) + self.ring.hooks(last_step, notice)

    @property
    def votes_on_preemption(self) -> bool:
        return self.ring.votes_on_preemption

    # ---- sessions ---------------------------------------------------------------

    def scaffold(self, saver=None) -> v1.train.Scaffold:
        """The chief initialises or restores both halves and sends its dense copy; the others receive it.

        The other replicas wait for the chief's tables (on the PS) before they
        initialise their own copies and overwrite them with the chief's.
        """
        if self.cluster.is_local or self.cluster.num_replicas == 1:
            return v1.train.Scaffold(saver=saver)
        if self.ring.made.keys is None:
            raise RuntimeError("SyncHybrid.scaffold() needs minimize() first")
        variables = v1.global_variables()
        mine = [v for v in variables if not _on_ps(v)]
        shared = [v for v in variables if _on_ps(v)]
        default_local_init = v1.train.Scaffold.default_local_init_op()
        with tf.device(self.compute_devices[0]), tf.name_scope("broadcast_variables"):
            if self.cluster.is_chief:
                sent = self.ring._broadcast(mine, send=True)
                return v1.train.Scaffold(saver=saver, local_init_op=tf.group(default_local_init, *sent))
            with tf.control_dependencies([v1.variables_initializer(mine), default_local_init]):
                received = self.ring._broadcast(mine, send=False)
        return v1.train.Scaffold(
            saver=saver,
            local_init_op=tf.group(*received),
            # The tables are the chief's to initialise; this replica's own copies are not.
            ready_for_local_init_op=v1.report_uninitialized_variables(shared),
        )

    def device_filters(self) -> list[str]:
        """The PS tasks and every replica: the ring joins them all."""
        if self.cluster.is_local:
            return []
        return ["/job:ps", *self.ring.device_filters()]

    def session_config(self, intra_op_threads: int = 0, inter_op_threads: int = 0) -> v1.ConfigProto:
        config = self.ring.session_config(intra_op_threads, inter_op_threads)
        del config.device_filters[:]
        config.device_filters.extend(self.device_filters())
        return config


def _on_ps(var) -> bool:
    device = var.device if hasattr(var, "device") else ""
    return tf.DeviceSpec.from_string(device or "").job == "ps"


def _own_state(optimizer):
    """An optimizer like `optimizer` with state of its own: its slots and non-slot variables.

    The tables' update runs apart from the dense one (on the chief's
    aggregator, not in every replica's step), so it needs its own step
    powers (Adam) beside the tables; two updates through one instance would
    advance them twice a step. An optimizer wrapping another (clipping,
    Horovod-style) gets a copy of the wrapped one too.
    """
    twin = copy.copy(optimizer)
    for name, value in vars(optimizer).items():
        if name in ("_slots", "_non_slot_dict") and isinstance(value, dict):
            setattr(twin, name, {})
        elif isinstance(value, v1.train.Optimizer):
            setattr(twin, name, _own_state(value))
    return twin
