"""What one `minimize()` call is building, and the record of what it built.

A strategy used to keep its build on itself: the tower, micro-batch and
step of the run being built, the loss, the data weight, the stop step and
the reads the loop needs were attributes set while `minimize()` ran and
read back by the training loop. Now:

- `Building` is one call in progress: its settings (batch size,
  micro-batches, steps per run, the aggregate clip), where it is (step of
  the run, tower, micro-batch) and the tensors made so far. `minimize()`
  makes it and the strategy's build code reads it as `self.building`, for
  the length of the call only; a strategy that builds inside another's (a
  hybrid's ring) builds within the same one (`Strategy.building_within`).
- `Step` is what the call built, frozen: the train op and everything the
  loop fetches or feeds. `Strategy.build_step()` returns it; `minimize()`
  returns its train op, and the strategy keeps the last record for
  `disttrain.session(strategy)` (`Strategy.built`).
- A strategy's own pieces of a build (the async PS's transfer loop, the sync
  PS's aggregation ops, the ring's instance keys and vote) are its `Made`,
  kept in the `Building` they belong to (`Building.made`, one per strategy
  taking part) and read as `strategy.made`: a new build starts from none.
- `Placed` is where the strategy puts variables in the graph at hand: the
  plan, the device setter, the embedding tables, the variables placed whole.
  `plan_placement()`, `scope()` and `place_remaining()` fill it in.

`Record`, made in the strategy's constructor, holds all of these: nothing
else on a strategy changes after its constructor.

`strategy.loss`, `strategy.step_in_run` and the other names of 0.1.0 stay,
as read-only views of the build in progress or else of the last record
(`FIELDS`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import tensorflow as tf

if TYPE_CHECKING:
    from disttrain.graph import placement


@dataclasses.dataclass
class Building:
    """One `minimize()` call while it builds: its settings, where it is, and what it has made so far."""

    global_step: tf.Variable
    batch_size: int | None = None  # examples per tower and micro-batch, when minimize() is told
    accumulate_steps: int = 1  # micro-batches per update
    steps_per_run: int = 1  # steps one session.run makes
    aggregate_clip: float | None = None  # the global norm clip_aggregate clips to (None: no clip there)
    # Where the build is: the step of the run whose update apply_gradients builds (once per step,
    # in order), the tower and the micro-batch whose loss is being built (towers call loss_fn in turn).
    step_in_run: int = 0
    tower: int = 0
    micro_batch: int = 0
    # Made while building. The mean loss over towers (micro-batches with data).
    loss: tf.Tensor | None = None
    # This replica's towers that read real data this step (float32), when its input comes through
    # InputContext.get_next (None: it never ends; see input_context.joined).
    data_weight: tf.Tensor | None = None
    # True in a step that had no data where the update needs some: the update was skipped and
    # training is over for this replica (set by when_data; None: never).
    no_data: tf.Tensor | None = None
    # With several steps per run: a placeholder the loop feeds with the last step (steps at or past
    # it change nothing), and the global step read when the run starts.
    stop_at: tf.Tensor | None = None
    run_start: tf.Tensor | None = None
    # What a step fetches as the global step, where reading the variable would cost the step a
    # round trip to its PS (None: read the variable); an op bringing it up to the global step before
    # the final checkpoint; and what the loop compares with the last step where this replica's
    # updates still in flight would take the global step past it (None: the global step).
    global_step_read: tf.Tensor | None = None
    global_step_refresh: tf.Operation | None = None
    stop_step_read: tf.Tensor | None = None
    # Each strategy's own pieces of this build (its `Made`), by strategy: a hybrid's ring builds
    # within the hybrid's build and keeps its own here.
    made: dict = dataclasses.field(default_factory=dict)

    @property
    def reads_again(self) -> bool:
        """A repeated build of a tower (a later micro-batch or step of the run): it reads the next batch."""
        return self.micro_batch > 0 or self.step_in_run > 0


@dataclasses.dataclass(frozen=True)
class Step:
    """What one `minimize()` call built: the train op and what the training loop fetches or feeds."""

    train_op: tf.Operation
    loss: tf.Tensor | None
    global_step: tf.Variable
    batch_size: int | None
    accumulate_steps: int
    steps_per_run: int
    data_weight: tf.Tensor | None
    no_data: tf.Tensor | None
    stop_at: tf.Tensor | None
    # How many of a run's steps trained (int64): those with data, before `stop_at`. None: every
    # step of every run (input that never ends, one step per run).
    steps_trained: tf.Tensor | None
    global_step_read: tf.Tensor | None
    global_step_refresh: tf.Operation | None
    stop_step_read: tf.Tensor | None

    @property
    def global_step_fetch(self) -> tf.Tensor:
        """What a step fetches as the global step: the cheap read where there is one, else the variable."""
        return self.global_step if self.global_step_read is None else self.global_step_read

    @classmethod
    def of(cls, building: Building, train_op: tf.Operation, steps_trained: tf.Tensor | None) -> Step:
        fields = {f.name for f in dataclasses.fields(cls)} - {"train_op", "steps_trained"}
        return cls(
            train_op=train_op,
            steps_trained=steps_trained,
            **{name: getattr(building, name) for name in fields},
        )


@dataclasses.dataclass
class Made:
    """A strategy's own pieces of one build: a strategy with any declares a subclass with its fields."""


@dataclasses.dataclass
class Placed:
    """Where a strategy puts variables in the graph at hand (kept across its builds)."""

    # The plan of variables over the PS tasks (None: no plan; variables go greedily, whole).
    plan: placement.Plan | None = None
    # The device setter scope() installs: a callable op -> device with `tower(device)` and `plan`.
    setter: placement.DeviceSetter | None = None
    # Embedding tables by name, known from the scratch build that made the plan (None: not known).
    tables: frozenset[str] | None = None
    # The variables placed whole because they were too large for a fair share.
    placed_whole: Sequence[placement.Unsplit] = ()


class Record:
    """A strategy's builds and placement: the build in progress (`building`), the last one it took
    part in (`last`), the last one's record (`built`), and where it places variables (`placed`).

    Made in the strategy's constructor; the only state a build leaves on it.
    `loose` collects what the strategy's parts make when called on their own,
    outside any `minimize()` (a test's or a user's `compute_gradients`).
    """

    def __init__(self):
        self.building: Building | None = None
        self.last: Building | None = None
        self.built: Step | None = None
        self.loose = Building(global_step=None)
        self.placed = Placed()

    def now(self) -> Building | Step:
        """The build in progress, else the last record, else the loose parts'."""
        if self.building is not None:
            return self.building
        return self.built if self.built is not None else self.loose

    def made_by(self, strategy) -> Made:
        """`strategy`'s own pieces of the build in progress, else of the last one it took part in
        (else of its loose parts), made empty on first use."""
        build = next(b for b in (self.building, self.last, self.loose) if b is not None)
        if strategy not in build.made:
            build.made[strategy] = strategy.Made()
        return build.made[strategy]


# What each field is before anything is built: Building's defaults (Step's own fields: None).
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Building) if f.default is not dataclasses.MISSING}
# Set by a strategy's apply_gradients (0.1.0's subclasses assigned them on self): writable, into the build.
SET_BY_SUBCLASSES = ("global_step_read", "global_step_refresh", "stop_step_read")


def view(name: str) -> property:
    """`strategy.<name>` (one of 0.1.0's names): the build in progress's, else the last record's.

    A Step has no `tower`, `micro_batch` or `step_in_run`: read after a build, they are as before one.
    """
    default = _DEFAULTS.get(name)

    def get(self):
        return getattr(self._record.now(), name, default)

    def set_(self, value):
        setattr(self.building, name, value)

    doc = f"The build's `{name}` (read-only: see disttrain.strategies.building)."
    return property(get, set_ if name in SET_BY_SUBCLASSES else None, doc=doc)
