"""How the chief resumes and how a replica ends for a preemption.

`ChiefSessionCreator` starts the chief's session on the state the PS tasks
still hold when they hold it (TF's restores the latest checkpoint whenever
there is one, over newer live variables); `PreemptionHook` stops a replica
at a step boundary once SIGTERM came, or once a PS said it is being
preempted, and lets the chief's final checkpoint wait until the global step
has settled.
"""

from __future__ import annotations

import logging
import threading
import time

import tensorflow as tf

from disttrain.base import preemption
from disttrain.base.deadlines import Deadlines

v1 = tf.compat.v1
log = logging.getLogger("disttrain")


def checkpoint_step(path: str | None) -> int | None:
    """The global step a checkpoint path was saved at (its `-N` suffix), None without one."""
    if not path:
        return None
    tail = path.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


class ChiefSessionCreator(v1.train.SessionCreator):
    """The chief's session: adopt live PS state, else restore the latest checkpoint, else initialise.

    `uninitialized` reports the global variables not initialised (on the PS
    tasks, under a PS strategy). When every one is, the PS tasks outlived a
    chief (it was restarted, or it lost only its session): their state is
    adopted, unless the latest checkpoint is newer than their global step.
    Otherwise (a PS restarted, or a new run) TF's SessionManager restores
    the latest checkpoint or runs the init op. With `adopt` False (no PS:
    every variable lives in this process) it is TF's ChiefSessionCreator.
    """

    def __init__(self, scaffold, master, config, logdir, uninitialized, global_step, adopt: bool):
        self._scaffold, self._master, self._config, self._logdir = scaffold, master, config, logdir
        self._uninitialized, self._global_step, self._adopt = uninitialized, global_step, adopt

    def create_session(self):
        self._scaffold.finalize()
        scaffold = self._scaffold
        manager = v1.train.SessionManager(
            local_init_op=scaffold.local_init_op,
            local_init_feed_dict=scaffold.local_init_feed_dict,
            ready_op=scaffold.ready_op,
            ready_for_local_init_op=scaffold.ready_for_local_init_op,
            graph=v1.get_default_graph(),
        )
        if self._adopt:
            session = self._live_session()
            if session is not None:
                return session
        latest = v1.train.latest_checkpoint(self._logdir)
        log.info(f"restoring {latest}" if latest else "initialising the variables (no checkpoint)")
        return manager.prepare_session(
            self._master,
            saver=scaffold.saver,
            checkpoint_dir=self._logdir,
            config=self._config,
            init_op=scaffold.init_op,
            init_feed_dict=scaffold.init_feed_dict,
            init_fn=scaffold.init_fn,
        )

    def _live_session(self):
        """A session on the PS tasks' live variables (or a newer checkpoint); None if they are not live."""
        session = v1.Session(self._master, graph=v1.get_default_graph(), config=self._config)
        missing = session.run(self._uninitialized)
        if len(missing):
            if len(missing) < len(v1.global_variables()):  # some PS restarted: their state is gone
                first = missing[0].decode()
                log.info(f"{len(missing)} variables are not initialised (a PS restarted?), e.g. {first}")
            session.close()
            return None
        live = int(session.run(self._global_step))
        latest = v1.train.latest_checkpoint(self._logdir)
        saved = checkpoint_step(latest)
        if saved is not None and saved > live:
            log.info(f"the PS tasks hold global step {live}; restoring the newer checkpoint {latest}")
            self._scaffold.saver.restore(session, latest)
        else:
            log.info(
                f"adopting the PS tasks' live state at global step {live} "
                f"(latest checkpoint: {'none' if saved is None else f'step {saved}'})"
            )
        if self._scaffold.local_init_op is not None:
            session.run(self._scaffold.local_init_op, feed_dict=self._scaffold.local_init_feed_dict)
        return session


class PreemptionHook(v1.train.SessionRunHook):
    """Stops the replica at a step boundary once a preemption is requested.

    `notice`: this task's (`preemption.Notice`). `notices`: (PS task name,
    size of its preemption queue) for every PS; a thread polls them every
    `poll_secs` and requests the notice when a PS has posted one. On the
    chief, `end` waits (at most `settle_secs`) until the global step stops
    moving, so that the final checkpoint (the saver hook's `end`, after this
    one) holds the other replicas' last steps when they stop too.
    """

    def __init__(
        self,
        global_step,
        notices,
        is_chief: bool,
        notice: preemption.Notice,
        poll_secs=0.25,
        settle_secs=Deadlines.PREEMPT_SETTLE_SECS,
        stop_on_request=True,
    ):
        self._global_step, self._notices, self._is_chief = global_step, list(notices), is_chief
        self._poll_secs, self._settle_secs = poll_secs, settle_secs
        self._stop_on_request = stop_on_request  # False: the strategy's vote stops the replicas
        self._notice = notice

    def after_create_session(self, session, coord):
        if self._notices:
            thread = threading.Thread(
                target=self._watch, args=(session, coord), name="disttrain-preempt-watch", daemon=True
            )
            coord.register_thread(thread)
            thread.start()
        if self._notice.requested():
            coord.request_stop()

    def _watch(self, session, coord):
        names = [name for name, _ in self._notices]
        sizes = [size for _, size in self._notices]
        options = v1.RunOptions(timeout_in_ms=int(Deadlines.PREEMPT_NOTICE_READ_SECS * 1000))
        while not coord.wait_for_stop(self._poll_secs) and not self._notice.requested():
            try:
                posted = session.run(sizes, options=options)
            except Exception:  # noqa: BLE001 - a lost PS is the training loop's to report
                continue
            for name, size in zip(names, posted, strict=True):
                if size:
                    self._notice.request(f"{name} is being preempted", peer=name)
                    return

    def after_run(self, run_context, run_values):
        if self._notice.requested() and self._stop_on_request:
            run_context.request_stop()

    def end(self, session):
        if not (self._is_chief and self._notice.requested()):
            return
        deadline = time.monotonic() + self._settle_secs
        step = session.run(self._global_step)
        while time.monotonic() < deadline:
            time.sleep(0.3)
            now = session.run(self._global_step)
            if now == step:
                break
            step = now
        log.info(f"preempted: checkpointing at global step {int(step)}")
