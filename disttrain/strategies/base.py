"""What every replica strategy shares: devices, towers, placement scope, gradients.

A strategy is built from a `Cluster` and used in a graph-mode model:

    strategy = disttrain.AsyncParameterServer(cluster)
    with strategy.scope():
        train_op = strategy.minimize(optimizer, loss_fn)

`loss_fn` is a callable that builds one replica's loss (and its input), called
once per tower (one per GPU, or per virtual CPU device); a plain loss tensor
works too when there is one tower. Placement over the PS tasks is planned
from `loss_fn` itself (see `minimize`). Subclasses decide how gradients reach
the variables (`apply_gradients`) and which hooks and server settings that
needs; `Strategy`'s docstring lists what a subclass declares and overrides,
and docs/writing-a-strategy.md walks through a whole one.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import inspect
import warnings
from collections.abc import Callable, Sequence

import tensorflow as tf

from disttrain.base import preemption
from disttrain.base.cluster import Cluster
from disttrain.base.config import steps_count
from disttrain.base.errors import ConfigError
from disttrain.graph import input_context, input_feeds, placement, run_steps, schedules
from disttrain.graph.clipping import Clip, clip_by_global_norm
from disttrain.strategies import building as building_lib
from disttrain.strategies import sparse, transfer
from disttrain.strategies.building import Building, Step

v1 = tf.compat.v1
NON_FINITE = "disttrain: non-finite"  # tags the numerics checks' errors


def _checked(grad, message: str):
    """`grad`, failing the step first if it holds a NaN or Inf.

    Checks one vectorised sum instead of every element: NaN and Inf survive a
    sum, and one reduction is far cheaper than check_numerics on every element
    of a large gradient, which would sit on the step's critical path.
    """
    values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
    with tf.control_dependencies([tf.debugging.check_numerics(tf.reduce_sum(values), message)]):
        values = tf.identity(values)
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return values


_ASSIGN_OPS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})


def _recording_state_updates(loss_fn: Callable, graph: tf.Graph) -> tuple[Callable, list]:
    """`loss_fn`, and a list filled on its first call with the state updates it leaves unrun.

    Those are variable assignments made in the call that the loss does not
    depend on and that are not a variable's initializer: Keras 3 layers in a
    v1 graph update their state (batch norm statistics, seed generators) that
    way, and nothing would run them.
    """
    found: list[tf.Operation] = []
    calls = []

    def recording():
        before = len(graph.get_operations())
        loss = loss_fn()
        if not calls:
            initializers = {v.initializer for v in v1.global_variables() + v1.local_variables()}
            needed = transfer.ancestors([loss.op])
            found.extend(
                op
                for op in graph.get_operations()[before:]
                if op.type in _ASSIGN_OPS and op not in needed and op not in initializers
            )
        calls.append(True)
        return loss

    return recording, found


def _named_as_one_tower(graph: tf.Graph, tower: str, next_creator, **kwargs):
    """A variable creator that names a variable made inside a tower's name scope as if it were not.

    Keras 3 layers built in the loss function take their variable names
    from the name scope (`tower_0/mlp/dense/kernel`): the checkpoint would
    then hold names that one tower's build, an evaluator, an export or a run
    with another `accumulate_steps` do not make. (`get_variable` names come
    from the variable scope, which no tower enters.)
    """
    scope = graph.get_name_scope()
    if scope != tower and not scope.startswith(tower + "/"):
        return next_creator(**kwargs)
    with graph.name_scope(scope[len(tower) + 1 :] + "/" if scope != tower else None):
        return next_creator(**kwargs)


def _gradients_of_copies(optimizer, loss, copies) -> list[tuple[tf.Tensor, tf.Variable]]:
    """`optimizer.compute_gradients` over the (copy, variable) pairs' copies, paired with the variables.

    Not colocated with their forward ops (TF 2's tf.gradients colocates): a
    table's gather runs on its PS, and the gradient of what the model did
    with the rows belongs on this tower's device, not on the PS (a round
    trip per step).
    """
    variable_of = {c.ref(): v for c, v in copies}
    pairs = optimizer.compute_gradients(
        loss,
        var_list=[c for c, _ in copies],
        gate_gradients=v1.train.Optimizer.GATE_NONE,
        colocate_gradients_with_ops=False,
    )
    return [(g, variable_of[c.ref()]) for g, c in pairs if g is not None]


def _weighted_sum(grads: list, weights: list, share) -> tf.Tensor | tf.IndexedSlices:
    """One variable's tower gradients combined: sum of weight x gradient, times `share`.

    Weights None: the plain mean (`share` is 1/len). Sparse gradients stay
    rows: every tower's side by side.
    """
    if len(grads) == 1 and weights[0] is None:
        return grads[0]
    if all(sparse.is_sparse(g) for g in grads):
        if weights[0] is None:
            return sparse.mean(grads)
        return sparse.summed([sparse.scaled(g, w * share) for g, w in zip(grads, weights, strict=True)])
    dense = [tf.convert_to_tensor(g) for g in grads]
    if weights[0] is None:
        return tf.add_n(dense) / len(dense)
    dtype = dense[0].dtype
    return tf.add_n([g * tf.cast(w, dtype) for g, w in zip(dense, weights, strict=True)]) * tf.cast(
        share, dtype
    )


_ITERATOR_OPS = frozenset({"OneShotIterator", "IteratorV2", "AnonymousIteratorV2", "AnonymousIteratorV3"})


class _MicroBatches:
    """One tower's micro-batches of a step, summed as each is built: gradients, loss, data weight.

    A micro-batch weighs 1, or 0 once its input has ended (its data-present
    flags). The next micro-batch is built after `last` (the running sums
    through this one), so that one micro-batch's activations are alive at a
    time. Dense gradients are summed as they come; sparse ones stay rows.
    """

    def __init__(self):
        self.last: list = []
        self._dense: dict[int, tf.Tensor] = {}
        self._rows: dict[int, list[tf.IndexedSlices]] = {}
        self._vars: list = []
        self._loss = self._plain = self._weight = None
        self._flagged, self._count = False, 0

    def add(self, loss: tf.Tensor, pairs: list, flags: list) -> None:
        """Add one micro-batch's loss, (grad, var) pairs and data-present flags."""
        weight = tf.cast(tf.reduce_all(tf.stack(flags)), tf.float32) if flags else tf.constant(1.0)
        self._flagged |= bool(flags)
        self._count += 1
        if not self._vars:
            self._vars = [v for _, v in pairs]
        self.last = []
        for i, (grad, _) in enumerate(pairs):
            grad = sparse.scaled(grad, weight) if flags else grad
            if sparse.is_sparse(grad):
                self._rows.setdefault(i, []).append(grad)
                self.last += [grad.values, grad.indices]
            else:
                grad = tf.convert_to_tensor(grad)
                self._dense[i] = grad if i not in self._dense else self._dense[i] + grad
                self.last.append(self._dense[i])
        self._loss = weight * loss if self._loss is None else self._loss + weight * loss
        self._plain = loss if self._plain is None else self._plain + loss
        self._weight = weight if self._weight is None else self._weight + weight
        self.last.append(self._loss)

    def mean(self) -> tuple[tf.Tensor, list, tf.Tensor | None]:
        """(loss, [(grad, var)], weight): the mean over the micro-batches with data, and their count.

        Weight None when no flag was read (every micro-batch counts). With
        none of data, zero gradients and the plain mean loss (a stand-in).
        """
        count = tf.maximum(self._weight, 1.0) if self._flagged else tf.constant(float(self._count))
        pairs = []
        for i, var in enumerate(self._vars):
            total = sparse.summed(self._rows[i]) if i in self._rows else self._dense[i]
            pairs.append((sparse.scaled(total, 1.0 / count), var))
        loss = self._loss / count
        if self._flagged:
            loss = tf.where(self._weight > 0, loss, self._plain / self._count)
        return loss, pairs, self._weight if self._flagged else None


def _refuse_mod_lookups(graph: tf.Graph) -> None:
    """Fail if a split table is looked up with partition_strategy='mod' (its parts hold rows by 'div')."""
    if mod := placement.mod_lookups(graph):
        raise ConfigError(
            f"embedding table {', '.join(mod)} is split into parts of contiguous rows but looked up with "
            "partition_strategy='mod': use tf.nn.embedding_lookup (TF 2's, which splits ids by 'div') "
            "or pass partition_strategy='div'"
        )


def _flag_weights(present: list[list[tf.Tensor]]) -> list[tf.Tensor | None]:
    """Per tower, 1.0 while every batch it read is real data, else 0.0 (all None: no flag was read)."""
    if not any(present):
        return [None] * len(present)
    return [
        tf.cast(tf.reduce_all(tf.stack(flags)), tf.float32) if flags else tf.constant(1.0)
        for flags in present
    ]


def visible_gpus() -> int:
    return len(tf.config.list_physical_devices("GPU"))


# Keras optimizers and the tf.compat.v1.train optimizer a v1 graph takes instead.
_V1_NAMES = {
    "Adam": "AdamOptimizer",
    "SGD": "GradientDescentOptimizer (MomentumOptimizer with momentum)",
    "Adagrad": "AdagradOptimizer",
    "RMSprop": "RMSPropOptimizer",
    "Ftrl": "FtrlOptimizer",
    "Adadelta": "AdadeltaOptimizer",
}


def _check_optimizer(optimizer) -> None:
    """A ConfigError naming what to give, unless `optimizer` is a `tf.compat.v1.train.Optimizer`.

    Every strategy builds a TF1 graph with the optimizer's `compute_gradients`
    and `apply_gradients`; Keras optimizers (`tf.keras.optimizers.*`, Keras 3
    or `tf_keras`) have no `compute_gradients`.
    """
    if isinstance(optimizer, v1.train.Optimizer):
        return
    if inspect.isroutine(optimizer) or isinstance(optimizer, functools.partial):
        raise ConfigError(
            "minimize() takes the optimizer, not a function that builds it: "
            "strategy.minimize(optimizer_fn(), loss_fn)"
        )
    kind = type(optimizer)
    v1_name = _V1_NAMES.get(kind.__name__)
    instead = f"tf.compat.v1.train.{v1_name}" if v1_name else "a tf.compat.v1.train optimizer"
    raise ConfigError(
        f"the optimizer is of type {kind.__name__} ({kind.__module__.split('.')[0]}), not a "
        f"tf.compat.v1.train.Optimizer, which disttrain's strategies need in their TF1 graphs; use {instead}"
    )


def scalar_loss(loss):
    """`loss` if it is a floating-point scalar tensor; else a ConfigError saying what to return."""
    if isinstance(loss, tuple | list | dict):
        raise ConfigError(
            f"the loss function returned a {type(loss).__name__}: return the loss alone, a scalar tensor "
            "(held-out metrics go in eval_fn)"
        )
    if not tf.is_tensor(loss):
        raise ConfigError(
            f"the loss function returned {type(loss).__name__}, not a tensor: return the loss, a scalar "
            "tensor built in the graph the function is called in"
        )
    if not loss.dtype.is_floating:
        raise ConfigError(f"the loss is {loss.dtype.name}: return a floating-point scalar")
    if loss.shape.rank:
        raise ConfigError(
            f"the loss has shape {loss.shape.as_list()}: return a scalar, such as tf.reduce_mean of the "
            "per-example losses (Keras losses such as tf.keras.losses.mean_squared_error return one per "
            "example)"
        )
    return loss


class Strategy(abc.ABC):
    """The base of every replica strategy: how the gradients of many replicas reach the variables.

    A subclass declares, as class attributes (read from the class by the
    benchmark, the planner and gin, with nothing built):

    - `kind`: what it does as the cost model and `--strategy` name it
      (`async_ps`, `sync_ps` or `allreduce`);
    - `synchronous`: one increment of the global step is every replica's
      step (True), or one replica's (False);
    - `uses_ps`: its variables live on 'ps' tasks (the cluster must have some);
    - `knobs`: the constructor arguments that change what crosses the network,
      which the planner reads back from a built strategy;
    - `baseline`: a layout to compare against (the benchmark's systems), not a
      `--strategy` choice;
    - optionally `recovers_in_process`, `gate_gradients`, `aggregate_clipped_at`,
      `votes_on_preemption` (see their comments below).

    It must override `apply_gradients(optimizer, grads_and_vars, global_step)`,
    which returns the train op; it is called once per step of a run
    (`steps_per_run`), in order, `step_in_run` saying which, and builds what
    a graph needs once in step 0. It may override, with these signatures:

    - `compute_gradients(optimizer, loss, read=None)`: this task's gradients
      (call the base's; `read` says how a tower reads a variable);
    - `device_setter()`, `variable_getter()` (what `scope()` installs),
      `plan_placement(build_fn)`, `plan_from(specs)`, `variable_devices`,
      `place_remaining(global_step)`: where variables go;
    - `examples_per_step(batch_size)`: examples one global step consumes
      (multiply the base's: it counts towers and accumulated micro-batches);
    - `hooks(last_step)`, `traced_loops()`, `scaffold(saver=None)`: what the session runs;
    - `device_filters()`, `session_config(intra_op_threads, inter_op_threads)`:
      what its servers and sessions need.

    A subclass calls `clip_aggregate(grads_and_vars)` where it holds the
    aggregate gradient (and names that place in `aggregate_clipped_at`).
    `minimize(optimizer, loss, global_step, check_numerics, batch_size, clip=)`,
    `input_context()` and `describe()` are the base's and not overridden:
    minimize plans, builds the towers, deduplicates sparse gradients, places
    the rest, checks numerics and clips per replica before `apply_gradients`.
    Strategies with variables on PS tasks derive from `PsStrategy`, which owns
    the plan, the pieces and their placement.
    """

    kind: str = ""  # set by every concrete strategy
    synchronous: bool = False
    uses_ps = False
    knobs: tuple[str, ...] = ()
    baseline = False
    # A subclass's own pieces of a build, as `self.made` holds them (its subclass of Made, with
    # their fields); one per build, so a new build starts from none.
    Made = building_lib.Made
    # After a lost peer, can MonitoredSession's new session carry on? (TF aborts
    # collectives for the rest of the process, so all-reduce must restart.)
    recovers_in_process = True
    # Its dense gradients are summed over a ring of the replicas (what crosses each link then).
    dense_over_ring = False
    # A restarted chief adopts the variables live PS tasks still hold (rather than restoring an
    # older checkpoint over them); False when part of the model lived in the replicas.
    adopts_live_ps_state = True
    # How optimizer.compute_gradients gates a backprop op's gradients (TF's default: all of an
    # op's input gradients are computed before any is used).
    gate_gradients = v1.train.Optimizer.GATE_OP
    # Where this strategy has the aggregate gradient in one place, for clip_where='aggregate'
    # (None: it never aggregates; see disttrain.graph.clipping). Subclasses that set it clip there
    # with `clip_aggregate`.
    aggregate_clipped_at: str | None = None
    # True when its replicas agree, inside a step, to stop after it (one of its hooks stops them
    # all when one is preempted); else a preempted replica stops on its own at its next boundary.
    votes_on_preemption = False
    # 0.1.0's names for the build, as views of the build in progress or the last one's record
    # (disttrain.strategies.building): read-only but for the three apply_gradients may set.
    loss = building_lib.view("loss")
    batch_size = building_lib.view("batch_size")
    accumulate_steps = building_lib.view("accumulate_steps")
    steps_per_run = building_lib.view("steps_per_run")
    step_in_run = building_lib.view("step_in_run")
    tower = building_lib.view("tower")
    micro_batch = building_lib.view("micro_batch")
    data_weight = building_lib.view("data_weight")
    no_data = building_lib.view("no_data")
    stop_at = building_lib.view("stop_at")
    steps_trained = building_lib.view("steps_trained")
    global_step_read = building_lib.view("global_step_read")
    global_step_refresh = building_lib.view("global_step_refresh")
    stop_step_read = building_lib.view("stop_step_read")

    def __init__(self, cluster: Cluster, num_towers: int | None = None, max_imbalance: float = 0.05):
        self.cluster = cluster
        gpus = visible_gpus()
        self.num_towers = num_towers or max(gpus, 1)
        if self.num_towers < 1:
            raise ConfigError(f"num_towers must be >= 1, got {self.num_towers}")
        if gpus and self.num_towers > gpus:
            raise ConfigError(f"num_towers={self.num_towers} but this task sees {gpus} GPUs")
        self.use_gpus = gpus > 0
        self.max_imbalance = max_imbalance
        if self.uses_ps and not cluster.is_local and cluster.num_ps == 0:
            raise ConfigError(f"{type(self).__name__} needs at least one 'ps' task in the cluster")
        # The minimize() call in progress, the last one's record and where variables go: the only
        # state a strategy changes after this constructor (disttrain.strategies.building).
        self._record = building_lib.Record()

    # ---- devices ----------------------------------------------------

    @property
    def compute_devices(self) -> list[str]:
        """One device per tower: this task's GPUs, else its (virtual) CPUs."""
        kind = "GPU" if self.use_gpus else "CPU"
        return [f"{self.cluster.task_device}/device:{kind}:{i}" for i in range(self.num_towers)]

    @property
    def input_device(self) -> str:
        return f"{self.cluster.task_device}/device:CPU:0"

    @property
    def variable_devices(self) -> list[str]:
        """Where `scope()` puts variables: this task's first compute device (PsStrategy: its PS)."""
        return [self.compute_devices[0]]

    # ---- placement ----------------------------------------------------

    @property
    def plan(self) -> placement.Plan | None:
        """The plan of variables over the PS tasks (PsStrategy makes one; None: no plan)."""
        return self._record.placed.plan

    @property
    def setter(self) -> placement.DeviceSetter | None:
        """The device setter `scope()` installed: a callable op -> device with `tower(device)` and `plan`."""
        return self._record.placed.setter

    @property
    def tables(self) -> frozenset[str] | None:
        """Embedding tables by name, known from the scratch build that made the plan (None: not known):
        towers never copy them, each looks its rows up where the table is."""
        return self._record.placed.tables

    @property
    def placed_whole(self) -> Sequence[placement.Unsplit]:
        """The variables placed whole because they were too large for a fair share."""
        return self._record.placed.placed_whole

    @property
    def made(self) -> building_lib.Made:
        """This strategy's own pieces of the build in progress, else of the last one it took part in."""
        return self._record.made_by(self)

    def plan_placement(self, build_fn: Callable[[], object]) -> placement.Plan | None:
        """Plan placement from the variables `build_fn` creates (PsStrategy: balance them by bytes).

        Builds `build_fn()` in a scratch graph to read variable shapes, so call
        it with the same variable names the real model will use. Without a plan
        variables still go greedily by bytes, in creation order, unsplit.
        """
        self._record.placed.plan = self.plan_from(placement.collect_variables(build_fn))
        return self.plan

    @contextlib.contextmanager
    def scope(self):
        """Variables created inside go where this strategy places them: each op where
        `device_setter()` says, each variable made as `variable_getter()` makes it."""
        setter = self._record.placed.setter = self.device_setter()
        getter = self.variable_getter()
        with (
            v1.get_default_graph().device(setter),
            v1.variable_scope(v1.get_variable_scope(), custom_getter=getter),
        ):
            yield self

    def device_setter(self) -> placement.DeviceSetter:
        """What `scope()` places ops with: a callable op -> device, with a `tower(device)` context and a
        `plan` attribute that `minimize()` sets (here: variables by bytes, as the plan says)."""
        devices = self.variable_devices, self.compute_devices[0], self.input_device
        return placement.DeviceSetter(*devices, self.plan)

    def variable_getter(self) -> Callable:
        """The custom getter `scope()` makes variables with (here: split as the plan says, planned
        later by minimize() too)."""
        return placement.partitioning_getter(lambda: self.plan)

    # ---- gradients ----------------------------------------------------

    def _build_towers(self, optimizer, loss_fn: Callable[[], tf.Tensor], read: Callable | None = None):
        """Call loss_fn per tower and micro-batch; return (losses, [(grad, var)], data weights) per tower.

        With `accumulate_steps` k, each tower's loss is built k times, each
        reading the next batch of its pipeline (`InputContext.get_next`) after
        the previous micro-batch's gradients are summed, and the tower's loss
        and gradients are the mean over its micro-batches with data. A data
        weight is None when no flag was read (`_tower_mean`).

        Each trainable `get_variable` variable is read once per step onto this
        host, by `read(variable) -> tensor` (default: a plain read), and the
        towers share that copy, so a host pulls each variable once however
        many devices it has. Gradients are taken with respect to the copies.
        Embedding tables (the plan's) are never copied: each tower looks its
        rows up where the table is. Other variables (Keras layers) are read by
        each tower where they are, and their gathers run where they are too
        (`sparse.gather_on_tables`). Each tower's gradients come from
        `optimizer.compute_gradients` (a wrapper's override included: clipping,
        Horovod-style transforms), over the copies where there are copies.
        """
        cached: dict[str, tuple[tf.Tensor, list]] = {}
        graph = v1.get_default_graph()
        caching_getter = self._caching_getter(read or tf.identity, cached)
        towers = [_MicroBatches() for _ in self.compute_devices]
        losses, tower_grads, present = [], [], []
        build = self.building
        for m in range(build.accumulate_steps):
            for i, device in enumerate(self.compute_devices):
                build.tower, build.micro_batch = i, m
                name = f"tower_{i}" if m == 0 else f"tower_{i}_micro_{m}"
                with (
                    self.setter.tower(device),
                    tf.name_scope(name),
                    v1.variable_creator_scope(functools.partial(_named_as_one_tower, graph, name)),
                    v1.variable_scope(
                        v1.get_variable_scope(), reuse=True if i or m else None, custom_getter=caching_getter
                    ),
                    tf.control_dependencies(towers[i].last),  # one micro-batch at a time
                ):
                    before, flags = len(graph.get_operations()), input_context.flag_count(graph)
                    loss = self._call_loss(loss_fn)
                    flags = input_context.flags_since(graph, flags)
                    copies = [pair for _, pairs in cached.values() for pair in pairs]
                    sparse.gather_on_tables(graph.get_operations()[before:], keep=[c for c, _ in copies])
                    # Variables get_variable did not make (Keras layers, tf.Variable) have no copy:
                    # the towers read them where they are, and their gradients are taken directly.
                    copied = {v.ref() for _, v in copies}
                    copies += [(v, v) for v in v1.trainable_variables() if v.ref() not in copied]
                    pairs = _gradients_of_copies(optimizer, loss, copies)
                    if build.accumulate_steps > 1:
                        towers[i].add(loss, pairs, flags)
                    else:
                        losses.append(loss)
                        tower_grads.append(pairs)
                        present.append(flags)
        build.tower = build.micro_batch = 0
        if build.accumulate_steps == 1:
            return losses, tower_grads, _flag_weights(present)
        with self.setter.tower(self.compute_devices[0]), tf.name_scope("micro_batch_mean"):
            return tuple(map(list, zip(*(tower.mean() for tower in towers), strict=True)))

    def _call_loss(self, loss_fn: Callable[[], tf.Tensor]) -> tf.Tensor:
        """`loss_fn()`; refused when a repeated build of a tower (a later micro-batch or step) makes
        new variables or input iterators: each would start afresh instead of going on."""
        repeat = self.building.reads_again
        graph = v1.get_default_graph()
        ops, variables = len(graph.get_operations()), len(v1.global_variables())
        loss = loss_fn()
        if not repeat:
            return loss
        new_variables = v1.global_variables()[variables:]
        iterators = [op for op in graph.get_operations()[ops:] if op.type in _ITERATOR_OPS]
        if new_variables or iterators:
            made = (
                f"variable {new_variables[0].op.name}"
                if new_variables
                else f"input iterator {iterators[0].name}"
            )
            raise ConfigError(
                f"the loss function made a new {made} when called again for the same tower (with "
                "accumulate_steps or steps_per_run it is called once per micro-batch and step, and each "
                "call must read the next batch with the same variables): create variables once "
                "(get_variable, or a Keras model built outside the loss function) and read input with "
                "ctx.get_next(dataset) or an iterator kept per graph"
            )
        return loss

    def _caching_getter(self, read: Callable, cached: dict) -> Callable:
        """A custom getter that reads each trainable non-table variable once, by `read`, into `cached`."""
        tables = self.tables or frozenset()

        def caching_getter(getter, name, *args, **kwargs):
            var = getter(name, *args, **kwargs)
            if kwargs.get("trainable") is False or name in tables:
                return var
            if name not in cached:
                with self.setter.tower(self.compute_devices[0]), tf.name_scope("cached_read"):
                    parts = placement.variable_parts(var)
                    copies = [read(p) for p in parts]
                    if len(copies) == 1:
                        value = copies[0]
                    else:
                        value = tf.concat(copies, axis=self.plan.parts[name][0])
                cached[name] = (value, list(zip(copies, parts, strict=True)))
            return cached[name][0]

        return caching_getter

    def compute_gradients(
        self, optimizer, loss, read: Callable | None = None
    ) -> list[tuple[tf.Tensor, tf.Variable]]:
        """Gradients of the mean loss over this task's towers, averaged on the host.

        `read` (see _build_towers) needs a loss function, even with one tower.
        Gathers from whole reads of a variable (Keras' Embedding) are moved
        onto the variable before any gradient is taken (`sparse.gather_on_tables`).
        """
        build = self.building
        if not callable(loss):
            if self.num_towers > 1 or read is not None or build.accumulate_steps > 1:
                raise ConfigError(
                    f"{type(self).__name__} with several towers, micro-batches or worker-side copies needs "
                    "minimize() to get a loss function, not a loss tensor"
                )
            build.loss = loss
            sparse.gather_on_tables(loss.graph.get_operations())
            return [
                (g, v)
                for g, v in optimizer.compute_gradients(loss, gate_gradients=self.gate_gradients)
                if g is not None
            ]
        if self.num_towers == 1 and read is None and build.accumulate_steps == 1:
            graph = v1.get_default_graph()
            before, flags = len(graph.get_operations()), input_context.flag_count(graph)
            with self.setter.tower(self.compute_devices[0]):
                loss = self._call_loss(loss)
            sparse.gather_on_tables(graph.get_operations()[before:])
            pairs = [
                (g, v)
                for g, v in optimizer.compute_gradients(loss, gate_gradients=self.gate_gradients)
                if g is not None
            ]
            losses, tower_grads = [loss], [pairs]
            weights = _flag_weights([input_context.flags_since(graph, flags)])
        else:
            losses, tower_grads, weights = self._build_towers(optimizer, loss, read)
        with self.setter.tower(self.compute_devices[0]), tf.name_scope("tower_mean"):
            return self._tower_mean(losses, tower_grads, weights)

    def _tower_mean(self, losses, tower_grads, weights) -> list[tuple[tf.Tensor, tf.Variable]]:
        """This replica's gradients: the mean over its towers' batches that were real data this step.

        `weights`: per tower, how many of its batches (micro-batches) were
        real data, or None where it read no data-present flag (all None: the
        plain mean). Sets the build's `loss` (the same mean of the towers'
        losses) and, when any tower reads through `InputContext.get_next`, its
        `data_weight` (the sum of the weights). A step with none has zero
        gradients.
        """
        build = self.building
        if all(w is None for w in weights):
            if len(losses) == 1:
                build.loss = losses[0]
                return tower_grads[0]
            build.loss = tf.add_n(losses) / len(losses)
            share = 1.0 / len(losses)
        else:
            weights = [tf.constant(1.0) if w is None else w for w in weights]
            build.data_weight = tf.add_n(weights)
            share = 1.0 / tf.maximum(build.data_weight, 1.0)
            mean = tf.add_n([w * loss for w, loss in zip(weights, losses, strict=True)]) * share
            # A step with no data at all reports its stand-in loss: the update is skipped anyway.
            build.loss = tf.where(build.data_weight > 0, mean, tf.add_n(losses) / len(losses))
        averaged = []
        for pairs in zip(*tower_grads, strict=True):
            grads, var = [g for g, _ in pairs], pairs[0][1]
            averaged.append((_weighted_sum(grads, weights, share), var))
        return averaged

    def minimize(
        self,
        optimizer,
        loss,
        global_step=None,
        check_numerics: bool = False,
        batch_size: int | None = None,
        *,
        clip: Clip | None = None,
        accumulate_steps: int | None = 1,
        steps_per_run: int | None = 1,
    ) -> tf.Operation:
        """Build the train op: gradients of `loss` applied as this strategy says.

        Placement: a strategy with no plan yet plans one from `loss` (a loss
        function): a model whose variables all come from `get_variable` is
        built once more in a scratch graph to read their shapes (and which are
        embedding tables), so large ones are split; any other variable (Keras
        layers, `tf.Variable`, variables made before `scope()`) is placed whole
        once the graph is built (`place_remaining`).

        Also runs the first tower's state updates with the step: the
        UPDATE_OPS collection (batch norm written for v1 graphs) and the
        variable assignments `loss` builds that nothing else runs (Keras 3
        layers, such as BatchNormalization's moving statistics, assign in
        their call and leave the op to whoever runs the graph).

        With `check_numerics`, a NaN or Inf in any gradient fails the step
        before anything is applied (each gradient is checked on its own, so
        pushing early gradients still overlaps the rest of backprop), and the
        variables, hence the checkpoints, never hold a diverged value.
        `clip`: clip the gradient by its global norm, this replica's (after
        its towers are averaged) or the aggregate's (`disttrain.graph.clipping`).
        A loss function that takes one argument gets the `InputContext` of
        the tower it builds (its replica and tower, `batch_size`, `shard()`,
        `get_next()`). NumPy arrays its datasets are built from are fed when
        the input starts (`disttrain.graph.input_feeds`), not written into the graph.
        `accumulate_steps` k: each update is the mean gradient of k
        micro-batches per tower, built one after the other (`_build_towers`);
        the state updates are the first micro-batch's. `steps_per_run` s: the
        train op makes s steps, one after the other, each reading the
        variables its predecessor updated and the next batch of each
        pipeline; `apply_gradients` is called once per step (`step_in_run`).
        Both need a loss function.
        Call inside `scope()`. Returns `build_step(...)`'s train op; the
        record of the whole build is `self.built`.
        """
        return self.build_step(
            optimizer,
            loss,
            global_step,
            check_numerics,
            batch_size,
            clip=clip,
            accumulate_steps=accumulate_steps,
            steps_per_run=steps_per_run,
        ).train_op

    def build_step(
        self,
        optimizer,
        loss,
        global_step=None,
        check_numerics: bool = False,
        batch_size: int | None = None,
        *,
        clip: Clip | None = None,
        accumulate_steps: int | None = 1,
        steps_per_run: int | None = 1,
    ) -> Step:
        """`minimize()`, returning the record of what it built (`disttrain.strategies.building.Step`):
        the train op, the loss, and what the training loop fetches and feeds."""
        if self.setter is None:
            raise RuntimeError("call minimize() inside strategy.scope()")
        _check_optimizer(optimizer)
        self.check_clip(clip)
        build = Building(
            global_step=global_step,
            batch_size=batch_size,
            accumulate_steps=steps_count(accumulate_steps, "accumulate_steps"),
            steps_per_run=steps_count(steps_per_run, "steps_per_run"),
            aggregate_clip=clip.norm if clip is not None and clip.where == "aggregate" else None,
        )
        if not callable(loss) and (build.accumulate_steps > 1 or build.steps_per_run > 1):
            raise ConfigError(
                "accumulate_steps and steps_per_run build the loss once per micro-batch and step: give "
                "minimize() a loss function, not a loss tensor"
            )
        with self.building_within(build):
            loss = self._prepared_loss(loss)
            self._plan_from_loss(loss)
            if build.global_step is None:
                build.global_step = v1.train.get_or_create_global_step()
            train_op = None
            trained = []
            for step in range(build.steps_per_run):
                build.step_in_run = step
                with self._after_step(train_op):
                    train_op = self._build_step(optimizer, loss, build.global_step, check_numerics, clip)
                trained.append(self._trained())
            if build.steps_per_run > 1:
                run_steps.mark(train_op, build.steps_per_run)
            steps_trained = None if None in trained else tf.add_n(trained, name="steps_trained")
        self._record.built = Step.of(build, train_op, steps_trained)
        return self._record.built

    def _prepared_loss(self, loss):
        """The loss function as the towers call it: given its input context if it takes one, checked
        scalar, its datasets' NumPy arrays fed when the input starts (not constants); or the tensor."""
        if callable(loss) and input_context.takes_context(loss):
            loss = functools.partial(lambda fn: fn(self.input_context()), loss)
        if callable(loss):
            return input_feeds.feeding(functools.partial(lambda fn: scalar_loss(fn()), loss))
        scalar_loss(loss)
        return loss

    @property
    def building(self) -> Building:
        """The `minimize()` call in progress: its settings, where it is, what it has made so far.

        Outside one (`compute_gradients` called on its own), what such calls make.
        """
        record = self._record
        return record.building if record.building is not None else record.loose

    @property
    def built(self) -> Step | None:
        """The record of the last `minimize()` call (None before any)."""
        return self._record.built

    @contextlib.contextmanager
    def building_within(self, build: Building):
        """Build as part of `build`: a strategy used inside another's step (a hybrid's ring) shares it."""
        outer, self._record.building = self._record.building, build
        self._record.last = build
        try:
            yield build
        finally:
            self._record.building = outer

    def _trained(self) -> tf.Tensor | None:
        """1 (int64) if the step just built trained: it had data and came before `stop_at`; else 0.

        None when every step trains (input that never ends, one step per run).
        """
        weight = self.building.data_weight
        conditions = [c for c in (self._before_the_end(), weight) if c is not None]
        if not conditions:
            return None
        with tf.name_scope("trained"):
            if weight is not None:
                conditions[-1] = weight > 0
            return tf.cast(tf.reduce_all(tf.stack(conditions)), tf.int64)

    @contextlib.contextmanager
    def _after_step(self, previous: tf.Operation | None):
        """Where a run's next step is built: after `previous` (its updates, its reads of the input),
        with its variables."""
        if previous is None:
            yield
            return
        with (
            tf.name_scope(f"step_{self.building.step_in_run}"),
            v1.variable_scope(v1.get_variable_scope(), reuse=True),
            tf.control_dependencies([previous]),
        ):
            yield

    def _build_step(
        self, optimizer, loss, global_step, check_numerics: bool, clip: Clip | None
    ) -> tf.Operation:
        """One training step of the run: gradients, their checks, the state updates, apply_gradients."""
        graph = v1.get_default_graph()
        build = self.building
        updates_before = 0 if build.step_in_run == 0 else len(v1.get_collection(v1.GraphKeys.UPDATE_OPS))
        loss, state_updates = _recording_state_updates(loss, graph) if callable(loss) else (loss, [])
        try:
            grads_and_vars = self.compute_gradients(optimizer, loss)
        except ValueError as error:
            if "No variables to optimize" not in str(error):
                raise
            raise ConfigError(
                "the loss depends on no trainable variable of training's graph. A subclassed Keras "
                "model first called in the loss function holds those of disttrain's planning graph "
                "(Keras builds it there, tracing its call): build it before training by calling it once "
                "on a batch, e.g. model(tf.zeros([1, ...]))"
            ) from error
        _refuse_mod_lookups(graph)
        with self.setter.tower(self.compute_devices[0]), tf.name_scope("deduplicate"):
            grads_and_vars = [
                (sparse.deduplicated(g) if sparse.is_sparse(g) else g, v) for g, v in grads_and_vars
            ]
        if build.step_in_run == 0:
            # Before apply_gradients, so that optimizer slots and whatever a strategy puts beside a
            # variable (accumulators, transfer casts) are made where the variable already is.
            self.place_remaining(global_step)
        grads_and_vars = self._guarded(grads_and_vars, check_numerics, clip)
        # The first tower's (and micro-batch's) state updates made by this step.
        prefix = graph.get_name_scope() + "/" if build.step_in_run else ""
        prefix += "tower_0/" if self.num_towers > 1 or build.accumulate_steps > 1 else ""
        made = v1.get_collection(v1.GraphKeys.UPDATE_OPS)[updates_before:]
        updates = [op for op in made if op.name.startswith(prefix)]
        # A schedule in epochs or with linear_scaling reads the global batch while the update is built.
        batch = schedules.global_batch(self.examples_per_step(build.batch_size)) if build.batch_size else None
        with batch or contextlib.nullcontext():
            step = self.apply_gradients(optimizer, grads_and_vars, global_step)
        if not updates and not state_updates:
            return step
        # Grouped with the step, not made its control inputs: apply_gradients also builds ops that run
        # on their own (the sync aggregator's, the overlap's transfer loop, a hook's drain), and under
        # the updates' control dependencies each of those runs would compute the forward pass again
        # and read a batch of input that no step trains on.
        with self.setter.tower(self.compute_devices[0]):
            return tf.group(step, *updates, *state_updates, name="step_and_state_updates")

    def check_clip(self, clip: Clip | None) -> None:
        """Refuse (ConfigError) an aggregate clip this strategy has no place for."""
        if clip is not None and clip.where == "aggregate" and self.aggregate_clipped_at is None:
            raise ConfigError(
                f"clip_where='aggregate': {type(self).__name__} never aggregates gradients (each "
                "replica's update is applied alone); use clip_where='replica'"
            )

    def _plan_from_loss(self, loss) -> None:
        """Plan from a scratch build of the loss function unless planned; hand the setter the plan."""
        if self.plan is None and self.tables is None and callable(loss):
            try:
                self._record.placed.plan = self.plan_from(placement.collect_get_variables(loss))
            except placement.NotReplayable:
                pass  # placed whole after the build
            self.setter.plan = self.plan

    def _guarded(self, grads_and_vars, check_numerics: bool, clip: Clip | None):
        """The gradients checked for NaN and Inf, and clipped per replica, as minimize() was asked."""
        if check_numerics:
            grads_and_vars = [
                (_checked(g, f"{NON_FINITE} gradient of {v.op.name}"), v) for g, v in grads_and_vars
            ]
        if clip is not None and clip.where == "replica":
            with self.setter.tower(self.compute_devices[0]):
                grads_and_vars = clip_by_global_norm(grads_and_vars, clip.norm)
        return grads_and_vars

    def plan_from(self, specs) -> placement.Plan | None:
        """The plan for these variable specs (here: none); notes which are embedding tables."""
        self._record.placed.tables = frozenset(s.name for s in specs if s.table)
        return None

    def place_remaining(self, global_step) -> None:
        """Place the variables no plan placed, before `apply_gradients` (here: nothing to do)."""
        del global_step  # variables stay where scope() put them

    @abc.abstractmethod
    def apply_gradients(self, optimizer, grads_and_vars, global_step) -> tf.Operation:
        """Bring this step's gradients to the variables."""

    def when_data(self, update: Callable[[], object], weight: tf.Tensor | None = None) -> tf.Operation:
        """`update()`, built to run only in a step where `weight` (default: `data_weight`) is above 0.

        A step whose pipelines have all ended (`input_context.joined`) then
        changes nothing, not even the global step, and sets `no_data`, after
        which the loop stops. Without a weight (input that never ends, or a
        loss not read through `InputContext.get_next`) it is `update()` itself.
        With several steps per run, a step of the run at or past `stop_at`
        (fed by the loop: the last step) changes nothing either.
        """
        build = self.building
        weight = build.data_weight if weight is None else weight
        live = self._before_the_end()
        if weight is None and live is None:
            return update()
        with tf.name_scope("when_data"):
            conditions = [] if live is None else [live]
            if weight is not None:
                build.no_data = tf.less_equal(weight, 0.0, name="no_data")
                conditions.append(weight > 0)
            go = tf.reduce_all(tf.stack(conditions)) if len(conditions) > 1 else conditions[0]
            return tf.cond(go, lambda: tf.group(update()), tf.no_op)

    def _before_the_end(self) -> tf.Tensor | None:
        """True while the step being built is before `stop_at` (None with one step per run).

        Counted from the global step read once at the start of the run (not
        after the previous step, which other replicas may also move: async),
        so a run never takes this replica past the last step.
        """
        build = self.building
        if build.steps_per_run == 1:
            return None
        if build.run_start is None:
            graph = v1.get_default_graph()
            with graph.control_dependencies(None), graph.name_scope("run_start/"):
                build.stop_at = v1.placeholder_with_default(tf.constant(2**62, tf.int64), [], name="stop_at")
                build.run_start = tf.identity(build.global_step.read_value(), name="global_step")
        return build.run_start + build.step_in_run < build.stop_at

    def clip_aggregate(self, grads_and_vars, colocate: bool = False):
        """The aggregate gradient clipped by its global norm when minimize() was asked to; else as given."""
        norm = self.building.aggregate_clip
        if norm is None:
            return grads_and_vars
        return clip_by_global_norm(grads_and_vars, norm, colocate)

    # ---- what the loop needs ----------------------------------------

    def input_context(self) -> input_context.InputContext:
        """What the input pipeline of the tower being built feeds (see `disttrain.graph.input_context`)."""
        local = self.cluster.is_local
        return input_context.InputContext(
            replica_index=0 if local else max(self.cluster.replica_index, 0),
            num_replicas=1 if local else self.cluster.num_replicas,
            tower_index=self.tower,
            num_towers=self.num_towers,
            batch_size=self.batch_size,
            global_batch_size=self.examples_per_step(self.batch_size) if self.batch_size else None,
            reads_again=self.micro_batch > 0 or self.step_in_run > 0,
        )

    def describe(self) -> str:
        """This strategy and its settings, as it was built (for logs and TensorBoard)."""
        names = [n for n in inspect.signature(type(self).__init__).parameters if n not in ("self", "cluster")]
        knobs = ", ".join(f"{n}={getattr(self, n)!r}" for n in names if hasattr(self, n))
        return f"{type(self).__name__}({knobs})"

    def examples_per_step(self, batch_size: int) -> int:
        """Examples consumed per increment of the global step (async: one replica's), micro-batches
        counted."""
        return batch_size * self.num_towers * self.accumulate_steps

    def hooks(self, last_step: int | None = None, notice: preemption.Notice | None = None) -> list:
        """Session hooks this strategy needs (built after minimize()); training ends at `last_step`.

        `notice`: this task's preemption notice, which hooks that stop or vote
        on a preemption read (None: the process's, `preemption.PROCESS`).
        """
        return []

    def traced_loops(self) -> list:
        """Loops this strategy runs beside the step that a step trace should show too.

        Each has `trace(rounds)` (trace its next rounds), `stop_tracing()`
        (start no more; True while a traced round still runs) and
        `take_traces()` (the StepStats of the rounds traced since the last
        call).
        """
        return []

    def scaffold(self, saver=None) -> tf.compat.v1.train.Scaffold:
        """The session scaffold (init, ready and local-init ops) for this task (after minimize()).

        The default waits for the chief to initialise shared variables;
        strategies whose replicas hold their own variables override it.
        """
        return v1.train.Scaffold(saver=saver)

    def device_filters(self) -> list[str]:
        """Which tasks this task talks to (others are not contacted at all)."""
        if self.cluster.is_local:
            return []
        return ["/job:ps", self.cluster.task_name]

    def session_config(
        self, intra_op_threads: int = 0, inter_op_threads: int = 0
    ) -> tf.compat.v1.ConfigProto:
        """ConfigProto for this task's server and sessions."""
        config = v1.ConfigProto(
            allow_soft_placement=True,
            intra_op_parallelism_threads=intra_op_threads,
            inter_op_parallelism_threads=inter_op_threads,
        )
        config.device_filters.extend(self.device_filters())
        if not self.use_gpus and self.num_towers > 1:
            config.device_count["CPU"] = self.num_towers
        if self.use_gpus:
            config.gpu_options.allow_growth = True
        return config

    def config(self, intra_op_threads: int = 0, inter_op_threads: int = 0) -> tf.compat.v1.ConfigProto:
        """Deprecated alias of `session_config()` (renamed in 0.1.0); goes no sooner than 0.3.0.

        Returns what `session_config()` returns; warns once per process.
        """
        _warn_renamed("Strategy.config()", "Strategy.session_config()")
        return self.session_config(intra_op_threads, inter_op_threads)


_WARNED: set[str] = set()  # renamed names already warned about in this process


def _warn_renamed(old: str, new: str) -> None:
    """One DeprecationWarning per process for `old`, pointed at the caller's line."""
    if old not in _WARNED:
        _WARNED.add(old)
        warnings.warn(
            f"{old} is deprecated: use {new} (the same; {old} goes no sooner than disttrain 0.3.0)",
            DeprecationWarning,
            stacklevel=3,
        )
