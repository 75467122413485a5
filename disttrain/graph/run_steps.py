"""How many training steps one `session.run` makes, so that hooks count steps and not runs.

`Strategy.minimize(..., steps_per_run=k)` returns a train op that makes k
steps in one run and marks it here. A hook asks `steps_in(run_context)`
after a run: the steps the fetched train op made (1 for anything not
marked: a one-step train op, or a fetch of the user's own). It does not
tell which global step a run ended at: a global step fetched with the
run may be read before, between or after its steps.
"""

from __future__ import annotations

import weakref

import tensorflow as tf

# Per graph: the name of every train op that makes several steps per run, and how many.
_STEPS: weakref.WeakKeyDictionary[tf.Graph, dict[str, int]] = weakref.WeakKeyDictionary()


def mark(train_op: tf.Operation | tf.Tensor, steps: int) -> None:
    """Note that running `train_op` (an op, or a tensor of the op) makes `steps` training steps."""
    op = getattr(train_op, "op", train_op)
    _STEPS.setdefault(op.graph, {})[op.name] = steps


def steps_of(fetches) -> int:
    """The training steps one run of `fetches` makes: the most of any marked op among them, else 1."""
    found = [1]
    for fetch in tf.nest.flatten(fetches):
        graph, name = getattr(fetch, "graph", None), getattr(fetch, "name", None)
        op = getattr(fetch, "op", None)  # a tensor: its op is what was marked
        if op is not None:
            graph, name = op.graph, op.name
        if graph is not None and name is not None:
            found.append(_STEPS.get(graph, {}).get(name, 1))
    return max(found)


def steps_in(run_context) -> int:
    """The training steps the run of a hook's `run_context` made."""
    return steps_of(run_context.original_args.fetches)
