"""Where every op runs: variables balanced across PS tasks by bytes, the rest on the worker.

The plan is made from variable *shapes*, not from op outputs: in TF 2 graph
mode a variable is a resource handle whose output has size 0, so load
functions that read the output shape (as TF's old `byte_size_load_fn` did)
put everything on ps0.

Placement happens in two passes so that it can be optimal and the same on
every task:

1. `collect_variables(build_fn)` builds the model once in a scratch graph and
   reads each variable's shape and dtype.
2. `make_plan(specs, num_ps)` splits variables larger than a piece limit into
   parts along their longest axis and assigns the pieces largest first to the
   least-loaded PS. It lowers the piece limit until the most loaded PS carries
   at most `1 + max_imbalance` times the mean. The plan is a pure function of
   the shapes, so every task computes the same one.

The real graph is then built under `DeviceSetter` (a device function) and
`partitioning_getter` (a variable-scope custom getter that makes the planned
variables partitioned). Variables the plan does not know (created by
optimizers or user code) go greedily to the least-loaded PS; optimizer slots
and update ops follow their variable through TF's colocation groups.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import tensorflow as tf

from disttrain.base.tf_internals import PartitionedVariable, set_device

v1 = tf.compat.v1

# Ops that hold state and belong on a PS (TF's STANDARD_PS_OPS, minus removed ones).
VARIABLE_OPS = frozenset(
    {
        "Variable",
        "VariableV2",
        "VarHandleOp",
        "AutoReloadVariable",
        "MutableHashTable",
        "MutableHashTableV2",
        "MutableHashTableOfTensors",
        "MutableHashTableOfTensorsV2",
        "MutableDenseHashTable",
        "MutableDenseHashTableV2",
    }
)
# Input-pipeline ops run on the worker's CPU even when it has a GPU.
_INPUT_OP_SUFFIXES = ("Dataset", "DatasetV2", "DatasetV3", "DatasetV4")
_INPUT_OPS = frozenset(
    {
        "Iterator",
        "IteratorV2",
        "AnonymousIterator",
        "AnonymousIteratorV2",
        "AnonymousIteratorV3",
        "MakeIterator",
        "IteratorGetNext",
        "IteratorGetNextSync",
        "IteratorToStringHandle",
        "IteratorFromStringHandleV2",
        "OptionalGetValue",
        "DecodeJpeg",
        "DecodeAndCropJpeg",
        "ParseExampleV2",
        "ParseSingleExample",
        "TFRecordReaderV2",
    }
)


# No piece may be larger than one gRPC message (2 GiB, less room for its header): a variable
# that is ever sent whole (a dense read, a checkpoint restore to its PS) must fit in one.
MAX_PIECE_BYTES = 2**31 - 2**20
# A table is spread over every PS when each part would get at least this many rows; smaller
# ones (a few dozen rows: few lookups per step) are placed whole like any variable.
MIN_TABLE_ROWS_PER_PART = 64
# How a step reads rows of a table: only these ops, never the whole variable.
_ROW_READ_OPS = frozenset({"ResourceGather", "ResourceGatherNd"})


@dataclasses.dataclass(frozen=True)
class VariableSpec:
    """A variable's name (op name, no `:0`), shape and bytes per element.

    `table`: an embedding table, a variable the model reads by rows (its
    handle feeds a gather). Tables are split by rows only, so that a lookup
    partitioned by contiguous rows ("div", as `tf.nn.embedding_lookup` does)
    finds each id in the part that holds it.
    """

    name: str
    shape: tuple[int, ...]
    itemsize: int
    table: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclasses.dataclass(frozen=True)
class Piece:
    name: str  # the variable op's name in the built graph (`w` or `w/part_2`)
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Plan:
    """The placement of every known variable: which PS holds each piece.

    `parts[name] = (axis, num_parts)` for variables that are split;
    `devices[op_name] = ps_task` for every piece (`w/part_i` for split ones).
    """

    num_ps: int
    devices: Mapping[str, int]
    parts: Mapping[str, tuple[int, int]]
    loads: tuple[int, ...]
    tables: frozenset[str] = frozenset()  # names of the variables that are embedding tables

    @property
    def max_over_mean(self) -> float:
        return max_over_mean(self.loads)


def max_over_mean(loads: Sequence[float]) -> float:
    """Load of the busiest PS over the mean load (1.0 is perfect balance)."""
    total = sum(loads)
    if not loads or total == 0:
        return 1.0
    return max(loads) / (total / len(loads))


def _spec_from_op(op: tf.Operation) -> VariableSpec | None:
    try:
        shape = tf.TensorShape(op.get_attr("shape"))
        dtype = tf.dtypes.as_dtype(op.get_attr("dtype"))
    except ValueError:
        return None
    if not shape.is_fully_defined():
        return None
    return VariableSpec(op.name, tuple(shape.as_list()), dtype.size, table=is_table(op))


def is_table(variable_op: tf.Operation) -> bool:
    """Whether the graph reads this variable by rows (a gather on its handle): an embedding table."""
    return any(c.type in _ROW_READ_OPS for t in variable_op.outputs for c in t.consumers())


def variable_specs(graph: tf.Graph) -> list[VariableSpec]:
    """Shape and dtype of every variable op in `graph`, from the op's attributes."""
    specs = []
    for op in graph.get_operations():
        if op.type in ("VarHandleOp", "VariableV2", "Variable"):
            spec = _spec_from_op(op)
            if spec is not None:
                specs.append(spec)
    return specs


def collect_variables(build_fn: Callable[[], object]) -> list[VariableSpec]:
    """Build `build_fn()` in a scratch graph and return its variables' specs."""
    with tf.Graph().as_default() as graph:
        build_fn()
    return variable_specs(graph)


class NotReplayable(Exception):
    """`build_fn` creates variables that a scratch graph cannot hold (Keras, tf.Variable)."""


def collect_get_variables(build_fn: Callable[[], object]) -> list[VariableSpec]:
    """Like `collect_variables`, for models whose variables all come from `get_variable`.

    Only `get_variable` makes a variable per graph by name, so only such a
    model can be built once more in a scratch graph without harm. Any other
    variable (a Keras layer's, a `tf.Variable`) raises NotReplayable before it
    is created, so a Keras layer is left unbuilt rather than built in the
    scratch graph; so does anything else `build_fn` raises there (a model that
    holds tensors of the real graph).
    """
    inside_get_variable = []

    def marking_getter(getter, *args, **kwargs):
        inside_get_variable.append(True)
        try:
            return getter(*args, **kwargs)
        finally:
            inside_get_variable.pop()

    def creator(next_creator, **kwargs):
        if not inside_get_variable:
            raise NotReplayable(f"variable {kwargs.get('name')!r} is not made by get_variable")
        return next_creator(**kwargs)

    with tf.Graph().as_default() as graph:
        try:
            with (
                v1.variable_scope(v1.get_variable_scope(), custom_getter=marking_getter),
                v1.variable_creator_scope(creator),
            ):
                build_fn()
        except NotReplayable:
            raise
        except Exception as e:  # noqa: BLE001  whatever breaks in the scratch graph
            first = (str(e).strip().splitlines() or [""])[0]
            raise NotReplayable(f"{type(e).__name__}: {first}") from e
    return variable_specs(graph)


def _split(spec: VariableSpec, limit: float) -> tuple[int, int]:
    """(axis, parts) so that no part of `spec` is larger than `limit` bytes (nor one gRPC message).

    Tables are split by rows; other variables along their longest axis.
    """
    limit = min(limit, MAX_PIECE_BYTES)
    if not spec.shape or spec.nbytes <= limit:
        return (0, 1)
    axis = 0 if spec.table else max(range(len(spec.shape)), key=lambda a: spec.shape[a])
    parts = min(spec.shape[axis], math.ceil(spec.nbytes / limit))
    return (axis, max(parts, 1))


def spec_pieces(spec: VariableSpec, axis: int, parts: int) -> list[Piece]:
    """The pieces a variable is cut into (axis, parts from the plan), each with its bytes."""
    if parts == 1:
        return [Piece(spec.name, spec.nbytes)]
    # TF's partitioned variables give the first (dim % parts) slices one extra row.
    dim = spec.shape[axis]
    row_bytes = spec.nbytes // dim
    base, extra = divmod(dim, parts)
    return [Piece(f"{spec.name}/part_{i}", (base + (i < extra)) * row_bytes) for i in range(parts)]


def _assign(
    pieces: Iterable[Piece], num_ps: int, loads: Sequence[int] = ()
) -> tuple[dict[str, int], list[int]]:
    """Largest first onto the least-loaded PS (ties: lowest task index), on top of `loads`."""
    loads = list(loads) or [0] * num_ps
    devices = {}
    for piece in sorted(pieces, key=lambda p: (-p.nbytes, p.name)):
        task = min(range(num_ps), key=lambda t: (loads[t], t))
        devices[piece.name] = task
        loads[task] += piece.nbytes
    return devices, loads


def _spread(tables: Sequence[VariableSpec], num_ps: int) -> tuple[dict, dict[str, int], list[int]]:
    """Tables cut into a multiple of num_ps parts by rows, dealt so that every PS holds a share of each.

    A step's traffic to a table follows its distinct ids, not its bytes: a
    table of 5,000 rows may be looked up as often as one of 140,000. Balancing
    whole tables by bytes left one PS of two with 1.9x the other's rows per
    step (DLRM, measured); an equal share of every table on every PS
    balances both bytes and lookups for ids spread over the rows, as hashed
    ids are.
    """
    parts, devices, loads = {}, {}, [0] * num_ps
    for t, spec in enumerate(tables):
        count = num_ps * math.ceil(spec.nbytes / (num_ps * MAX_PIECE_BYTES))
        parts[spec.name] = (0, count)
        for i, piece in enumerate(spec_pieces(spec, 0, count)):
            devices[piece.name] = (i + t) % num_ps
            loads[devices[piece.name]] += piece.nbytes
    return parts, devices, loads


def make_plan(
    specs: Sequence[VariableSpec], num_ps: int, max_imbalance: float = 0.05, piece_bytes: float | None = None
) -> Plan:
    """Balance `specs` over `num_ps` tasks within `1 + max_imbalance` of the mean.

    Embedding tables with at least MIN_TABLE_ROWS_PER_PART rows per PS are
    spread over every PS by rows (see `_spread`). The other variables are
    split as little as needed: first no variable larger than the mean load
    (nor than `piece_bytes`, when given) is kept whole, then the piece limit
    halves until the balance holds (or pieces can be split no further, in
    which case the best plan found is returned).
    """
    if num_ps < 1:
        raise ValueError(f"num_ps must be >= 1, got {num_ps}")
    spread = [s for s in specs if num_ps > 1 and s.table and s.shape[0] >= MIN_TABLE_ROWS_PER_PART * num_ps]
    spread_parts, spread_devices, spread_loads = _spread(spread, num_ps)
    rest = [s for s in specs if s.name not in spread_parts]
    total = sum(s.nbytes for s in specs)
    mean = total / num_ps
    best = None
    limit = min(float(mean) if num_ps > 1 else math.inf, piece_bytes or math.inf)
    for _ in range(12):
        parts = {s.name: _split(s, limit) for s in rest}
        pieces = [p for s in rest for p in spec_pieces(s, *parts[s.name])]
        devices, loads = _assign(pieces, num_ps, spread_loads)
        plan = Plan(
            num_ps=num_ps,
            devices={**spread_devices, **devices},
            parts={**spread_parts, **{n: ap for n, ap in parts.items() if ap[1] > 1}},
            loads=tuple(loads),
            tables=frozenset(s.name for s in specs if s.table),
        )
        if best is None or plan.max_over_mean < best.max_over_mean:
            best = plan
        if plan.max_over_mean <= 1 + max_imbalance or num_ps == 1:
            break
        limit /= 2
    return best


def mod_lookups(graph: tf.Graph) -> list[str]:
    """Tables split into parts whose lookups assign ids to parts by `id % parts` ("mod").

    Parts made by a partitioner hold contiguous rows (part 0 the first rows),
    so only a "div" lookup (`tf.nn.embedding_lookup`) finds id i in row i of
    the table. A "mod" lookup (`tf.compat.v1.nn.embedding_lookup`'s default)
    still trains, but row i of the checkpoint is not id i, and restoring with
    a different number of parts mixes up the rows. Found from the built
    graph: a DynamicPartition whose part numbers come from a FloorMod and
    whose outputs feed gathers on the table's parts.
    """
    found = []
    for op in graph.get_operations():
        if op.type != "DynamicPartition":
            continue
        source = op.inputs[1].op
        while source.type in ("Cast", "Identity"):
            source = source.inputs[0].op
        gathers = [c for t in op.outputs for c in t.consumers() if c.type in _ROW_READ_OPS]
        if source.type == "FloorMod" and gathers:
            found.append(gathers[0].inputs[0].op.name.rsplit("/part_", 1)[0])
    return sorted(set(found))


def partitioning_getter(plan: Plan | Callable[[], Plan | None]) -> Callable:
    """A variable-scope custom getter that partitions the variables the plan splits.

    `plan` may be a callable returning the current plan (or None), read at
    each variable's creation. A partitioner the caller gave explicitly wins.
    """
    current = plan if callable(plan) else (lambda: plan)

    def getter(getter, name, *args, **kwargs):
        split = current().parts.get(name) if current() is not None else None
        if split is not None and kwargs.get("partitioner") is None:
            axis, parts = split

            def partitioner(shape, dtype, axis=axis, parts=parts):
                del dtype
                return [parts if a == axis else 1 for a in range(len(shape))]

            kwargs["partitioner"] = partitioner
        return getter(name, *args, **kwargs)

    return getter


def variable_parts(var) -> list:
    """The variables a (possibly partitioned) variable is made of, in order."""
    return list(var) if isinstance(var, PartitionedVariable) else [var]


def _colocated_op(op: tf.Operation) -> tf.Operation | None:
    """The op that `op` must share a device with, if TF's colocation says so."""
    own = b"loc:@" + op.name.encode()
    for group in op.colocation_groups():
        if group != own:
            name = group[len(b"loc:@") :].decode()
            try:
                return op.graph.get_operation_by_name(name)
            except KeyError:
                return None
    return None


def _merge(default: str, own: str) -> str:
    """The op's own device fields win; missing ones come from `default`."""
    if not own:
        return default
    spec = tf.DeviceSpec.from_string(default)
    return spec.make_merged_spec(tf.DeviceSpec.from_string(own)).to_string()


def placed_device(op: tf.Operation) -> str:
    """The device TF's placer puts the built op `op` on, as far as the graph says.

    An op colocated with another (`loc:@`) goes with it, and an op that takes
    a resource handle goes where the resource is: TF's placer overrides a
    requested device that differs (a read built under a worker's device
    scope runs on the variable's PS). Otherwise the op's own device. Inside a
    function graph a captured handle is followed to the tensor it captures.
    Not known here: what soft placement or Grappler change afterwards.
    """
    seen = set()
    while op not in seen:
        seen.add(op)
        colocated = _colocated_op(op)
        handles = [t for t in op.inputs if t.dtype == tf.resource]
        if colocated is not None:
            op = colocated
        elif handles:
            op = captured(handles[0]).op
        else:
            break
    return op.device


def captured(tensor: tf.Tensor) -> tf.Tensor:
    """The outer tensor a function graph's placeholder captures (`tensor` itself when none)."""
    captures = getattr(tensor.graph, "captures", None) or ()
    for outer, inner in captures:
        if inner is tensor:
            return outer
    return tensor


def task_of(device: str) -> tuple[str | None, int | None]:
    """(job, task) of a device string; (None, None) for an empty one (the session's own task)."""
    spec = tf.DeviceSpec.from_string(device or "")
    return spec.job, spec.task if spec.job is None or spec.task is not None else 0


def is_input_op(op: tf.Operation) -> bool:
    return op.type in _INPUT_OPS or op.type.endswith(_INPUT_OP_SUFFIXES)


class DeviceSetter:
    """Device function: variables on their planned PS, input on worker CPU, compute on the worker device.

    Give it to `graph.device(...)`. `variable_devices` are the PS tasks, or
    for strategies without a PS the one local device that holds the
    variables. It never moves an op whose device already names a job, and a
    variable pinned by its creator is kept and never counted in the load
    table. `tower(device)` switches the compute device while a tower is built.
    """

    def __init__(
        self,
        variable_devices: Sequence[str],
        compute_device: str,
        input_device: str,
        plan: Plan | None = None,
    ):
        if not variable_devices:
            raise ValueError("DeviceSetter needs at least one variable device")
        self.variable_devices = tuple(variable_devices)
        self.compute_device = compute_device
        self.input_device = input_device
        self.plan = plan
        self.loads = [0] * len(variable_devices)  # bytes placed by this setter, per device
        self.unplanned: list[tf.Operation] = []  # variables placed without a plan, greedily
        # Where variables the plan does not name go instead (None: greedily onto variable_devices):
        # a hybrid strategy keeps them on the worker and only its planned tables on the PS.
        self.unplanned_device: str | None = None

    @contextlib.contextmanager
    def tower(self, device: str):
        saved, self.compute_device = self.compute_device, device
        try:
            yield
        finally:
            self.compute_device = saved

    def _variable_device(self, op: tf.Operation) -> str:
        if self.plan is not None and op.name in self.plan.devices:
            task = self.plan.devices[op.name]
        elif self.unplanned_device is not None:
            return self.unplanned_device
        else:
            task = min(range(len(self.loads)), key=lambda t: (self.loads[t], t))
            self.unplanned.append(op)
        spec = _spec_from_op(op)
        self.loads[task] += spec.nbytes if spec else 0
        return self.variable_devices[task]

    def __call__(self, op: tf.Operation) -> str:
        colocated = _colocated_op(op)
        if colocated is not None:
            return colocated.device or op.device
        if op.type in VARIABLE_OPS:
            if op.device and tf.DeviceSpec.from_string(op.device).job:
                return op.device  # pinned by its creator: keep it
            return _merge(self._variable_device(op), op.device)
        default = self.input_device if is_input_op(op) else self.compute_device
        return _merge(default, op.device)


@dataclasses.dataclass(frozen=True)
class Unsplit:
    """A variable placed whole that is larger than a PS's fair share."""

    name: str
    nbytes: int
    task: int


def place_whole(
    variable_ops: Sequence[tf.Operation], num_ps: int, loads: Sequence[int] = ()
) -> tuple[list[int], list[Unsplit]]:
    """Move variables to PS tasks whole, largest first onto the least-loaded, after the graph is built.

    For variables no plan knew before they were created (Keras layers,
    `tf.Variable`, variables made outside the strategy's scope): they cannot
    be split any more, but they can be balanced by bytes. Each variable op is
    moved with every op colocated with it (its reads, updates, initializer and
    optimizer slots). `loads` are the bytes already on each PS. Returns the
    new loads and the variables larger than the mean load, which keep that
    PS above it.
    """
    loads = list(loads) or [0] * num_ps
    specs = {op: _spec_from_op(op) for op in variable_ops}
    order = sorted(variable_ops, key=lambda op: (-(specs[op].nbytes if specs[op] else 0), op.name))
    moved: dict[bytes, str] = {}
    for op in order:
        task = min(range(num_ps), key=lambda t: (loads[t], t))
        loads[task] += specs[op].nbytes if specs[op] else 0
        device = tf.DeviceSpec.from_string(op.device).replace(job="ps", task=task, replica=None).to_string()
        moved[b"loc:@" + op.name.encode()] = device
    graph = variable_ops[0].graph if variable_ops else None
    for op in graph.get_operations() if graph else ():
        # Colocated ops (slots, initializers, updates) and every op that takes the variable's
        # handle (reads made under the variable's old device) go where the variable goes.
        groups = [*op.colocation_groups(), *(b"loc:@" + t.op.name.encode() for t in op.inputs)]
        device = next((moved[g] for g in groups if g in moved), None)
        if device is not None:
            own = tf.DeviceSpec.from_string(op.device).replace(job=None, task=None, replica=None).to_string()
            set_device(op, _merge(device, own))
    mean = sum(loads) / num_ps if num_ps else 0
    unsplit = [
        Unsplit(op.name, specs[op].nbytes, int(tf.DeviceSpec.from_string(op.device).task))
        for op in order
        if specs[op] and specs[op].nbytes > mean
    ]
    return loads, unsplit


def ps_loads(
    graph: tf.Graph, num_ps: int, include_slots: bool = True, tables: bool | None = None
) -> list[int]:
    """Bytes of variables on each PS task in a built graph (the placement report).

    Reads the devices actually assigned in `graph`, so it checks any device
    setter (ours or TF's round robin), not what a plan intended. `tables`:
    True counts embedding tables only, False everything else, None all.
    """
    loads = [0] * num_ps
    for op in graph.get_operations():
        if op.type not in ("VarHandleOp", "VariableV2", "Variable"):
            continue
        spec = tf.DeviceSpec.from_string(op.device)
        if spec.job != "ps" or spec.task is None:
            continue
        if not include_slots and _colocated_op(op) is not None:
            continue
        var = _spec_from_op(op)
        if var is not None and (tables is None or tables == var.table):
            loads[spec.task] += var.nbytes
    return loads


def report(graph: tf.Graph, num_ps: int, title: str = "placement") -> str:
    """The placement report of a built graph: variable bytes per PS, optimizer slots not counted."""
    return format_report(
        ps_loads(graph, num_ps, include_slots=False), title, ps_loads(graph, num_ps, False, tables=True)
    )


def format_report(loads: Sequence[int], title: str = "placement", table_loads: Sequence[int] = ()) -> str:
    """Human-readable bytes per PS and the max/mean ratio; embedding tables apart when there are any."""
    total, in_tables = sum(loads), sum(table_loads)
    lines = [f"{title}: {len(loads)} PS, {total / 2**20:.2f} MiB of variables"]
    if in_tables:
        lines[0] += f" ({in_tables / 2**20:.2f} MiB in embedding tables)"
    for task, load in enumerate(loads):
        share = 100.0 * load / total if total else 0.0
        line = f"  /job:ps/task:{task}  {load / 2**20:10.2f} MiB  {share:5.1f}%"
        if in_tables:
            dense = load - table_loads[task]
            line += f"   tables {table_loads[task] / 2**20:.2f} MiB, dense {dense / 2**20:.2f} MiB"
        lines.append(line)
    lines.append(f"  busiest PS / mean = {max_over_mean(loads):.3f}")
    return "\n".join(lines)


def round_robin_setter(num_ps: int, worker_device: str) -> Callable:
    """TF's default layout (`replica_device_setter`, round robin by count), for comparison."""
    return v1.train.replica_device_setter(ps_tasks=num_ps, worker_device=worker_device, ps_device="/job:ps")
