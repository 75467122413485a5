"""What the strategies with variables on parameter servers share: the plan, the pieces, their order.

`PsStrategy` sits between `Strategy` and the PS strategies (async and sync).
It owns the state only they need: the plan of variables over the PS tasks by
bytes (`placement.make_plan`), `piece_bytes` (variables cut into pieces moved
in waves), and the placement of whatever the plan did not place. It does not
decide how gradients reach the variables: subclasses do (`apply_gradients`).
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from disttrain.base.errors import ConfigError
from disttrain.graph import placement
from disttrain.strategies import waves
from disttrain.strategies.base import Strategy

v1 = tf.compat.v1


class PsStrategy(Strategy):
    """Variables on the PS tasks, balanced by bytes; large ones split, optionally into pieces.

    piece_bytes: cut every variable larger than this into pieces of its own on
      the PS (None: only as balance needs), and read them in waves in the
      order the model asks for them (`disttrain.strategies.waves`).
    """

    uses_ps = True

    def __init__(
        self,
        cluster,
        num_towers: int | None = None,
        max_imbalance: float = 0.05,
        piece_bytes: int | None = None,
    ):
        super().__init__(cluster, num_towers, max_imbalance)
        if piece_bytes is not None and piece_bytes < 1:
            raise ConfigError(f"{type(self).__name__}.piece_bytes must be >= 1 (or None), got {piece_bytes}")
        self.piece_bytes = piece_bytes

    @property
    def variable_devices(self) -> list[str]:
        """The PS tasks (this task's first compute device when there are none: one process alone)."""
        if self.cluster.num_ps:
            return list(self.cluster.ps_devices)
        return super().variable_devices

    def plan_from(self, specs) -> placement.Plan | None:
        """The plan for these variable specs (None without PS tasks); notes the tables."""
        super().plan_from(specs)
        if not self.cluster.num_ps:
            return None
        return placement.make_plan(specs, self.cluster.num_ps, self.max_imbalance, self.piece_bytes)

    def place_remaining(self, global_step) -> None:
        """Balance the model variables no plan placed: whole, by bytes, onto the PS tasks."""
        if not self.cluster.num_ps:
            return
        outside = [
            part.op
            for var in v1.global_variables()
            for part in placement.variable_parts(var)
            if not tf.DeviceSpec.from_string(part.op.device).job  # made before scope(): no PS yet
        ]
        ops = [op for op in dict.fromkeys(self.setter.unplanned + outside) if op is not global_step.op]
        loads = self.plan.loads if self.plan is not None else ()
        if ops:
            _, self._record.placed.placed_whole = placement.place_whole(ops, self.cluster.num_ps, loads)

    def compute_gradients(self, optimizer, loss, read: Callable | None = None):
        """As the base; with piece_bytes and PS tasks, the default read brings variables in waves."""
        if read is None and callable(loss) and self.piece_bytes and self.cluster.num_ps:
            read = self._ordered_read()
        return super().compute_gradients(optimizer, loss, read)

    def _ordered_read(self) -> Callable:
        """A `read` for the towers: each variable crosses once the one two waves before it has."""
        order = waves.Waves(self.piece_bytes)

        def read(var):
            gate = order.gate(waves.static_bytes(var))
            with tf.device(var.device), tf.control_dependencies(gate):
                value = var.read_value()
            arrived = tf.identity(value)
            order.arrived([arrived.op])
            return arrived

        return read
