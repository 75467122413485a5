"""Steady-state rates and windows from log lines (pure, no processes)."""

import dataclasses
import logging

import pytest

from disttrain.base import logs
from disttrain.bench.measure import Sample, measure, parse_line


def console(message: str, level: int = logging.INFO) -> str:
    """`message` as a task's console shows it (disttrain.base.logs' format)."""
    record = logging.LogRecord("disttrain", level, __file__, 1, message, None, None)
    return logging.Formatter(logs.FORMAT, logs.DATE_FORMAT).format(record)


def test_parse_worker_and_chief_lines():
    w = parse_line(console("/job:worker/task:1 step 840  loss 0.1234  examples/sec 402.1 (this task)"))
    assert w == {
        "task": "/job:worker/task:1",
        "global_step": 840,
        "local_examples_per_sec": 402.1,
        "loss": 0.1234,
        "cluster_examples_per_sec": None,
        "global_steps_per_sec": None,
    }
    c = parse_line(
        console(
            "/job:worker/task:0 step 850  loss 2.3  examples/sec 400.0 (this task)  1604.2 (cluster)  "
            "global_step/sec 12.53"
        )
    )
    assert (c["cluster_examples_per_sec"], c["global_steps_per_sec"]) == (1604.2, 12.53)
    assert parse_line(console("/job:worker/task:0 finished: 2 local steps to global step 32")) is None
    assert parse_line(console("placement (variables per PS): 1 PS")) is None
    # Only disttrain's own console lines count, not the same text printed by something else.
    assert parse_line("/job:worker/task:1 step 840  loss 0.1234  examples/sec 402.1 (this task)") is None


def test_throughput_line_round_trips_through_its_one_definition():
    from disttrain.runtime import metrics

    line = metrics.THROUGHPUT_LINE.format(task="/job:chief/task:0", step=7, loss=1.5, local=33.25)
    line += metrics.CLUSTER_SUFFIX.format(cluster=99.5, gsps=3.0)
    assert parse_line(console(line)) == {
        "task": "/job:chief/task:0",
        "global_step": 7,
        "local_examples_per_sec": 33.2,
        "loss": 1.5,
        "cluster_examples_per_sec": 99.5,
        "global_steps_per_sec": 3.0,
    }


def _samples(t0, period, n, step0, dstep, eps, chief=False, bytes_per_step=None, losses=None):
    out = []
    for k in range(n):
        step = step0 + k * dstep
        out.append(
            Sample(
                t=t0 + k * period,
                global_step=step,
                local_examples_per_sec=eps,
                loss=losses[k] if losses else 2.0,
                cluster_examples_per_sec=2 * eps if chief else None,
                global_steps_per_sec=2 * eps / 10 if chief else None,
                link_bytes=((step * bytes_per_step, step * bytes_per_step),) if bytes_per_step else None,
                cpu_seconds={"w0": step * 0.01} if chief else None,
            )
        )
    return out


def test_rates_and_window():
    # Two replicas, 10 steps per line, batch 10. The chief logs every 1 s at 100 examples/s
    # (10 steps/s); the other starts 2.5 s later and logs every 2 s at 50 examples/s.
    # Warm-up 1 interval: the chief's first line is at t=0, the other's at t=2.5, so
    # t_start = 2.5. Measured chief intervals begin at lines seen >= 2.5 (t=3, 4, ...).
    chief = _samples(0.0, 1.0, 10, 10, 20, 100.0, chief=True, bytes_per_step=1000)
    other = _samples(2.5, 2.0, 4, 15, 20, 50.0)
    m = measure({"w0": chief, "w1": other}, "w0", every_n=10, examples_per_step=10, warmup=1, measure=2)
    assert m is not None
    assert m.t_start == 2.5
    # chief: lines at t = 4..9 follow lines seen at >= 2.5 (t = 3..8): 6 intervals.
    # other: lines at t = 4.5, 6.5, 8.5 follow 2.5, 4.5, 6.5: 3 intervals.
    assert m.intervals == {"w0": 6, "w1": 3}
    assert m.steps_per_sec == {"w0": pytest.approx(10.0), "w1": pytest.approx(5.0)}
    assert m.cluster_examples_per_sec == pytest.approx(200.0)
    # Window: chief lines t = 3 (global step 70) to t = 9 (step 190): 120 steps in 6 s.
    assert (m.window_start.t, m.window_end.t, m.window_global_steps) == (3.0, 9.0, 120)
    assert m.link_bytes_per_step() == [(pytest.approx(1000.0), pytest.approx(1000.0))]
    assert m.cpu_seconds_per_step() == {"w0": pytest.approx(0.01)}
    assert (m.first_loss, m.max_loss, m.diverged) == (2.0, 2.0, False)


def test_bytes_per_step_count_the_steps_the_counters_saw():
    # 20 global steps/s, 1,000 bytes per step, one line per 10 steps written at t = 0.5 k.
    # The benchmark sees the window's first line (t = 1, step 20) 0.3 s late and its last
    # (t = 4.5, step 90) on time: its counters span 64 steps, not the lines' 70. Dividing
    # by the lines' steps would read 914 bytes per step; by the steps the counters saw, 1,000.
    lines = _samples(0.0, 0.5, 10, 0, 10, 100.0, chief=True)
    late = {2: 0.3}  # line index -> how late it was seen
    seen = [
        dataclasses.replace(
            s,
            t=s.t + late.get(k, 0.0),
            link_bytes=((int(1000 * 20 * (s.t + late.get(k, 0.0))),) * 2,),
            cpu_seconds={"w0": 0.01 * 20 * (s.t + late.get(k, 0.0))},
        )
        for k, s in enumerate(lines)
    ]
    m = measure({"w0": seen}, "w0", every_n=10, examples_per_step=10, warmup=3, measure=2)
    assert m is not None and m.window_global_steps == 70
    assert m.window_counted_steps == pytest.approx(64.0)
    assert m.link_bytes_per_step() == [(pytest.approx(1000.0), pytest.approx(1000.0))]
    assert m.cpu_seconds_per_step() == {"w0": pytest.approx(0.01)}


def test_divergence_is_flagged():
    # The chief's first loss is 2.3; a measured interval logs 30 (> 10 x 2.3 = 23): diverged.
    # A loss falling to 0.001 is training, not diverging.
    falling = _samples(0.0, 1.0, 4, 10, 10, 100.0, chief=True, losses=[2.3, 1.0, 0.01, 0.001])
    m = measure({"w0": falling}, "w0", 10, 10, warmup=1, measure=2)
    assert not m.diverged
    rising = _samples(0.0, 1.0, 4, 10, 10, 100.0, chief=True, losses=[2.3, 2.3, 30.0, 2.3])
    m = measure({"w0": rising}, "w0", 10, 10, warmup=1, measure=2)
    assert m.diverged and m.max_loss == 30.0


def test_not_ready_until_every_replica_has_measured_intervals():
    chief = _samples(0.0, 1.0, 10, 10, 20, 100.0, chief=True)
    late = _samples(8.5, 1.0, 2, 15, 20, 50.0)  # warm at 8.5: only one interval after it
    assert measure({"w0": chief, "w1": late}, "w0", 10, 10, warmup=1, measure=2) is None
    late.append(_samples(10.5, 1.0, 1, 55, 20, 50.0)[0])  # second interval: but the chief has 1
    assert measure({"w0": chief, "w1": late}, "w0", 10, 10, warmup=1, measure=2) is None
    with pytest.raises(ValueError):
        measure({"w0": chief}, "w0", 10, 10, warmup=0, measure=1)


def test_wait_until_quiet_gives_up_after_its_timeout():
    from disttrain.bench.watch import wait_until_quiet

    said = []
    # Anything is quieter than 100 cores: returns after one reading, says nothing.
    assert wait_until_quiet(100.0, timeout=5, log=said.append, sample_secs=0.1) < 100
    assert said == []
    # Nothing is quieter than -1 cores: waits out its timeout, then goes ahead.
    wait_until_quiet(-1.0, timeout=0.3, log=said.append, sample_secs=0.1)
    assert said[0].startswith("  waiting for a quiet machine") and said[-1].endswith("going ahead")


def test_repetition_reported_is_the_median_of_the_quiet_sane_ones():
    from types import SimpleNamespace

    from disttrain.bench.runner import _quietest

    def rep(rate, other, diverged=False):
        m = SimpleNamespace(cluster_examples_per_sec=rate, diverged=diverged)
        return {"measurement": m, "other_busy_cores": other}

    a, b, c = rep(300, 0.0), rep(400, 0.1), rep(350, 0.0)
    noisy, broken = rep(100, 1.0), rep(900, 0.0, diverged=True)
    assert _quietest([a, noisy, b, c, broken]) is c  # median of 300, 350, 400
    assert _quietest([a, b]) is a  # the lower of two
    assert _quietest([noisy, rep(200, 0.8)])["other_busy_cores"] == 0.8  # none quiet: the quietest
    assert _quietest([broken, noisy]) is noisy  # a diverged run only if nothing else ran
    failed = {"error": "boom"}
    assert _quietest([failed]) is failed
    # References are plain dicts.
    assert (
        _quietest([{"steps_per_sec": 5.0, "other_busy_cores": 0.0}, {"error": "x"}])["steps_per_sec"] == 5.0
    )
