"""InputPositionHook: when a replica's input position is saved, and that a restart resumes it."""

import tensorflow as tf

import disttrain  # noqa: F401  (quiet TensorFlow first)
from disttrain.graph.input_context import InputContext, InputPositionHook

v1 = tf.compat.v1


def _train(directory, steps: int, save_steps: int, from_step: int = 0) -> list[int]:
    """`steps` steps reading 0, 1, 2, ... through the context's saved iterator; the values read.

    `from_step`: the global step the session starts at (a checkpoint the chief restored).
    """
    with tf.Graph().as_default():
        step = v1.get_variable(
            "global_step",
            [],
            tf.int64,
            v1.constant_initializer(from_step),
            trainable=False,
            collections=[v1.GraphKeys.GLOBAL_VARIABLES, v1.GraphKeys.GLOBAL_STEP],
        )
        context = InputContext()
        value = context.get_next(tf.data.Dataset.range(1000))
        train = step.assign_add(1)
        with tf.control_dependencies([train]):  # the step after this run's increment, never before it
            after = step.read_value()
        hook = InputPositionHook(str(directory), context, after, save_steps, None)
        read = []
        with v1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(steps):
                read.append(int(session.run([value, train])[0]))
        return read


def _saved(directory) -> list[str]:
    return sorted(p.name for p in directory.glob("input-r1t1-*.index"))


def test_no_position_is_saved_after_the_first_step_only_each_interval_and_at_the_end(tmp_path):
    # Saving after the first step protects no work and costs the whole shuffle buffer (seconds).
    first = tmp_path / "first"
    _train(first, 1, save_steps=3)
    assert _saved(first) == ["input-r1t1-1.index"]  # the end's save only
    every = tmp_path / "every"
    assert _train(every, 7, save_steps=3) == list(range(7))
    assert _saved(every) == ["input-r1t1-3.index", "input-r1t1-6.index", "input-r1t1-7.index"]
    # A restart goes on from the last saved position.
    assert _train(every, 2, save_steps=3) == [7, 8]


def test_a_session_restored_to_an_older_checkpoint_reads_again_from_the_position_saved_with_it(tmp_path):
    """After a lost PS the chief restores an older checkpoint: newer positions would skip examples."""
    assert _train(tmp_path, 7, save_steps=3) == list(range(7))  # positions at 3, 6 and 7
    assert _train(tmp_path, 2, save_steps=3, from_step=5) == [3, 4]  # the model is at step 5
