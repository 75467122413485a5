"""Deprecated: the cloud TCP held-out runs are data now (`plan/data/`, read by `plan.runs`).

`runs.ring_runs(runs.CLOUD_TCP)` gives these runs, `runs.notes(runs.CLOUD_TCP)`
their sources' notes, `runs.citations()` the sources.
"""

from __future__ import annotations

import warnings

from disttrain.plan import runs

warnings.warn(
    "disttrain.plan.cloud_tcp is deprecated: use disttrain.plan.runs (ring_runs, notes, citations)",
    DeprecationWarning,
    stacklevel=2,
)

ScaledRun = CloudRun = runs.RingRun
_CITED = runs.citations()
HOROVOD_396_WSKINNER = _CITED["horovod_396_wskinner"]
HOROVOD_396_RICHARDLIAW = _CITED["horovod_396_richardliaw"]
AWS_SAMPLES_2 = _CITED["aws_samples_2"]
HOROVOD_779 = _CITED["horovod_779"]
HOROVOD_871 = _CITED["horovod_871"]
NOTES = runs.notes(runs.CLOUD_TCP)
RUNS = runs.ring_runs(runs.CLOUD_TCP)
