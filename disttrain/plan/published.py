"""Published distributed-TensorFlow runs, predicted from their published inputs.

Every input is stated here with where it came from (README.md's "Planning a
cluster" repeats them). The models are the model zoo's, built from the
shipped gin files at the published batch size; one GPU's step time is the
published single-GPU rate at that batch. Nothing here is fitted to the
128- or 64-GPU results: the one calibrated constant (`Constants.ps_cores`)
comes from the seed report's one-host rows, which are listed as such.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from disttrain.plan import advice, cost, models

SEED = "tensorflow/tensorflow#5683 (Nov 2016), scripts indhub/tfperftest"
TF_CNN = "tensorflow.org/performance/benchmarks, EC2 distributed K80 (tf_cnn_benchmarks, Apr-May 2017)"

# The seed: EC2 p2.16xlarge (16 K80 per host), one worker per GPU, one PS per host (tfperftest's
# generate_runner.py), synchronous (SyncReplicasOptimizer), TF's replica_device_setter (round robin).
# Link: 20 Gbit/s, AWS's figure for p2.16xlarge (assumed: not in the report).
_SEED_SHAPE = dict(gpus_per_host=16, towers=False, ps_hosts=cost.COLOCATED, link_gbit=20.0)
# tf_cnn_benchmarks: p2.8xlarge (8 K80), PS colocated on the worker hosts, distributed_replicated (one
# worker per host, the host's GPUs as towers, gradients summed on the host), cross_replica_sync.
# Link: 10 Gbit/s, AWS's figure for p2.8xlarge (assumed). Placement: round robin (assumed: the
# benchmark's distributed mode used replica_device_setter's default).
_TF_CNN_SHAPE = dict(gpus_per_host=8, towers=True, ps_hosts=cost.COLOCATED, link_gbit=10.0)


@dataclasses.dataclass(frozen=True)
class Case:
    """One published run and the inputs it is predicted from."""

    source: str
    gin_file: str
    model: str
    batch_size: int
    one_gpu_images_per_sec: float  # published single-GPU rate at that batch: gives the step time
    images_per_sec: float  # published at this scale
    hosts: int
    ps: int
    shape: dict
    note: str = ""
    calibration: bool = False  # used to calibrate Constants.ps_cores, not a prediction

    @property
    def gpus(self) -> int:
        return self.hosts * self.shape["gpus_per_host"]

    @property
    def published_efficiency(self) -> float:
        return self.images_per_sec / (self.gpus * self.one_gpu_images_per_sec)


def _seed(model, gin_file, batch, one, rate, hosts=8, gpus=16, note="", calibration=False):
    shape = dict(_SEED_SHAPE, gpus_per_host=gpus)
    return Case(SEED, gin_file, model, batch, one, rate, hosts, hosts, shape, note, calibration)


CASES = (
    _seed(
        "Inception-v3",
        "inception_v3_sync.gin",
        32,
        17.525,
        94.832,
        hosts=1,
        gpus=8,
        note="one host: no network",
        calibration=True,
    ),
    _seed(
        "Inception-v3",
        "inception_v3_sync.gin",
        32,
        17.525,
        99.072,
        hosts=1,
        gpus=16,
        note="one host: no network",
        calibration=True,
    ),
    _seed(
        "Inception-v3",
        "inception_v3_sync.gin",
        32,
        17.525,
        322.816,
        note="batch 32: tfperftest's example run, whose 17.5 img/s per worker is the report's 1-GPU row",
    ),
    _seed(
        "ResNet-152",
        "resnet152_sync.gin",
        32,
        10.567,
        152.192,
        note="batch 32 assumed (as Inception); the report names ResNet-152 but tfperftest's "
        "resnet_dist.py builds tensorflow/models' CIFAR-style ResNet (5 units, no bottleneck)",
    ),
    _seed(
        "AlexNet",
        "alexnet_sync.gin",
        256,
        92.464,
        874.624,
        note="batch 256: alexnet.py's default; at 32 the fc6 PS's link alone would need 7 s "
        "per round, longer than the published round (4.7 s)",
    ),
    Case(TF_CNN, "inception_v3_sync.gin", "Inception-v3", 64, 29.7, 1783, 8, 6, _TF_CNN_SHAPE),
    Case(TF_CNN, "resnet50_sync.gin", "ResNet-50", 64, 52.4, 2744, 8, 8, _TF_CNN_SHAPE),
    Case(TF_CNN, "resnet152_sync.gin", "ResNet-152", 32, 19.4, 981, 8, 4, _TF_CNN_SHAPE),
)


@dataclasses.dataclass(frozen=True)
class Result:
    case: Case
    prediction: cost.Prediction
    bytes_only: cost.Prediction  # without the PS-process ceiling (Constants.ps_cores=None)
    model: cost.Model

    @property
    def error(self) -> float:
        return self.prediction.efficiency / self.case.published_efficiency - 1


def predict_case(case: Case, model: cost.Model, constants: cost.Constants = cost.DEFAULTS) -> Result:
    shape = cost.Shape(hosts=case.hosts, ps=case.ps, **case.shape)
    strategy = cost.Strategy(cost.SYNC_PS, placement=cost.ROUND_ROBIN)
    p = cost.predict(model, shape, strategy, constants)
    loose = cost.predict(model, shape, strategy, dataclasses.replace(constants, ps_cores=None))
    return Result(case, p, loose, model)


def predict_all(load_config: Callable, cases=CASES) -> list[Result]:
    """Every case; `load_config(gin_files, bindings)` parses gin (the script's edge does it)."""
    built: dict[tuple[str, int], cost.Model] = {}
    out = []
    for case in cases:
        key = (case.gin_file, case.batch_size)
        if key not in built:
            config = load_config([case.gin_file], [f"TrainConfig.batch_size={case.batch_size}"])
            built[key] = models.model_from_config(config, 1.0, case.model)
        model = built[key].replace(step_time=case.batch_size / case.one_gpu_images_per_sec)
        out.append(predict_case(case, model))
    return out


def table(results: list[Result]) -> str:
    lines = [
        f"{'source':6s} {'model':13s} {'GPUs':>4s} {'hosts':>5s} {'PS':>3s} {'batch':>5s} "
        f"{'published':>9s} {'predicted':>9s} {'error':>6s} {'bytes only':>10s}  bottleneck"
    ]
    for r in results:
        c = r.case
        tag = "seed" if c.source == SEED else "tf_cnn"
        lines.append(
            f"{tag:6s} {c.model:13s} {c.gpus:4d} {c.hosts:5d} {c.ps:3d} {c.batch_size:5d} "
            f"{c.published_efficiency:9.3f} {r.prediction.efficiency:9.3f} {100 * r.error:+5.0f}% "
            f"{r.bytes_only.efficiency:10.3f}  {r.prediction.bottleneck}"
            + ("  (calibration)" if c.calibration else "")
        )
    lines.append(
        "efficiency = images/s over GPUs x one GPU's published rate; bytes only: no PS-process ceiling"
    )
    return "\n".join(lines)


def seed_answer(result: Result) -> tuple[cost.Prediction, cost.Prediction, list[str]]:
    """The seed's cluster with disttrain: its placement alone, then the best changes one after another.

    Returns (the same layout with disttrain's placement, the recommended layout, the changes).
    """
    strategy = dataclasses.replace(result.prediction.strategy, placement=cost.DISTTRAIN)
    same = cost.predict(result.model, result.prediction.shape, strategy)
    best, steps = advice.best_layout(result.model, result.prediction.shape, strategy)
    return same, best, steps


def answers_table(results: list[Result]) -> str:
    """The seed's 128-GPU cases with disttrain: the same layout, a PS layout with towers, the best one."""
    lines = ["the seed's cluster with disttrain (predicted efficiency, synchronous as the seed ran):"]
    for r in results:
        if r.case.source != SEED or r.case.calibration:
            continue
        same, best, steps = seed_answer(r)
        shape = dataclasses.replace(r.prediction.shape, towers=True)
        towers = cost.predict(
            r.model, shape, dataclasses.replace(r.prediction.strategy, placement=cost.DISTTRAIN)
        )
        lines.append(
            f"  {r.case.model:13s} TF default {r.prediction.efficiency:.3f}; disttrain's placement alone "
            f"{same.efficiency:.3f}; + towers (sync PS, {shape.ps} PS) {towers.efficiency:.3f}; "
            f"recommended {best.efficiency:.3f} ({best.examples_per_sec:.0f} img/s): "
            + "; ".join(steps)
            + f" -> {best.strategy.describe()}, bottleneck {best.bottleneck}"
        )
    return "\n".join(lines)
