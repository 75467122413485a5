"""StepWatch: a step that waits far longer than the steps before it is said, not silent."""

import logging
import threading
import time

import tensorflow as tf

import disttrain  # noqa: F401  (graph mode)
from disttrain import trainer

v1 = tf.compat.v1


class RawSession(v1.train.SessionRunHook):
    def after_create_session(self, session, coord):
        self.session = session


def test_a_step_stuck_on_a_queue_is_said_and_a_normal_one_is_not(caplog):
    with tf.Graph().as_default():
        queue = tf.queue.FIFOQueue(10, tf.float32)
        take, put = queue.dequeue(), queue.enqueue(1.0)
        watch = trainer.StepWatch("/job:worker/task:1", say_every_secs=0.2, min_secs=0.5, factor=10)
        raw = RawSession()
        with caplog.at_level(logging.WARNING), v1.train.MonitoredSession(hooks=[watch, raw]) as session:
            for _ in range(3):  # quick steps: the history the watch judges by
                session.run(put)
                session.run(take)
            assert watch.said == 0
            late = threading.Timer(2.0, lambda: raw.session.run(put))
            late.start()
            started = time.monotonic()
            session.run(take)  # waits about 2 s for the timer's enqueue
            waited = time.monotonic() - started
            late.join()
    assert waited >= 1.5 and watch.said >= 2, (waited, watch.said)
    lines = [r.getMessage() for r in caplog.records if "step-watch" in r.threadName]
    assert lines and all("/job:worker/task:1: step 7 of this task has run for" in m for m in lines), lines
