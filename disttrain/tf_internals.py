"""Every private TensorFlow internal disttrain uses, each with why, in one place.

Checked against TensorFlow 2.21.0 (graph mode through `tf.compat.v1`). None
of these is public API: a TensorFlow upgrade may rename or remove any of
them, so an upgrade starts here. Each entry says what breaks if it goes.
The rest of the package uses these functions, never the private names.
"""

from __future__ import annotations

import contextlib
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
    "in_control_flow",
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
