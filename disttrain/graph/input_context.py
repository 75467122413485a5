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

from disttrain.base.errors import ConfigError, NoFilesError
from disttrain.graph import run_steps

v1 = tf.compat.v1
log = logging.getLogger("disttrain")
# The iterators saved_iterator made, per graph. Not a graph collection: a collection of Python
# objects makes every meta-graph export (each checkpoint) warn that it cannot serialize them.
_ITERATORS: weakref.WeakKeyDictionary[tf.Graph, list] = weakref.WeakKeyDictionary()
# Per graph, every `get_next`'s (tower, "this batch is real data" flag), in the order they were
# made: a strategy takes those its tower's loss made (`flags_since`) to weigh the tower (Join).
_PRESENT: weakref.WeakKeyDictionary[tf.Graph, list] = weakref.WeakKeyDictionary()
# Per graph and tower, the iterators its first build's `get_next` calls made, in order: the
# tower's later builds (micro-batches, steps of a run) read from them again.
_TOWER_ITERATORS: weakref.WeakKeyDictionary[tf.Graph, dict[int, list]] = weakref.WeakKeyDictionary()


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
        raise NoFilesError(f"no files match {files!r}: check the pattern, and that this task can read them")
    say_uneven(names, count)
    names, by_record = shard_files(names, index, count)
    dataset = reader(names)
    return dataset.shard(count, index) if by_record else dataset


_SAID: set[tuple] = set()


def say_uneven(names: Sequence[str], count: int) -> None:
    """One line (once per process) when `names` do not divide evenly among `count` pipelines.

    Pipelines then end at different steps (see `joined`): the line gives
    the files and bytes each one reads.
    """
    key = (tuple(sorted(names)), count)
    if key in _SAID or count == 1:
        return
    _SAID.add(key)
    names = sorted(names)
    if len(names) < count:
        log.info(
            f"input: {len(names)} file(s) for {count} pipelines: each keeps one record in {count} of all "
            "of them, so their record counts may differ by one batch; a pipeline whose data ends first "
            "waits with zero weight while the others finish (Join)"
        )
        return
    if len(names) % count == 0 and len({_size(n) for n in names}) == 1:
        return
    shares = [names[i::count] for i in range(count)]
    each = ", ".join(f"{len(s)} ({sum(_size(n) for n in s) / 2**20:.1f} MiB)" for s in shares)
    log.info(
        f"input: {len(names)} files do not divide evenly among {count} pipelines: files (bytes) per "
        f"pipeline {each}; pipelines whose data ends first wait with zero weight while the others finish "
        "(Join)"
    )


def _size(name: str) -> int:
    try:
        return tf.io.gfile.stat(name).length
    except tf.errors.OpError:
        return 0


def joined(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset`'s elements as (element, True), then a stand-in element as (element, False) for ever.

    What lets a synchronous cluster go on when one pipeline's data ends
    before the others' (PyTorch calls it Join): the tower whose data ended
    keeps computing on a stand-in batch whose gradient weighs nothing,
    instead of ending its replica and leaving its peers waiting. The
    stand-in is the pipeline's first element read again (real shapes and
    types, so a model that parses or reshapes it works), or zeros when the
    pipeline had no element at all.
    """
    real = tf.data.Dataset.zip((dataset, tf.data.Dataset.from_tensors(True).repeat()))
    stand_in = dataset.take(1).cache().repeat()
    zeros = _zeros(dataset.element_spec)
    if zeros is not None:
        stand_in = stand_in.concatenate(zeros.repeat())
    return real.concatenate(tf.data.Dataset.zip((stand_in, tf.data.Dataset.from_tensors(False).repeat())))


def _zeros(spec) -> tf.data.Dataset | None:
    """One element of zeros (empty strings) with `spec`'s structure; None if a part is not a dense tensor.

    A dimension the spec leaves open gets 1.
    """
    specs = tf.nest.flatten(spec)
    if not all(isinstance(s, tf.TensorSpec) and s.shape.rank is not None for s in specs):
        return None
    zeros = [tf.zeros([d if d is not None else 1 for d in s.shape.as_list()], s.dtype) for s in specs]
    return tf.data.Dataset.from_tensors(tf.nest.pack_sequence_as(spec, zeros))


def flags_since(graph: tf.Graph, start: int) -> list[tf.Tensor]:
    """The data-present flags `get_next` made in `graph` from the `start`-th on (see `joined`)."""
    return [flag for _, flag in _PRESENT.get(graph, [])[start:]]


def flag_count(graph: tf.Graph) -> int:
    """How many data-present flags `get_next` has made in `graph` so far."""
    return len(_PRESENT.get(graph, []))


def takes_context(loss_fn: Callable) -> bool:
    """True when `loss_fn` takes a positional argument (the InputContext); False for `loss_fn()`.

    A ConfigError when it needs more than one: disttrain has nothing else to give it.
    """
    try:
        parameters = inspect.signature(loss_fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: called as loss_fn()
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p.name for p in parameters if p.kind in positional and p.default is p.empty]
    if len(required) > 1:
        name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
        raise ConfigError(
            f"{name}({', '.join(required)}) needs {len(required)} arguments: disttrain calls it with none, "
            "or with one, the InputContext (bind the others with functools.partial)"
        )
    return any(p.kind in positional or p.kind == inspect.Parameter.VAR_POSITIONAL for p in parameters)


def saved_iterator(dataset: tf.data.Dataset):
    """A one-shot iterator over `dataset` whose position InputPositionHook saves and restores.

    Over NumPy arrays fed when the input starts (`disttrain.graph.input_feeds`) it
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
      replicas' towers, less backup workers; async: one replica's towers),
      every micro-batch counted.
    reads_again: this tower's loss is being built again in the same graph
      (a later micro-batch, or a later step of a run): `get_next` then reads
      the next batch from the iterators its first build made, in the order
      it called them.
    """

    replica_index: int = 0
    num_replicas: int = 1
    tower_index: int = 0
    num_towers: int = 1
    batch_size: int | None = None
    global_batch_size: int | None = None
    reads_again: bool = False
    _reads: list = dataclasses.field(default_factory=list, compare=False, repr=False)

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
        The end of a dataset that does not repeat ends this pipeline's
        training: under every strategy the other pipelines go on with their
        own data while this tower computes on a stand-in batch that weighs
        nothing (`joined`; `data_present()` tells which); training ends when
        every pipeline's data has ended.
        """
        element, present = self._iterator(joined(dataset)).get_next()
        _PRESENT.setdefault(v1.get_default_graph(), []).append((self.tower_index, present))
        return element

    def _iterator(self, dataset: tf.data.Dataset):
        """A new saved iterator over `dataset`; with `reads_again`, the first build's of this call."""
        made = _TOWER_ITERATORS.setdefault(v1.get_default_graph(), {}).setdefault(self.tower_index, [])
        call = len(self._reads)
        if not self.reads_again:
            iterator = saved_iterator(dataset)
            made.append(iterator)
        elif call >= len(made) or made[call].element_spec != dataset.element_spec:
            raise ConfigError(
                f"the loss function's get_next call {call + 1} reads another dataset than its first build "
                "did (each micro-batch and step of a run builds the loss again, and must call get_next "
                "on the same datasets in the same order)"
            )
        else:
            iterator = made[call]
        self._reads.append(iterator)
        return iterator

    def data_present(self) -> tf.Tensor:
        """A bool tensor: True while every batch this tower's `get_next` calls read is real data.

        False once one of them has ended and the tower computes on a stand-in
        batch with zero weight. True (a constant) before any `get_next`.
        """
        mine = [flag for tower, flag in _PRESENT.get(v1.get_default_graph(), []) if tower == self.tower_index]
        return tf.reduce_all(tf.stack(mine)) if mine else tf.constant(True)


_POSITION = re.compile(r"input-r(\d+)t(\d+)-(\d+)\.index$")


def _latest(directory: str, at_most: int | None = None) -> tuple[str, tuple[int, int]] | None:
    """The newest saved position in `directory` (by global step, at most `at_most`), and its
    (replicas, towers)."""
    found = []
    for path in glob.glob(os.path.join(directory, "input-r*t*-*.index")):
        if m := _POSITION.search(path):
            replicas, towers, step = (int(g) for g in m.groups())
            if at_most is not None and step > at_most:
                continue
            found.append((step, os.path.getmtime(path), path[: -len(".index")], (replicas, towers)))
    if not found:
        return None
    _, _, path, shape = max(found)
    return path, shape


class InputPositionHook(v1.train.SessionRunHook):
    """Saves this replica's input positions with the run's checkpoints, and restores the last one.

    Saved every `save_steps` local steps or `save_secs` seconds (as the
    chief's checkpoints), and at the end, under `directory` as
    `input-r<replicas>t<towers>-<global step>`; the last `keep` are kept. With
    both None (no checkpoints) nothing is saved: a position is worth keeping
    only beside the model state it goes with.
    Restored after the session is created (a restart, or a session
    recovered after a lost PS): the newest position saved at or before the
    global step the model is at, so that what a restored checkpoint never
    saw is read again rather than skipped; when the saved positions are of
    other pipelines (other numbers of replicas or towers) this replica reads
    its new share from the beginning and says so. Nothing is
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
        self._timer = None  # never saves
        if save_steps is not None or save_secs is not None:
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
        if self._timer is not None:
            self._timer.update_last_triggered_step(0)
        if self._saver is None:
            return
        # The newest position the model has trained past: after a PS was lost the chief restores an
        # older checkpoint, and a newer position would skip what that checkpoint never saw.
        step = self._model_step(session)
        latest = _latest(self._directory, at_most=step)
        if latest is None:
            latest = _latest(self._directory)
            if latest is None:
                return
            log.warning(
                f"no input position saved at or before global step {step} is left (the oldest kept is "
                f"{latest[0]}): what this replica read between them is not read again"
            )
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

    def _model_step(self, session) -> int:
        """The global step the model is at, read now from its variable (the step's fetch may be a
        mirror that lags)."""
        variable = v1.train.get_global_step()
        return int(session.run(self._global_step if variable is None else variable))

    def after_run(self, run_context, run_values):
        if self._saver is None:
            return
        self._steps += run_steps.steps_in(run_context)
        if self._timer is not None and self._timer.should_trigger_for_step(self._steps):
            self._timer.update_last_triggered_step(self._steps)
            self._save(run_context.session)

    def end(self, session):
        if self._saver is not None and self._timer is not None and self._steps:
            self._save(session)

    def _save(self, session) -> None:
        c = self._context
        os.makedirs(self._directory, exist_ok=True)
        prefix = os.path.join(self._directory, f"input-r{c.num_replicas}t{c.num_towers}")
        try:
            # Read after the run, not with it (a step fetched with a run may be read before any of its
            # steps): a position saved under an older step than it has read to would skip data on a
            # restore.
            step = self._model_step(session)
            self._saver.save(
                session,
                prefix,
                global_step=step,
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
