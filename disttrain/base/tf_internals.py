"""Every private TensorFlow internal disttrain uses, each with why, in one place.

Checked against TensorFlow 2.21.0 (graph mode through `tf.compat.v1`). None
of these is public API: a TensorFlow upgrade may rename or remove any of
them, so an upgrade starts here. Each entry says what breaks if it goes.
The rest of the package uses these functions, never the private names.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import tensorflow as tf

# Not exported by tf.*: the proto of a variable in a meta graph's collections (a checkpoint's `.meta`, a
# SavedModel's graph). The export reads which variables training trained from it, and keeps only the
# serving variables in a SavedModel's collections. Without it: `exporting` goes.
# `exporting` also relies on `tf.compat.v1.saved_model.Builder.add_meta_graph_and_variables` taking its
# meta graph from `saver.export_meta_graph(...)` (TF 2.21's builder_impl): that is where a SavedModel's
# graph is pruned. If it stops, SavedModels keep the whole graph they were built in (the evaluator's
# input pipeline: tests/unit/test_export.py fails).
from tensorflow.core.framework.variable_pb2 import VariableDef

# The v1 dataset class behind tf.compat.v1.data.Dataset and every v1 iterator: `make_one_shot_iterator`
# (the function and the method) call its `_make_one_shot_iterator`, `make_initializable_iterator` its
# `_make_initializable_iterator`. Without it: `intercepted_datasets` cannot reach users' iterators.
from tensorflow.python.data.ops.dataset_ops import DatasetV1

# Not exported by tf.compat.v1: what `get_variable` returns for a partitioned (split) variable.
# Placement needs it to list a split variable's parts. Without it: split variables go unrecognised.
from tensorflow.python.ops.variables import PartitionedVariable

# The v1 Saver's own mapping from variables to checkpoint keys (a split variable's parts are slices of one
# key). Without it: trainer.checkpoint_mismatch (the chief's start-up check of a checkpoint, and the
# export's) goes.
from tensorflow.python.training.saving.saveable_object_util import op_list_to_dict

v1 = tf.compat.v1

TF_VERSION_CHECKED = "2.21.0"

__all__ = [
    "TF_VERSION_CHECKED",
    "PartitionedVariable",
    "VariableDef",
    "RoundsQueueRunner",
    "add_control_input",
    "checkpoint_keys",
    "dataset_inputs",
    "in_control_flow",
    "intercepted_datasets",
    "set_device",
    "set_global_step_read",
    "timeline",
    "update_input",
]

# training_util.GLOBAL_STEP_READ_KEY: the collection where tf.compat.v1.train's hooks look up the
# tensor they fetch as the global step (filled on first use with a read of the variable).
_GLOBAL_STEP_READ_KEY = "global_step_read_op_cache"


def set_global_step_read(graph: tf.Graph, tensor: tf.Tensor) -> None:
    """Make TF's hooks fetch `tensor` as the global step.

    Why: AsyncParameterServer(overlap=True) keeps a worker-side mirror of the
    global step, so that a step never reads the variable on its PS (where
    that small read waits behind the pull in flight). If the key changes,
    hooks read the variable again: correct, slower.
    """
    graph.clear_collection(_GLOBAL_STEP_READ_KEY)
    graph.add_to_collection(_GLOBAL_STEP_READ_KEY, tensor)


def in_control_flow(op: tf.Operation) -> bool:
    """Whether `op` was built inside v1 control flow (tf.cond / tf.while_loop's context).

    Why: moving a gather onto its table (`strategies.sparse`) is only safe
    outside v1 control flow; there is no public way to ask. Uses
    `Operation._control_flow_context`.
    """
    return op._control_flow_context is not None  # noqa: SLF001


def update_input(op: tf.Operation, index: int, tensor: tf.Tensor) -> None:
    """Rewire input `index` of the built op `op` to `tensor`.

    Why: graph surgery that reroutes a gather's consumers onto a gather that
    runs on the table's PS (`strategies.sparse.gather_on_tables`); TF 1
    graphs have no public way to change a built op's input. Uses
    `Operation._update_input`.
    """
    op._update_input(index, tensor)  # noqa: SLF001


def add_control_input(op: tf.Operation, before: tf.Operation) -> None:
    """Make the built op `op` run only after `before`.

    Why: SyncParameterServer orders a step's variable reads after its read
    of the global step, and only those: a control-dependency scope around
    the user's loss function would also hold back the initial values built
    in it (a `get_variable(initializer=tf.constant(...))`), and the chief
    could not initialise them. Uses `Operation._add_control_input`.
    """
    op._add_control_input(before)  # noqa: SLF001


def set_device(op: tf.Operation, device: str) -> None:
    """Re-place the built op `op` on `device`.

    Why: variables placed whole after the model is built (Keras layers,
    `tf.Variable`) move to a PS with their slots, initializers and reads
    (`placement.place_whole`); there is no public way to re-place a built
    op. Uses `Operation._set_device`.
    """
    op._set_device(device)  # noqa: SLF001


def timeline():
    """TF's `timeline` module (Chrome traces from StepStats), not exported by tf.compat.v1.

    Why: the step trace hook writes Chrome traces (`metrics`). Imported on
    use, so that only a run that traces depends on it.
    """
    from tensorflow.python.client import timeline as module

    return module


class RoundsQueueRunner(v1.train.QueueRunner):
    """A QueueRunner whose loop runs each round through `_round(run)`, which subclasses override.

    Why: the async transfer loop (`strategies.async_ps`) traces some of its
    rounds on request, which needs run options per round; QueueRunner takes
    none. This overrides QueueRunner's private `_run` (the loop of one
    thread) and reads its private bookkeeping (`_lock`,
    `_runs_per_session`, `_exceptions_raised`, `_queue_closed_exception_types`,
    `_close_op`), as TF 2.21's `_run` does; the loop is TF's otherwise.
    """

    error: Exception | None = None  # the error that ended the loop, if one did

    def _round(self, run: Callable) -> None:
        """One round: `run(options=..., run_metadata=...)` runs the enqueue op once."""
        run()

    def _run(self, sess, enqueue_op, coord=None):
        decremented = False
        try:
            run = sess.make_callable(enqueue_op, accept_options=True)
            while not (coord and coord.should_stop()):
                try:
                    self._round(run)
                except self._queue_closed_exception_types:
                    with self._lock:
                        self._runs_per_session[sess] -= 1
                        decremented = True
                        if self._runs_per_session[sess] == 0:
                            with contextlib.suppress(Exception):  # as TF's: errors of close are moot
                                sess.run(self._close_op)
                    return
        except Exception as e:
            self.error = e  # what stopped the loop, for its owner (RoundsQueueRunner's own)
            if coord:
                coord.request_stop(e)
            else:
                with self._lock:
                    self._exceptions_raised.append(e)
                raise
        finally:
            if not decremented:
                with self._lock:
                    self._runs_per_session[sess] -= 1


def checkpoint_keys(variables) -> dict[str, list[int]]:
    """The keys a v1 Saver of `variables` reads from a checkpoint, each with its whole shape.

    A split variable is one key with the shape of the whole variable, however
    many parts it has here: its parts are slices of it.
    """
    keys = {}
    for name, value in op_list_to_dict(list(variables), convert_variable_to_tensor=False).items():
        if isinstance(value, list):  # the parts of a split variable
            keys[name] = list(value[0]._save_slice_info.full_shape)
        else:
            keys[name] = value.shape.as_list()
    return keys


def dataset_inputs(dataset: tf.data.Dataset) -> set[tf.Operation]:
    """Every graph op the dataset `dataset` is built from (its own dataset ops and what they read).

    Why: whether a dataset reads a placeholder (then a one-shot iterator
    cannot capture it, and it needs its feeds when it starts); tf.data has
    no public way to ask. Uses `Dataset._variant_tensor`, the dataset's
    graph tensor. Values a dataset function captures are inputs of its op.
    """
    start = dataset._variant_tensor.op  # noqa: SLF001
    seen, todo = {start}, [start]
    while todo:
        for tensor in todo.pop().inputs:
            if tensor.op not in seen:
                seen.add(tensor.op)
                todo.append(tensor.op)
    return seen


_intercepted = {"depth": 0}  # blocks of intercepted_datasets open in the process
_intercepted_lock = threading.Lock()


@contextlib.contextmanager
def intercepted_datasets(sources: Callable, reads_feeds: Callable, started: Callable):
    """While the block runs, datasets built from values and their v1 iterators are redirected.

    - `tf.data.Dataset.from_tensor_slices(x)` and `from_tensors(x)` (and
      `tf.compat.v1.data.Dataset`'s, which call them) build from `sources(x)`;
    - a v1 one-shot iterator (`tf.compat.v1.data.make_one_shot_iterator(d)`,
      `d.make_one_shot_iterator()`) over a dataset for which `reads_feeds(d)`
      is made initializable instead (a one-shot iterator cannot capture a
      placeholder), and every initializable iterator over such a dataset,
      those included, is handed to `started(iterator)`, whose owner then
      runs its initializer with the feeds. So is a one-shot iterator TF
      refuses because the dataset captures a stateful op (a lookup table
      or a variable in a `map`).

    The redirection is process-wide: blocks open at once (nested, or in
    other threads) share the first block's functions, and it ends with the
    last. Why here: TF 1's guide feeds large arrays through placeholders at
    iterator initialisation, and these calls are in the user's own code.
    Replaces, for the block, the static methods of the public
    `tf.data.Dataset` and the private `DatasetV1._make_one_shot_iterator`
    and `_make_initializable_iterator` (TF 2.21.0 routes both module
    functions and both methods through them). If they move, arrays are
    written into the graph as constants again (and the large-constant
    warning says so).
    """
    with _intercepted_lock:
        _intercepted["depth"] += 1
        if _intercepted["depth"] == 1:
            _intercepted["saved"] = _intercept(sources, reads_feeds, started)
    try:
        yield
    finally:
        with _intercepted_lock:
            _intercepted["depth"] -= 1
            if _intercepted["depth"] == 0:
                for owner, name, saved in _intercepted.pop("saved"):
                    setattr(owner, name, saved)


def _intercept(sources: Callable, reads_feeds: Callable, started: Callable) -> list[tuple[type, str, object]]:
    """Install intercepted_datasets' redirections; return (class, name, what was there) to put back."""
    dataset_class = tf.data.Dataset
    slices, tensors = dataset_class.from_tensor_slices, dataset_class.from_tensors
    one_shot, initializable = DatasetV1._make_one_shot_iterator, DatasetV1._make_initializable_iterator  # noqa: SLF001

    def from_tensor_slices(values, name=None):
        return slices(sources(values), name=name)

    def from_tensors(values, name=None):
        return tensors(sources(values), name=name)

    def make_initializable_iterator(dataset, shared_name=None):
        iterator = initializable(dataset, shared_name)
        if reads_feeds(dataset):
            started(iterator)
        return iterator

    def make_one_shot_iterator(dataset):
        if reads_feeds(dataset):
            return make_initializable_iterator(dataset)
        try:
            return one_shot(dataset)
        except ValueError as error:  # a map that captures a lookup table or a variable: as TF advises
            if "Cannot capture a stateful node" not in str(error):
                raise
            iterator = initializable(dataset, None)
            started(iterator)
            return iterator

    replaced = [
        (dataset_class, "from_tensor_slices", staticmethod(from_tensor_slices)),
        (dataset_class, "from_tensors", staticmethod(from_tensors)),
        (DatasetV1, "_make_one_shot_iterator", make_one_shot_iterator),
        (DatasetV1, "_make_initializable_iterator", make_initializable_iterator),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in replaced]
    for owner, name, value in replaced:
        setattr(owner, name, value)
    return saved
