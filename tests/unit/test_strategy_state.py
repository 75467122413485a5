"""A strategy sets nothing on itself after its constructor; each build keeps its own pieces.

What a build makes (the transfer loop, the aggregation ops, the ring's keys
and vote) lives in that build's `Made` (`strategy.made`), and where variables
go in one `Placed`, both in the strategy's `Record`
(disttrain/strategies/building.py). The first test reads every assignment in
every strategy class (pure Python, ast); the others build twice and check
that the second build does not see the first's pieces.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import tensorflow as tf

from disttrain import AsyncParameterServer, Cluster, SyncAllReduce, SyncParameterServer, strategies
from disttrain.base import preemption
from disttrain.runtime import trainer
from disttrain.strategies import base

v1 = tf.compat.v1


def set_outside_init(cls) -> list[str]:
    """`self.NAME = ...` (or augmented, annotated, in a tuple) in `cls`'s own methods but `__init__`."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    found = []
    for method in tree.body[0].body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef) or method.name == "__init__":
            continue
        for node in ast.walk(method):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            found += [f"{cls.__name__}.{method.name}: self.{name}" for name in _on_self(targets)]
    return found


def _on_self(targets) -> list[str]:
    """The names of `self.NAME` among assignment targets, tuples unpacked (not `self.a.b`, `self.a[i]`)."""
    names = []
    for t in targets:
        if isinstance(t, ast.Tuple | ast.List):
            names += _on_self(t.elts)
        elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
            names.append(t.attr)
    return names


def strategy_classes() -> list[type]:
    """Every strategy class disttrain ships: the concrete ones and the bases between them."""
    classes = set()
    for cls in strategies.concrete():
        classes.update(c for c in cls.__mro__ if issubclass(c, base.Strategy))
    return sorted(classes, key=lambda c: c.__qualname__)


def test_no_strategy_sets_an_attribute_outside_its_constructor():
    classes = strategy_classes()
    assert {"Strategy", "PsStrategy", "AsyncParameterServer", "SyncAllReduce", "SyncHybrid"} <= {
        c.__name__ for c in classes
    }
    assert [line for cls in classes for line in set_outside_init(cls)] == []


def test_the_reader_finds_an_assignment_outside_the_constructor():
    class Leaky(base.Strategy):
        def __init__(self, cluster):
            super().__init__(cluster)
            self.fine = 1

        def apply_gradients(self, optimizer, grads_and_vars, global_step):
            self.loop, (self.keys, _) = None, (None, None)
            self.count += 1
            return tf.no_op()

    assert sorted(set_outside_init(Leaky)) == [
        "Leaky.apply_gradients: self.count",
        "Leaky.apply_gradients: self.keys",
        "Leaky.apply_gradients: self.loop",
    ]


def build_quadratic(strategy) -> tf.Operation:
    with strategy.scope():

        def loss_fn():
            w = v1.get_variable("w", [4], initializer=v1.zeros_initializer())
            return tf.reduce_sum(tf.square(w - 1.0))

        return strategy.minimize(v1.train.GradientDescentOptimizer(0.1), loss_fn)


def two_worker_cluster(ps=("p0:1",)) -> Cluster:
    return Cluster.from_hosts("worker", 0, ps, ["w0:1", "w1:1"])


def test_a_second_build_starts_from_none_of_the_first_builds_pieces():
    strategy = AsyncParameterServer(Cluster.local(), overlap=True)
    with tf.Graph().as_default() as first:
        build_quadratic(strategy)
        first_op, first_hooks = strategy.transfer_op, strategy.hooks()
    with tf.Graph().as_default() as second:
        build_quadratic(strategy)
        assert strategy.transfer_op.graph is second is not first
        assert first_op.graph is first
        # One copy per variable of this graph: the first graph's copies are not reused or kept.
        assert len(strategy.made.copies) == 1
        assert strategy.made.copies[0][0].graph is second
        assert strategy.traced_loops()[0] is not first_hooks[0]._loop  # noqa: SLF001


def test_sync_ps_and_ring_pieces_belong_to_the_build():
    sync = SyncParameterServer(two_worker_cluster())
    with tf.Graph().as_default():
        build_quadratic(sync)
        first = sync.made.sync
    with tf.Graph().as_default() as second:
        build_quadratic(sync)
        assert sync.made.sync is not first and sync.made.sync.drain.graph is second
    ring = SyncAllReduce(two_worker_cluster(ps=()))
    with tf.Graph().as_default():
        build_quadratic(ring)
        vote = ring.made.vote
        assert vote is not None and ring.votes_on_preemption
    with tf.Graph().as_default() as second:
        build_quadratic(ring)
        assert ring.made.vote[0].graph is second and ring.made.vote is not vote


def test_the_loop_hands_the_tasks_notice_to_the_strategys_hooks():
    ring = SyncAllReduce(two_worker_cluster(ps=()))
    with tf.Graph().as_default():
        build_quadratic(ring)
        flag = ring.made.vote[0]
        notice = preemption.Notice(grace_secs=1e9)  # never exits this process
        (vote,) = trainer._strategy_hooks(ring, 10, notice)  # noqa: SLF001
        assert vote.before_run(None).feed_dict == {flag: 0.0}
        notice.request("a test's preemption")
        assert vote.before_run(None).feed_dict == {flag: 1.0}
        assert not preemption.PROCESS.requested()


def test_a_strategy_written_for_hooks_last_step_alone_still_gets_its_hooks():
    class Older(SyncAllReduce):
        def hooks(self, last_step=None):
            return super().hooks(last_step)

    ring = Older(two_worker_cluster(ps=()))
    with tf.Graph().as_default():
        build_quadratic(ring)
        (vote,) = trainer._strategy_hooks(ring, 10, preemption.Notice(grace_secs=1e9))  # noqa: SLF001
        assert vote._notice is preemption.PROCESS  # noqa: SLF001
