"""The asynchronous chief's wait for the other replicas before its final checkpoint (trainer._AwaitReplicas).

The cluster case (a chief whose data ends first, its final checkpoint holding every replica's
updates) is tests/cluster/test_input_sharding.py; here, in one process, what ends the wait.
"""

import logging
import threading
import time

import tensorflow as tf

from disttrain.base import preemption
from disttrain.runtime import trainer

v1 = tf.compat.v1


def _parts(others=2, saved=None, notice=None):
    queue = v1.FIFOQueue(8, [tf.int32], shapes=[[]])
    step = v1.get_variable("step", [], tf.int64, initializer=tf.zeros_initializer())
    mirror = v1.get_variable("mirror", [], tf.int64, initializer=tf.zeros_initializer())
    hook = trainer._AwaitReplicas(
        "/job:worker/task:0",
        queue.size(),
        others,
        step,
        idle_secs=1.0,
        notice=notice or preemption.Notice(),
        refresh=mirror.assign(step),
        saving=None
        if saved is None
        else (lambda session, at: saved.append(at), v1.train.SecondOrStepTimer(every_steps=10)),
    )
    return hook, queue, step, mirror


def test_it_ends_when_every_other_replica_has_posted_and_refreshes_the_mirror(caplog):
    caplog.set_level(logging.INFO, logger="disttrain")
    saved = []
    with tf.Graph().as_default(), v1.Session() as session:
        hook, queue, step, mirror = _parts(saved=saved)
        post, advance = queue.enqueue(1), step.assign_add(5)
        session.run(v1.global_variables_initializer())

        def others():  # the other replicas train on, then post one after the other
            for _ in range(3):
                time.sleep(0.6)  # the hook polls every 0.2 s: it sees each step
                session.run(advance)
            session.run(post)
            time.sleep(0.3)
            session.run(post)

        thread = threading.Thread(target=others)
        thread.start()
        hook.end(session)
        thread.join()
        assert hook.final_step == 15 and session.run(mirror) == 15
    assert saved == [10], saved  # checkpoints every 10 steps while the others train (the saver writes 15)
    err = caplog.text
    assert "waiting for the other replicas' (0 of 2 finished) before the final checkpoint" in err, err
    assert "every replica has finished, at global step 15" in err, err


def test_it_stops_waiting_once_the_global_step_stands_still_for_idle_secs(caplog):
    caplog.set_level(logging.INFO, logger="disttrain")
    with tf.Graph().as_default(), v1.Session() as session:
        hook, queue, step, _ = _parts()
        session.run(v1.global_variables_initializer())
        session.run(queue.enqueue(1))  # one of two posted; the other died
        started = time.monotonic()
        hook.end(session)
        assert 1.0 <= time.monotonic() - started < 10 and hook.final_step == 0
    err = caplog.text
    assert "1 replica(s) have not finished and the global step has stayed at 0 for 1 s" in err, err


def test_no_wait_when_the_others_have_already_finished(caplog):
    caplog.set_level(logging.INFO, logger="disttrain")
    with tf.Graph().as_default(), v1.Session() as session:
        hook, queue, _, _ = _parts(others=1)
        session.run(v1.global_variables_initializer())
        session.run(queue.enqueue(1))
        hook.end(session)
        assert hook.final_step == 0
    assert "waiting" not in caplog.text


class _Preempted(preemption.Notice):
    """A notice already requested, without the bound's timer (which would end the test process)."""

    def requested(self) -> bool:
        return True


def test_a_preemption_ends_the_wait_at_once():
    notice = _Preempted()
    with tf.Graph().as_default(), v1.Session() as session:
        hook, _, step, mirror = _parts(notice=notice)
        session.run(v1.global_variables_initializer())
        session.run(step.assign(7))
        started = time.monotonic()
        hook.end(session)
        assert time.monotonic() - started < 0.5 and hook.final_step == 7 and session.run(mirror) == 7
