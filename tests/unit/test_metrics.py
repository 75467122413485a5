import math

import pytest

from disttrain.runtime import metrics


def test_rates():
    assert metrics.rate(10, 2) == 5
    assert metrics.rate(10, 0) == 0
    assert metrics.cluster_examples_per_sec(global_steps=30, examples_per_global_step=64, seconds=2) == 960


def test_scaling_efficiency_and_async_throughput():
    assert metrics.scaling_efficiency(180, 2, 100) == pytest.approx(0.9)
    # The fast worker does not make up for the slow ones: 4 x the slowest.
    assert metrics.async_throughput([0.19, 0.24, 1.14, 0.28]) == pytest.approx(0.76)
    assert metrics.async_throughput([]) == 0


def test_summarize():
    s = metrics.summarize([10, 12, 14])
    assert s.mean == 12 and s.count == 3
    assert s.stderr == pytest.approx(2 / math.sqrt(3))
    assert s.jitter == 2
    assert metrics.summarize([]).count == 0
    assert metrics.summarize([5]).stderr == 0


def test_throughput_drop_needs_a_sustained_fall():
    steady = [100, 102, 99, 101]
    assert metrics.throughput_drop(steady, window=2) < 0.02  # noise
    assert metrics.throughput_drop(steady + [50], window=2) < 0.02  # one slow interval is not a drop
    assert metrics.throughput_drop(steady + [50, 40], window=2) == pytest.approx(0.51, abs=0.01)
    assert metrics.throughput_drop([100], window=3) == 0  # not enough history
    assert metrics.throughput_drop([0, 0, 0, 0], window=2) == 0


def test_process_memory_is_positive():
    assert metrics.process_memory_mb() > 10
