"""Transfers between a worker and its PS tasks in order, a few at a time.

TF starts every transfer of a step at once, so they share the link and the
first tensor arrives about as late as the last: nothing that waits for one
of them (an update, the pull after it, the forward pass over a layer) starts
until all have crossed. Cut into waves of about `wave_bytes` and let wave k
leave only once wave k - `in_flight` has arrived, they arrive one after
another, and what needs the early ones runs while the later ones are still
on the wire: the update and pull of one piece overlap the push of the next
(both directions of a full-duplex link busy), and the first layers compute
while the last ones' variables arrive.
"""

from __future__ import annotations

import math

import tensorflow as tf

IN_FLIGHT = 2  # enough to cover the round trip that releases the next wave


class Waves:
    """Hands out, per transfer in the order they are built, the ops that must come first.

    For each transfer: `gate(nbytes)` before building it (a list of ops to
    make its sending side depend on: empty for the first `in_flight` waves),
    then `arrived(ops)` with the ops that mark its arrival. Without
    `wave_bytes` (None) everything is one wave and nothing is gated.
    """

    def __init__(self, wave_bytes: float | None, in_flight: int = IN_FLIGHT):
        self._limit = wave_bytes or math.inf
        self._in_flight = in_flight
        self._waves: list[list[tf.Operation]] = [[]]
        self._bytes = 0

    def gate(self, nbytes: int) -> list[tf.Operation]:
        if self._bytes and self._bytes + nbytes > self._limit:
            self._waves.append([])
            self._bytes = 0
        self._bytes += nbytes
        k = len(self._waves) - 1
        return list(self._waves[k - self._in_flight]) if k >= self._in_flight else []

    def arrived(self, ops) -> None:
        self._waves[-1].extend(ops)

    @property
    def count(self) -> int:
        return len(self._waves)


def static_bytes(tensor) -> int:
    """Bytes of a tensor or variable by its static shape (unknown dimensions count as 1)."""
    shape = tensor.shape
    count = math.prod(d or 1 for d in shape.as_list()) if shape.rank is not None else 1
    return count * tensor.dtype.size
