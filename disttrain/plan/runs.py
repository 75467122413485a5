"""The published runs the planner is checked against, read from the data files in `plan/data/`.

Each source (a paper, a README, a benchmark report, an issue thread) has
one JSON file named after it, holding its runs as published, the quotes
they come from, and the inputs the source leaves unsaid, marked assumed.
`data/sets.json` splits them: one calibration set, the only rows any
constant was chosen or checked against, and four held-out sets, each with
the rule that chose its rows and how they were kept apart (which commit
came first). A table of a source file names the set its runs are in.

This module turns the rows into `Case`s, the planner's inputs; nothing
here predicts (`plan.published` does).

A source file:

    {"format": "disttrain.plan.runs", "version": 1, "source": "...", "setup": "...",
     "tables": [{"key": "...", "citation": "...", "set": "held-out", "published": "...",
                 "setup": "...", "note": "...", "defaults": {...}, "runs": [{...}, ...]}]}

`citation` is where the runs were published, with their figures quoted
(it is each `Case.source`); `published`, the source's text the figures
come from when the citation does not quote it; `setup`, what the source
states of the set-up and what is assumed; `note`, the assumptions each
`Case` carries.

A run is its table's `defaults` updated by its own fields: `model` (a name
of `sets.json`'s `models`), `batch_size` (per GPU), `hosts`, `ps` (0: no
PS), `gpus_per_host`, `towers`, `ps_hosts`, `link_gbit`, `host_bus`,
`strategy`, `placement` (PS strategies), `bucket_mib` (all-reduce; 0: every
tensor on its own), `transport` (`grpc`: TF's gRPC as `cost.Constants`
hold it); the published rate, `images_per_sec`, or `efficiency` when only
that is published; and what it is scaled against: `one_gpu_images_per_sec`,
or `one_host_images_per_sec` (then one GPU's step is one host's rate over
its GPUs). `rates_per_gpu` on a table: its rates are per GPU, as printed.
`calibrated`: a row `Constants.ps_cores` was fitted to. `why` (a run's or
its table's): what is known of its miss, printed only while it misses.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

from disttrain.plan import cost, transports

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SETS_FILE = "sets.json"
FORMAT, SETS_FORMAT, VERSION = "disttrain.plan.runs", "disttrain.plan.sets", 1

CALIBRATION, HELD_OUT, CLOUD_TCP = "calibration", "held-out", "held-out, cloud TCP"
RING = "held-out, NCCL rings"
PCIE_RINGS = "held-out, PCIe rings"
HELD_OUT_SPLITS = (HELD_OUT, CLOUD_TCP, RING, PCIE_RINGS)
SPLITS = (CALIBRATION, *HELD_OUT_SPLITS)

_SHAPE = ("gpus_per_host", "towers", "ps_hosts", "link_gbit", "host_bus")


@dataclasses.dataclass(frozen=True)
class Case:
    """One published run and the inputs it is predicted from.

    images_per_sec: published at this scale; or `efficiency`, when the
    source gives only that (then the one-GPU rate only sets the step time).
    split: one of `SPLITS`; calibrated: a row `Constants.ps_cores` was
    fitted to (the seed's one-host rows). why: what is known of its miss.
    """

    source: str
    gin_files: tuple[str, ...]
    model: str
    batch_size: int
    one_gpu_images_per_sec: float  # published single-GPU rate at that batch: gives the step time
    images_per_sec: float | None
    hosts: int
    ps: int
    shape: dict
    strategy: cost.Strategy = cost.Strategy(cost.SYNC_PS, placement=cost.ROUND_ROBIN)
    split: str = CALIBRATION
    note: str = ""
    calibrated: bool = False
    efficiency: float | None = None
    one_host_images_per_sec: float | None = None  # set: scaling is against one host, as published
    why: str = dataclasses.field(default="", compare=False)

    @property
    def gpus(self) -> int:
        return self.hosts * self.shape["gpus_per_host"]

    @property
    def published_efficiency(self) -> float:
        """Against N x one GPU; or, with `one_host_images_per_sec`, against N x one host."""
        if self.efficiency is not None:
            return self.efficiency
        if self.one_host_images_per_sec is not None:
            return self.images_per_sec / (self.hosts * self.one_host_images_per_sec)
        return self.images_per_sec / (self.gpus * self.one_gpu_images_per_sec)

    @property
    def transport(self) -> str:
        return self.strategy.transport.name if self.strategy.transport else cost.GRPC


@dataclasses.dataclass(frozen=True)
class RingRun:
    """A run scaled against one host, as its source gives it (whole-cluster rates), over an NCCL ring."""

    source: str
    model: str
    gin_files: tuple[str, ...]
    batch_size: int  # per GPU
    hosts: int
    images_per_sec: float
    one_host_images_per_sec: float
    gpus_per_host: int
    link_gbit: float
    transport: str  # transports.NCCL_TCP.name or transports.NCCL_RDMA.name
    bucket_mib: float  # Horovod's fusion buffer or DDP's bucket_cap_mb

    @property
    def scaling(self) -> float:
        """The published scaling against one host: rate / (hosts x one host's rate)."""
        return self.images_per_sec / (self.hosts * self.one_host_images_per_sec)


class DataError(ValueError):
    """A data file the loader cannot read as the format says."""


def _read(name: str, form: str) -> dict:
    path = os.path.join(DATA, name)
    with open(path) as f:
        doc = json.load(f)
    if doc.get("format") != form or doc.get("version") != VERSION:
        raise DataError(f"{path}: expected format {form!r} version {VERSION}")
    return doc


@functools.cache
def sets() -> dict:
    """`data/sets.json`: the sets in order (name, files, rule, discipline) and each model's gin files."""
    return _read(SETS_FILE, SETS_FORMAT)


@functools.cache
def source_file(name: str) -> dict:
    """One source's file, `data/<name>.json`."""
    return _read(name + ".json", FORMAT)


def _strategy(run: dict) -> cost.Strategy:
    transport = run.get("transport", cost.GRPC)
    fields = {"transport": None if transport == cost.GRPC else transports.TRANSPORTS[transport]}
    if "placement" in run:
        fields["placement"] = run["placement"]
    if "bucket_mib" in run:  # 0 MB (every tensor on its own) is one byte: the model caps buckets at tensors
        fields["bucket_bytes"] = max(1, int(run["bucket_mib"] * 2**20))
    return cost.Strategy(run["strategy"], **fields)


def _runs(table: dict) -> list[dict]:
    """The table's runs, each its defaults updated by its own fields, rates per GPU made the cluster's."""
    out = []
    for own in table["runs"]:
        run = {**table.get("defaults", {}), **own}
        if table.get("rates_per_gpu"):
            gpus = run["gpus_per_host"]
            run["images_per_sec"] *= run["hosts"] * gpus
            run["one_host_images_per_sec"] *= gpus
        out.append(run)
    return out


def _case(run: dict, table: dict, split: str) -> Case:
    shape = {k: run[k] for k in _SHAPE if k in run}
    shape["host_bus"] = transports.HOST_BUSES[run["host_bus"]]
    one_host = run.get("one_host_images_per_sec")
    one_gpu = one_host / run["gpus_per_host"] if one_host is not None else run["one_gpu_images_per_sec"]
    return Case(
        table["citation"],
        tuple(sets()["models"][run["model"]]),
        run["model"],
        run["batch_size"],
        one_gpu,
        run.get("images_per_sec"),
        run["hosts"],
        run.get("ps", 0),
        shape,
        _strategy(run),
        split,
        run.get("note", table.get("note", "")),
        run.get("calibrated", False),
        run.get("efficiency"),
        one_host,
        run.get("why", table.get("why", "")),
    )


def _tables(split: str):
    """(file name, table) of every table in `split`, in the set's file order."""
    for s in sets()["sets"]:
        if s["name"] == split:
            for name in s["files"]:
                for table in source_file(name)["tables"]:
                    if table["set"] == split:
                        yield name, table
            return
    raise DataError(f"no set {split!r} in {SETS_FILE}: expected one of {', '.join(SPLITS)}")


@functools.cache
def cases(split: str) -> tuple[Case, ...]:
    """Every run of `split`, as the planner predicts it."""
    return tuple(_case(run, table, split) for _, table in _tables(split) for run in _runs(table))


def citations() -> dict[str, str]:
    """Every table's key and the citation its runs carry as their source."""
    return {
        t["key"]: t["citation"]
        for s in sets()["sets"]
        for name in dict.fromkeys(s["files"])
        for t in source_file(name)["tables"]
    }


def notes(split: str) -> dict[str, str]:
    """Each source of `split` and its table's note: the inputs it leaves unsaid, as assumed."""
    return {t["citation"]: t.get("note", "") for _, t in _tables(split)}


def ring_runs(split: str) -> tuple[RingRun, ...]:
    """The runs of `split` scaled against one host, as `RingRun`s (their rates as the source gives them)."""
    return tuple(
        RingRun(
            t["citation"],
            run["model"],
            tuple(sets()["models"][run["model"]]),
            run["batch_size"],
            run["hosts"],
            run["images_per_sec"],
            run["one_host_images_per_sec"],
            run["gpus_per_host"],
            run["link_gbit"],
            run["transport"],
            run["bucket_mib"],
        )
        for _, t in _tables(split)
        for run in _runs(t)
        if "one_host_images_per_sec" in run
    )


def set_info(split: str) -> dict:
    """`split`'s entry of `sets.json`: its title, files, rule and discipline."""
    return next(s for s in sets()["sets"] if s["name"] == split)


_CITED = citations()
SEED = _CITED["tensorflow_5683"]
TF_CNN = _CITED["tensorflow_org_k80"]
HOROVOD_16 = _CITED["horovod_16"]
HOROVOD_64 = _CITED["horovod_64"]
HOROVOD_SCALE = _CITED["horovod_scaling_chart"]
TF_BENCH_29 = _CITED["tensorflow_benchmarks_29"]

CALIBRATION_CASES = cases(CALIBRATION)
HELD_OUT_CASES = cases(HELD_OUT)
CLOUD_TCP_CASES = cases(CLOUD_TCP)
RING_CASES = cases(RING)
PCIE_RING_CASES = cases(PCIE_RINGS)
CASES = CALIBRATION_CASES + HELD_OUT_CASES + CLOUD_TCP_CASES + RING_CASES + PCIE_RING_CASES
