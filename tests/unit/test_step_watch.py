"""The watchdog and StepWatch: no wait without a bound, and a reason in one line when it ends a task.

Peers are real TCP listeners (up) and ports nobody listens on (gone); the
process exit is replaced by a recorder, so that the test's own process lives.
"""

import logging
import socket
import threading
import time

import tensorflow as tf

import disttrain  # noqa: F401  (graph mode)
from disttrain.runtime import trainer, watchdog

v1 = tf.compat.v1


def listening() -> tuple[socket.socket, str]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, f"127.0.0.1:{s.getsockname()[1]}"


def closed_port() -> str:
    s, address = listening()
    s.close()
    return address


class Exits:
    """Stands in for os._exit: records the code and lets the watchdog thread end."""

    def __init__(self):
        self.codes, self.done = [], threading.Event()

    def __call__(self, code):
        self.codes.append(code)
        self.done.set()


def dog(peers, over=False, all_needed=True, wait=0.6) -> tuple[watchdog.Watchdog, Exits]:
    w = watchdog.Watchdog("/job:worker/task:1", peers, wait, 0.1, lambda: over, all_needed=all_needed)
    w.exit = exits = Exits()
    return w.start(), exits


def test_a_phase_waiting_on_a_gone_peer_ends_the_task_with_150_and_names_the_peer(capsys):
    up, address = listening()
    w, exits = dog([("/job:ps/task:0", address), ("/job:ps/task:1", closed_port())])
    w.enter("step 7 of this task", threshold_secs=0.2)
    assert exits.done.wait(20), "the watchdog never ended the task"
    assert exits.codes == [150]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("disttrain: error: lost contact: /job:ps/task:1 is gone"), err
    assert "step 7 of this task waited" in err[0]
    up.close()


def test_a_gone_peer_after_training_ended_exits_0(caplog):
    w, exits = dog([("/job:ps/task:0", closed_port())], over=True)
    with caplog.at_level(logging.INFO, logger="disttrain"):
        w.enter("closing the session", threshold_secs=0.1)
        assert exits.done.wait(20)
    assert exits.codes == [0]
    assert "training is over" in caplog.text


def test_a_phase_that_left_before_its_threshold_is_not_judged():
    w, exits = dog([("/job:ps/task:0", closed_port())])
    w.enter("step 3 of this task", threshold_secs=0.5)
    time.sleep(0.3)
    w.leave()
    assert not exits.done.wait(2.0)
    w.stop()


def test_a_hung_phase_with_every_peer_reachable_ends_with_its_code(capsys):
    up, address = listening()
    w, exits = dog([("/job:worker/task:0", address)])
    w.enter("step 9 of this task", threshold_secs=0.2, may_hang=True)
    assert exits.done.wait(20)
    assert exits.codes == [150]
    assert "step 9 of this task has waited" in capsys.readouterr().err
    # A phase that may not hang (between steps, a user's own loop) waits as long as the peers are there.
    w2, exits2 = dog([("/job:worker/task:0", address)])
    w2.enter("after step 9", threshold_secs=0.1)
    assert not exits2.done.wait(2.0)
    w2.stop()
    up.close()


def test_a_ps_goes_on_while_any_replica_is_there_and_ends_when_none_is():
    up, address = listening()
    gone = closed_port()
    w, exits = dog([("/job:worker/task:0", address), ("/job:worker/task:1", gone)], all_needed=False)
    w.enter("serving", threshold_secs=0.1)
    assert not exits.done.wait(2.0)  # worker 1 is gone, worker 0 is not
    up.close()  # now no replica is reachable
    assert exits.done.wait(20)
    assert exits.codes == [150]


class RawSession(v1.train.SessionRunHook):
    def after_create_session(self, session, coord):
        self.session = session


def test_a_step_stuck_on_a_queue_is_said_then_ended_and_normal_steps_are_not(caplog):
    up, address = listening()
    w, exits = dog([("/job:ps/task:0", address)], wait=1.0)
    with tf.Graph().as_default():
        queue = tf.queue.FIFOQueue(10, tf.float32)
        take, put = queue.dequeue(), queue.enqueue(1.0)
        watch = trainer.StepWatch(w, min_secs=0.5, factor=10, first_secs=30)
        raw = RawSession()
        with caplog.at_level(logging.WARNING), v1.train.MonitoredSession(hooks=[watch, raw]) as session:
            for _ in range(3):  # quick steps: the history the watch judges by
                session.run(put)
                session.run(take)
            assert not exits.done.is_set()
            late = threading.Timer(4.0, lambda: raw.session.run(put))
            late.start()
            session.run(take)  # waits about 4 s: past 0.5 s it is said, past 1.5 s it is ended
            late.join()
    assert exits.codes and exits.codes[0] == 150, exits.codes
    lines = [r.getMessage() for r in caplog.records if "watchdog" in r.threadName]
    assert lines and "step 7 of this task" in lines[0] and "every peer reachable" in lines[0], lines
    up.close()


class StuckAfterStep(v1.train.SessionRunHook):
    """A hook whose after_run (a checkpoint save, say) waits on a queue once armed: a frozen PS."""

    def __init__(self, take):
        self.take, self.armed = take, False

    def after_create_session(self, session, coord):
        self.session = session

    def after_run(self, run_context, run_values):
        if self.armed:
            run_context.session.run(self.take)


def test_the_hooks_after_a_step_are_judged_until_the_last_hook_and_a_loop_between_steps_is_not(caplog):
    up, address = listening()
    w, exits = dog([("/job:ps/task:0", address)], wait=1.0)
    with tf.Graph().as_default():
        queue = tf.queue.FIFOQueue(10, tf.float32)
        take, put, noop = queue.dequeue(), queue.enqueue(1.0), tf.constant(0)
        watch = trainer.StepWatch(w, min_secs=0.5, factor=10, first_secs=1.0)
        stuck = StuckAfterStep(take)
        with (
            caplog.at_level(logging.WARNING),
            v1.train.MonitoredSession(hooks=[watch, stuck, trainer.StepWatch.Done(watch)]) as session,
        ):
            for _ in range(3):
                session.run(noop)
            time.sleep(3.0)  # the user's own loop between steps: not judged while every peer answers
            assert not exits.done.is_set()
            stuck.armed = True
            release = threading.Thread(target=lambda: exits.done.wait(20) and stuck.session.run(put))
            release.start()  # once ended (the exit here only records), the hook may return
            session.run(noop)  # its hooks do not return: judged after 1 s, ended 1 s later
            release.join()
    assert exits.codes == [150], exits.codes
    lines = [r.getMessage() for r in caplog.records if "watchdog" in r.threadName]
    assert lines and "the hooks after step 4" in lines[0], lines
    up.close()


def test_a_bounded_call_is_judged_as_hung_and_the_phase_before_it_comes_back():
    up, address = listening()
    w, exits = dog([("/job:ps/task:0", address)], wait=0.5)
    w.enter("creating the session", threshold_secs=60)
    with w.bounded("waiting for the chief's variables", 0.2):
        pass  # returned at once: nothing judged
    time.sleep(1.5)
    assert not exits.done.is_set()  # the phase before (60 s) is back
    with w.bounded("waiting for the chief's variables", 0.2):
        assert exits.done.wait(10)  # a call that does not return: ended
    assert exits.codes == [150]
    up.close()
