"""Which examples an input pipeline reads: its share of the data, and its position across restarts.

A loss function that takes one argument gets an `InputContext` for the tower
it builds: the replica and tower it feeds, the batch sizes, `shard()` to
take this pipeline's share of files or records, and `get_next()` to read
from a dataset through an iterator whose position is saved with the run.

    def loss_fn(ctx):
        records = ctx.shard("/data/train-*.tfrecord")   # this tower's files (or records)
        features, labels = ctx.get_next(records.map(parse).batch(ctx.batch_size))
        ...

One rule splits data for the zoo's inputs and for users' (`shard_files`):
whole files per pipeline when there are at least as many files as
pipelines, else every N-th record of all files. A replica's position is
saved in its own directory, `<logdir>/tasks/<job>_<index>/input-<step>`,
by the replica itself (a worker's iterator lives in its own process; the
chief's checkpoint cannot hold it), at the chief's checkpoint interval, and
restored when it starts again; see `InputPositionHook`.
"""

from __future__ import annotations

import dataclasses
import glob
import inspect
import logging
import os
import re
import weakref
from collections.abc import Callable, Sequence

import tensorflow as tf

v1 = tf.compat.v1
log = logging.getLogger("disttrain")
# The iterators saved_iterator made, per graph. Not a graph collection: a collection of Python
# objects makes every meta-graph export (each checkpoint) warn that it cannot serialize them.
_ITERATORS: weakref.WeakKeyDictionary[tf.Graph, list] = weakref.WeakKeyDictionary()


def shard_files(files: Sequence[str], index: int, count: int) -> tuple[list[str], bool]:
    """Pipeline `index` of `count`'s files, and whether records must be sharded instead.

    With at least as many files as pipelines each reads whole files (none
    reads bytes it throws away); with fewer, every pipeline reads all files
    and keeps every count-th record.
    """
    files = sorted(files)
    if len(files) >= count:
        return files[index::count], False
    return files, True


def shard_records(
    files: str | Sequence[str], index: int, count: int, reader: Callable = tf.data.TFRecordDataset
) -> tf.data.Dataset:
    """Pipeline `index` of `count`'s records of `files` (a glob pattern or a list), read with `reader`."""
    names = tf.io.gfile.glob(files) if isinstance(files, str) else list(files)
    if not names:
        raise FileNotFoundError(f"no files match {files!r}")
    names, by_record = shard_files(names, index, count)
    dataset = reader(names)
    return dataset.shard(count, index) if by_record else dataset


def takes_context(loss_fn: Callable) -> bool:
    """True when `loss_fn` takes a positional argument (the InputContext); False for `loss_fn()`."""
    try:
        parameters = inspect.signature(loss_fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: called as loss_fn()
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.kind in positional or p.kind == inspect.Parameter.VAR_POSITIONAL for p in parameters)


def saved_iterator(dataset: tf.data.Dataset):
    """A one-shot iterator over `dataset` whose position InputPositionHook saves and restores.

    Over NumPy arrays fed when the input starts (`disttrain.input_feeds`) it
    is an initialisable iterator, which `input_feeds.start_inputs` starts.
    """
    iterator = v1.data.make_one_shot_iterator(dataset)
    _ITERATORS.setdefault(v1.get_default_graph(), []).append(iterator)
    return iterator


@dataclasses.dataclass(frozen=True)
class InputContext:
    """What one input pipeline feeds: a tower of a replica.

    replica_index / num_replicas: this replica among those that train (the
      chief and the workers; 0 of 1 in one process).
    tower_index / num_towers: this tower (GPU, or virtual CPU) of the replica.
    batch_size: examples per tower and step (fit's `batch_size`; None if
      the caller did not say).
    global_batch_size: examples per increment of the global step (sync: all
      replicas' towers, less backup workers; async: one replica's towers).
    """

    replica_index: int = 0
    num_replicas: int = 1
    tower_index: int = 0
    num_towers: int = 1
    batch_size: int | None = None
    global_batch_size: int | None = None

    @property
    def num_input_pipelines(self) -> int:
        """One per tower of every replica."""
        return self.num_replicas * self.num_towers

    @property
    def input_pipeline_id(self) -> int:
        return self.replica_index * self.num_towers + self.tower_index

    def shard(
        self, source: str | Sequence[str] | tf.data.Dataset, reader: Callable = tf.data.TFRecordDataset
    ):
        """This pipeline's share of `source`, as a dataset.

        source: a glob pattern or a list of files (read with `reader`, TFRecord
          by default): whole files when there are at least as many as
          pipelines, else every N-th record; or a dataset: every N-th element.
        Every pipeline of the cluster then reads different examples, and
        together they read each one once per epoch.
        """
        if isinstance(source, tf.data.Dataset):
            return source.shard(self.num_input_pipelines, self.input_pipeline_id)
        return shard_records(source, self.input_pipeline_id, self.num_input_pipelines, reader)

    def get_next(self, dataset: tf.data.Dataset):
        """The next element of `dataset`, through an iterator whose position is saved with the run.

        A replica that restarts goes on from its last saved position instead
        of reading its share again from the start (see the module docstring).
        The end of a dataset that does not repeat ends training.
        """
        return saved_iterator(dataset).get_next()


_POSITION = re.compile(r"input-r(\d+)t(\d+)-(\d+)\.index$")


def _latest(directory: str) -> tuple[str, tuple[int, int]] | None:
    """The newest saved position in `directory` (by global step), and its (replicas, towers)."""
    found = []
    for path in glob.glob(os.path.join(directory, "input-r*t*-*.index")):
        if m := _POSITION.search(path):
            replicas, towers, step = (int(g) for g in m.groups())
            found.append((step, os.path.getmtime(path), path[: -len(".index")], (replicas, towers)))
    if not found:
        return None
    _, _, path, shape = max(found)
    return path, shape


class InputPositionHook(v1.train.SessionRunHook):
    """Saves this replica's input positions with the run's checkpoints, and restores the last one.

    Saved every `save_steps` local steps or `save_secs` seconds (as the
    chief's checkpoints), and at the end, under `directory` as
    `input-r<replicas>t<towers>-<global step>`; the last few are kept.
    Restored after the session is created, when the saved positions are of
    the same pipelines (same numbers of replicas and towers); otherwise this
    replica reads its new share from the beginning and says so. Nothing is
    saved or restored when no iterator was made by `InputContext.get_next`.
    """

    def __init__(
        self,
        directory: str,
        context: InputContext,
        global_step: tf.Tensor,
        save_steps: int | None,
        save_secs: float | None,
        keep: int = 3,
    ):
        self._directory, self._context, self._global_step = directory, context, global_step
        self._timer = v1.train.SecondOrStepTimer(
            every_secs=None if save_steps else save_secs, every_steps=save_steps
        )
        self._keep, self._saver, self._steps = keep, None, 0

    def begin(self):
        iterators = _ITERATORS.get(v1.get_default_graph(), [])
        if iterators:
            saveables = [tf.data.experimental.make_saveable_from_iterator(it) for it in iterators]
            self._saver = v1.train.Saver(saveables, max_to_keep=self._keep, save_relative_paths=True)

    def after_create_session(self, session, coord):
        self._steps = 0
        # The first save comes one interval in, not after the first step: a position saved there
        # protects no work, and it is the whole shuffle buffer (57 MB and 3.8 s for 8,000 small
        # images), paid inside the first seconds of training.
        self._timer.update_last_triggered_step(0)
        if self._saver is None:
            return
        latest = _latest(self._directory)
        if latest is None:
            return
        path, shape = latest
        mine = (self._context.num_replicas, self._context.num_towers)
        if shape != mine:
            log.info(
                f"input positions in {path} are of {shape[0]} replica(s) x {shape[1]} tower(s), this run "
                f"has {mine[0]} x {mine[1]}: the shares differ, so this replica reads its new share from "
                "the start"
            )
            return
        self._saver.restore(session, path)
        log.info(f"input position restored from {path}")

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self._global_step) if self._saver is not None else None

    def after_run(self, run_context, run_values):
        if self._saver is None:
            return
        self._steps += 1
        self._step = int(run_values.results)
        if self._timer.should_trigger_for_step(self._steps):
            self._timer.update_last_triggered_step(self._steps)
            self._save(run_context.session)

    def end(self, session):
        if self._saver is not None and self._steps:
            self._save(session)

    def _save(self, session) -> None:
        c = self._context
        os.makedirs(self._directory, exist_ok=True)
        prefix = os.path.join(self._directory, f"input-r{c.num_replicas}t{c.num_towers}")
        try:
            self._saver.save(
                session,
                prefix,
                global_step=self._step,
                latest_filename="input_checkpoint",
                write_meta_graph=False,
            )
        except (tf.errors.OpError, ValueError) as e:  # e.g. a dataset with a py_function cannot be saved
            first = str(getattr(e, "message", e)).strip().splitlines()[0]
            log.warning(
                f"input position not saved ({first}); it is not saved again in this run, and a restart "
                "reads this replica's share from the start"
            )
            self._saver = None
