"""NumPy arrays given to a dataset are fed when its pipeline starts, never written into the graph.

In a v1 graph, `tf.data.Dataset.from_tensor_slices(array)` (or
`from_tensors`) makes the array a graph constant, so every graph, `.meta`
and event file TensorFlow writes carries a copy, and start-up serialises
and reads them all. While disttrain builds a user's function (`feeding`:
the loss function in `Strategy.minimize`, its towers and its scratch build
for placement; an eval function in the evaluator), each NumPy array given
to those two functions becomes a placeholder of its dtype and shape on the
task's CPU instead (one per array object and graph), and the iterators
over such datasets are initialisable ones whose initializers run with the
arrays as feeds when a session starts (`start_inputs`, run first by
`StartInputsHook` in every task's session): the graph holds only the
arrays' shapes. A one-shot iterator the function makes itself over such a
dataset (it cannot capture a placeholder) is made initialisable the same
way; so is the iterator of `InputContext.get_next`. So is a one-shot
iterator over a dataset that captures a stateful op (a vocabulary's lookup
table or a variable in a `map`), which TF refuses as one-shot; its
initializer runs when the session starts, after the tables'.

What is not covered: an array turned into a tensor some other way
(`tf.constant`, an array captured by a `map` function, a dataset built
before or outside the function), a dataset read without an iterator
(`get_single_element`, `reduce`), and a re-initialisable iterator of the
user's own (`Iterator.from_structure`). Those stay constants, and
`StartInputsHook` warns once per run about any constant over
`LARGE_CONSTANT_BYTES`, naming it. A session of the user's own (not
`disttrain.session`) calls `start_inputs(session)` itself.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from disttrain.base import tf_internals

v1 = tf.compat.v1
log = logging.getLogger("disttrain")

# A constant this large in a graph gets StartInputsHook's warning. Below it a constant costs
# little; a NumPy array of training data is usually far above it.
LARGE_CONSTANT_BYTES = 1 << 20
PLACEHOLDER_NAME = "numpy_input"  # each fed array's placeholder: TF's "must feed" errors name it


@dataclasses.dataclass
class _Feeds:
    """One graph's fed arrays and the initializers that take them (names only: no tie to the graph)."""

    arrays: dict[int, tuple[str, np.ndarray]] = dataclasses.field(default_factory=dict)  # by id(array)
    placeholders: set[str] = dataclasses.field(default_factory=set)  # their op names
    initializers: list[str] = dataclasses.field(default_factory=list)  # op names, in creation order


_FEEDS: weakref.WeakKeyDictionary[tf.Graph, _Feeds] = weakref.WeakKeyDictionary()


def feeding(fn: Callable) -> Callable:
    """`fn`, whose datasets take its NumPy arrays as placeholders fed when their input starts (see above)."""

    @functools.wraps(fn)
    def fed(*args, **kwargs):
        with tf_internals.intercepted_datasets(_sources, _reads_feeds, _started):
            return fn(*args, **kwargs)

    return fed


def start_inputs(session) -> None:
    """Initialise the iterators over fed arrays of the session's graph, feeding them the arrays.

    Call once per session, before its first step and before an input
    position is restored. Nothing to do when no array was fed.
    """
    feeds = _FEEDS.get(session.graph)
    if feeds is None or not feeds.initializers:
        return
    session.run(feeds.initializers, feed_dict={name: array for name, array in feeds.arrays.values()})


def _sources(values):
    """`values` (a dataset's element structure) with each NumPy array replaced by its placeholder."""
    if tf.inside_function():  # a dataset function's own graph (e.g. in flat_map) cannot be fed
        return values
    return tf.nest.map_structure(lambda v: _placeholder(v) if isinstance(v, np.ndarray) else v, values)


def _placeholder(array: np.ndarray):
    """The default graph's placeholder for `array` (made on first use, on this task's CPU), or `array`."""
    if array.dtype.kind in "US":
        dtype = tf.string
    else:
        try:
            dtype = tf.as_dtype(array.dtype)
        except TypeError:  # no TF dtype (objects, records): TF's own conversion decides, as without us
            return array
    graph = v1.get_default_graph()
    feeds = _FEEDS.setdefault(graph, _Feeds())
    if id(array) in feeds.arrays:  # the same array in another tower: fed once
        return graph.get_tensor_by_name(feeds.arrays[id(array)][0])
    # Not under the caller's control dependencies; on the CPU, where the dataset ops run.
    with graph.control_dependencies(None), tf.device("/device:CPU:0"):
        placeholder = v1.placeholder(dtype, array.shape, name=PLACEHOLDER_NAME)
    feeds.arrays[id(array)] = (placeholder.name, array)
    feeds.placeholders.add(placeholder.op.name)
    return placeholder


def _reads_feeds(dataset: tf.data.Dataset) -> bool:
    """Whether `dataset` reads a fed array of its graph."""
    feeds = _FEEDS.get(v1.get_default_graph())
    if feeds is None:
        return False
    return any(op.name in feeds.placeholders for op in tf_internals.dataset_inputs(dataset))


def _started(iterator) -> None:
    """Note `iterator`'s initializer, for start_inputs."""
    _FEEDS.setdefault(iterator.initializer.graph, _Feeds()).initializers.append(iterator.initializer.name)


def large_constants(graph: tf.Graph, at_least: int = LARGE_CONSTANT_BYTES) -> list[tuple[str, int]]:
    """(name, bytes in the GraphDef) of each constant of `graph` of at least `at_least` bytes, largest first.

    Functions' constants (a dataset's `map`, for one) count too, named
    `<function>/<op>`.
    """
    graph_def = graph.as_graph_def()
    found = [(n.name, n.attr["value"].tensor.ByteSize()) for n in graph_def.node if n.op == "Const"]
    for function in graph_def.library.function:
        found += [
            (f"{function.signature.name}/{n.name}", n.attr["value"].tensor.ByteSize())
            for n in function.node_def
            if n.op == "Const"
        ]
    return sorted(((n, b) for n, b in found if b >= at_least), key=lambda c: -c[1])


def warn_large_constants(graph: tf.Graph) -> None:
    """One warning if `graph` holds constants over LARGE_CONSTANT_BYTES: the largest, and what to do."""
    found = large_constants(graph)
    if not found:
        return
    name, size = found[0]
    more = f" and {len(found) - 1} more over {LARGE_CONSTANT_BYTES >> 20} MiB" if len(found) > 1 else ""
    log.warning(
        f"the graph holds a constant of {size / 2**20:.1f} MiB ({name}){more}: every graph, .meta "
        "and event file carries a copy and start-up reads them. Give NumPy data to "
        "tf.data.Dataset.from_tensor_slices or from_tensors inside loss_fn (disttrain feeds it when "
        "the input starts) instead of tf.constant, an array captured by a map function, or a "
        "dataset built outside loss_fn"
    )


class StartInputsHook(v1.train.SessionRunHook):
    """Starts the fed inputs in each new session, before any other hook; warns once about large constants.

    Goes first in a session's hooks: others may run steps (autotuning) or
    restore input positions (InputPositionHook) when their session starts.
    """

    def begin(self):
        warn_large_constants(v1.get_default_graph())

    def after_create_session(self, session, coord):
        start_inputs(session)
