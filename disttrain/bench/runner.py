"""Run the scaling benchmark: every system x PS count x worker count, plus one process alone.

    config = BenchConfig(gin_files=("gin/bench/mlp.gin",), load_config=..., workers=(1, 2))
    report = Benchmark(config, log=print).run()

Each run is a real cluster of `disttrain-train` processes (disttrain.edges.local), or
of one of TF 2's strategies' peer programs (bench.tf2), on
loopback or on emulated hosts with shaped links (bench.netem), stopped by the
benchmark once every replica has run its warm-up and measured steps (see
bench.measure for how rates and windows are taken, bench.watch for the polling). The reference is the same
model and batch trained by one process with no cluster at all; its step time
is C in the bound (bench.bound) and N x its rate is the ideal line.

`load_config(bindings)` turns gin bindings into a TrainConfig (the script
parses the gin files; this library never reads gin or flags). It is used to
read the batch size, the log interval, the model's bytes (D, and R for a model
with embedding tables, from its input pipeline: see `traffic.model_bytes`) and, by
building the graph as `zoo_run.dry_run` does, how many bytes each PS holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence

import tensorflow as tf

from disttrain import launch, strategies
from disttrain.base.cluster import CHIEF, PS, WORKER, Cluster
from disttrain.base.config import TrainConfig
from disttrain.base.errors import ConfigError
from disttrain.bench import bound as bound_lib
from disttrain.bench import budget as budget_lib
from disttrain.bench import measure as measure_lib
from disttrain.bench import netem, tf2
from disttrain.bench.watch import Proc, RunFailed, other_cores, stop, wait_until_quiet, watch
from disttrain.edges import local, zoo_run
from disttrain.graph import placement
from disttrain.plan import diagnose, traffic
from disttrain.runtime import metrics

v1 = tf.compat.v1

LOCALHOST, EMULATED = "localhost", "emulated"
NETWORKS = (LOCALHOST, EMULATED)
SYSTEMS = ("disttrain", "tf_default", *tf2.PEERS)
PLACEMENTS = (traffic.DEDICATED, traffic.COLOCATED)
_PORTS = {PS: 2222, WORKER: 2223, CHIEF: 2224}  # emulated hosts: each namespace has its own ports
ALONGSIDE = 2  # --host_cores: processes alone beside each cluster run, on consecutive hosts (so both cores)


class BenchError(ConfigError):
    """The benchmark cannot run as asked; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class StrategyKind:
    """A replica strategy as the benchmark sees it: how to bind it and how to count it."""

    name: str  # the --strategy value (Strategy.kind)
    class_name: str  # the gin name and class name
    synchronous: bool
    uses_ps: bool
    dense_over_ring: bool = False

    @classmethod
    def of(cls, strategy: type[strategies.Strategy], class_name: str | None = None) -> StrategyKind:
        """What `strategy` declares (kind, synchronous, uses_ps, ...), under its own name or `class_name`."""
        return cls(
            strategy.kind,
            class_name or strategy.__name__,
            strategy.synchronous,
            strategy.uses_ps,
            strategy.dense_over_ring,
        )

    @property
    def binding(self) -> str:
        return f"TrainConfig.strategy=@{self.class_name}"


# Every strategy of disttrain.strategies that is not a baseline, by its kind.
STRATEGIES = {kind: StrategyKind.of(cls) for kind, cls in strategies.by_kind().items()}
TF_DEFAULT = StrategyKind.of(strategies.TFDefault)
# TF 2's strategies (bench.tf2): not gin bindings; each is counted as the disttrain strategy it matches.
TF2_PSS = StrategyKind.of(strategies.AsyncParameterServer, "ParameterServerStrategy")
TF2_MWMS = StrategyKind.of(strategies.SyncAllReduce, "MultiWorkerMirroredStrategy")


def _strategy_of(system: str) -> str | None:
    """'hybrid' for the system 'disttrain:hybrid' (disttrain under that strategy), else None.

    Several strategies of disttrain run beside the peers in one benchmark run that way.
    """
    name, _, kind = system.partition(":")
    return kind if name == "disttrain" and kind else None


_logdirs = itertools.count(1)


def new_logdir(root: str = "/tmp/disttrain_bench") -> str:
    """A log directory of one benchmark's own (time, pid, serial), not yet created.

    Each run's directory is emptied before the run, so two benchmarks sharing
    one would delete each other's logs while they run.
    """
    return os.path.join(root, f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_logdirs)}")


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to run. Worker and PS counts are per run; every combination is run per system."""

    gin_files: Sequence[str]
    load_config: Callable[[Sequence[str]], TrainConfig]
    gin_params: Sequence[str] = ()
    workers: Sequence[int] = (1, 2)
    ps: Sequence[int] = (1,)
    systems: Sequence[str] = SYSTEMS
    strategy: str | None = None  # None: the config's own
    network: str = LOCALHOST
    link_mbit: float | None = None  # emulated only
    # Emulated, instead of link_mbit: the link moves the model's bytes each way in this many of one
    # process's steps (set once the first reference has run; bound.link_mbit_for_ratio).
    link_ratio: float | None = None
    latency_ms: float = 0.0
    # Emulated: each host's CPU budget in cores (bench.budget), one process alone under the same.
    host_cores: float | None = None
    ps_placement: str = traffic.DEDICATED
    warmup_steps: int = 20  # per replica
    measure_steps: int = 50  # per replica, at least
    reference: bool = True
    repeats: int = 1  # each run (and the reference) this many times; the quietest counts
    quiet_cores: float | None = None  # before each run, wait until others use fewer cores
    quiet_timeout: float = 600.0  # seconds to wait for that at most
    run_timeout: float = 900.0  # seconds per run
    logdir: str = dataclasses.field(default_factory=new_logdir)
    keep_checkpoints: bool = False  # False: each run's checkpoints are deleted once it is measured
    netns_prefix: str = "dtbench"


@dataclasses.dataclass(frozen=True)
class RunSpec:
    system: str
    kind: StrategyKind
    workers: int
    ps: int
    layout: str

    @property
    def peer(self) -> tf2.Peer | None:
        """The TF 2 peer this run starts, or None for a disttrain-train cluster."""
        return tf2.PEERS.get(self.system)

    @property
    def label(self) -> str:
        ps = f" {self.ps} PS {self.layout}" if self.kind.uses_ps else " all-reduce"
        return f"{self.system} ({self.kind.name}) {self.workers} worker(s){ps}"


def transfer_itemsize(config: TrainConfig) -> int:
    """Bytes per float32 value config.strategy sends (2 with a 16-bit transfer_dtype).

    Builds the strategy for a stand-in cluster of 64 workers and a PS (any
    backup_workers fits); nothing starts.
    """
    jobs = {WORKER: [f"localhost:{i + 1}" for i in range(64)], PS: ["localhost:100"]}
    return traffic.transfer_itemsize(config.strategy(Cluster(jobs=jobs, task_type=WORKER, task_index=0)))


def ps_loads(config: TrainConfig, num_ps: int) -> list[int]:
    """Bytes of variables each PS holds under config.strategy (as zoo_run.dry_run builds it)."""
    jobs = {WORKER: ["localhost:1"], PS: [f"localhost:{i + 2}" for i in range(num_ps)]}
    view = Cluster(jobs=jobs, task_type=WORKER, task_index=0)
    with tf.Graph().as_default():
        built = zoo_run.build_zoo(view, config, config.strategy(view))
    return placement.ps_loads(built.graph, num_ps, include_slots=False)


class Benchmark:
    """Runs a BenchConfig and returns the report (a JSON-ready dict).

    `log` receives progress lines; `on_update(report)` is called after every
    run with the report so far (the script writes it, so a stopped benchmark
    keeps what it measured).
    """

    def __init__(self, config: BenchConfig, log: Callable[[str], None] = print, on_update=None):
        self.config = config
        self.log = log
        self.on_update = on_update or (lambda report: None)
        self._validate()
        self._t0 = time.monotonic()
        self._itemsizes: dict[str, int] = {}  # bytes per float each disttrain strategy sends, by kind
        self._link_mbit = config.link_mbit  # with link_ratio: set by the first reference

    # ---- set-up ---------------------------------------------------------------

    def _validate(self) -> None:
        c = self.config
        if c.network not in NETWORKS:
            raise BenchError(f"--network={c.network}: expected one of {', '.join(NETWORKS)}")
        if c.ps_placement not in PLACEMENTS:
            raise BenchError(f"--ps_placement={c.ps_placement}: expected one of {', '.join(PLACEMENTS)}")
        if not c.workers or min(c.workers) < 1:
            raise BenchError(f"--workers={list(c.workers)}: need worker counts >= 1")
        if not c.ps or min(c.ps) < 1:
            raise BenchError(f"--ps={list(c.ps)}: need PS counts >= 1")
        bad = [s for s in c.systems if s not in SYSTEMS and _strategy_of(s) not in STRATEGIES]
        if bad or not c.systems:
            raise BenchError(
                f"--systems={','.join(c.systems)}: expected some of {', '.join(SYSTEMS)}, or "
                f"disttrain:<strategy> ({', '.join(STRATEGIES)})"
            )
        if c.strategy is not None and c.strategy not in STRATEGIES:
            raise BenchError(f"--strategy={c.strategy}: expected one of {', '.join(STRATEGIES)}")
        if c.repeats < 1:
            raise BenchError(f"--repeats={c.repeats}: need at least 1")
        if c.warmup_steps < 1 or c.measure_steps < 1:
            raise BenchError(f"need warmup and measured steps >= 1, got {c.warmup_steps}, {c.measure_steps}")
        if c.network == EMULATED:
            self._validate_link()
            reason = netem.check_permitted(latency=c.latency_ms > 0)
            if reason is not None:
                raise BenchError(f"emulated hosts unavailable: {reason}")
        elif c.link_mbit is not None or c.link_ratio is not None or c.latency_ms:
            raise BenchError(
                "--link_mbit, --link_ratio and --link_latency_ms shape emulated links: use --network=emulated"
            )
        if c.host_cores is not None:
            reason = budget_lib.check_permitted()
            if reason is not None:
                raise BenchError(f"--host_cores: CPU budgets unavailable: {reason}")
            if not c.reference:
                raise BenchError(
                    "--host_cores measures one process alone under the same budget: drop --noreference"
                )

    def _validate_link(self) -> None:
        c = self.config
        if (c.link_mbit is None) == (c.link_ratio is None):
            raise BenchError(
                "--network=emulated needs the link's rate: --link_mbit (Mbit/s) or --link_ratio (the "
                "model's bytes each way in that many of one process's steps), one of them"
            )
        given, value = (
            ("--link_mbit", c.link_mbit) if c.link_mbit is not None else ("--link_ratio", c.link_ratio)
        )
        if not value > 0:
            raise BenchError(f"{given} must be > 0, got {value}")
        if c.link_ratio is not None and not c.reference:
            raise BenchError("--link_ratio scales the link to one process's step: drop --noreference")

    def _check_budgets_fit(self, specs: list[RunSpec]) -> None:
        """With --host_cores: emulated hosts, and every run's hosts and the ones alongside fit."""
        c = self.config
        if c.host_cores is None:
            return
        if c.network != EMULATED:
            raise BenchError("--host_cores gives each emulated host its budget: use --network=emulated")
        most = ALONGSIDE + max(self._hosts_of(spec)[0] for spec in specs)
        self._check_fits(most, f"--host_cores={c.host_cores:g}")

    def _check_fits(self, hosts: int, flag: str) -> None:
        """BenchError, before anything starts, if `hosts` budgets of --host_cores do not fit this machine."""
        try:
            budget_lib.cores_on_each(hosts, self.config.host_cores, self._ncpus)
        except budget_lib.BudgetError as e:
            raise BenchError(f"{flag}: {e}") from None

    @property
    def _ncpus(self) -> int:
        return len(os.sched_getaffinity(0))

    def _budgets(self, num_hosts: int):
        """The hosts' CPU budgets (a context manager), or nothing without --host_cores."""
        if self.config.host_cores is None:
            return contextlib.nullcontext()
        return budget_lib.CpuBudgets(num_hosts, self.config.host_cores, prefix=self.config.netns_prefix)

    @staticmethod
    def _budget_got(m: measure_lib.Measurement, budgets) -> dict | None:
        """What each host's budget gave it over the measured window; RunFailed if one may not have got it."""
        if budgets is None:
            return None
        got = budget_lib.got(m.window_start.budget, m.window_end.budget, budgets.cores, budgets.pinned)
        if got["refused"]:
            raise RunFailed(f"refused: {got['refused']}")
        return got

    def _kind(self, system: str) -> StrategyKind:
        if system == "tf_default":
            return TF_DEFAULT
        if _strategy_of(system) is not None:
            return STRATEGIES[_strategy_of(system)]
        if system in tf2.PEERS:
            return TF2_PSS if tf2.PEERS[system].uses_ps else TF2_MWMS
        if self.config.strategy is not None:
            return STRATEGIES[self.config.strategy]
        own = self.config.load_config(self._bindings()).strategy
        for kind, cls in strategies.by_kind().items():
            if isinstance(own, type) and issubclass(own, cls):
                return STRATEGIES[kind]
        raise BenchError(
            f"the config's strategy {own!r} is not one the benchmark counts; "
            f"pass --strategy={'|'.join(STRATEGIES)}"
        )

    def _bindings(self, kind: StrategyKind | None = None) -> list[str]:
        """Gin bindings of every run: the user's, then the benchmark's own (which win)."""
        out = list(self.config.gin_params)
        out += [
            f"TrainConfig.train_steps={10**9}",  # the benchmark stops the run itself
            "TrainConfig.save_checkpoint_steps=None",
            f"TrainConfig.save_checkpoint_secs={10**9}",
        ]
        if self.config.host_cores is not None:  # TF's pool sized to the budget, not to what TF counts
            out.append(f"TrainConfig.intra_op_threads={budget_lib.threads(self.config.host_cores)}")
        if kind is not None:
            out.append(kind.binding)
        return out

    def _specs(self) -> list[RunSpec]:
        c = self.config
        specs = []
        for system in c.systems:
            kind = self._kind(system)
            for ps in c.ps if kind.uses_ps else (0,):
                layout = c.ps_placement if kind.uses_ps else traffic.RING
                for n in c.workers:
                    specs.append(RunSpec(system, kind, n, ps, layout))
        return specs

    # ---- running --------------------------------------------------------------

    def _gin_files(self) -> list[str]:
        # Tasks run with cwd = the repository; a file given relative to here must still be found.
        return [os.path.abspath(f) if os.path.exists(f) else f for f in self.config.gin_files]

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self._t0:6.0f}s"

    def _watch(
        self, procs, replicas, chief, every_n, batch, link_bytes, label, budgets=None
    ) -> measure_lib.Measurement:
        c = self.config
        return watch(
            procs,
            replicas,
            chief,
            every_n,
            batch,
            warmup=max(1, math.ceil(c.warmup_steps / every_n)),
            measure=max(1, math.ceil(c.measure_steps / every_n)),
            timeout=c.run_timeout,
            link_bytes=link_bytes,
            budget=(lambda: budget_lib.read(budgets)) if budgets is not None else None,
            progress=lambda line: self.log(f"{self._elapsed()}   {label}: {line}"),
        )

    def _start_alone(self, logdir: str, budgets, slot: int) -> Proc:
        """One process alone, no cluster (the same model, batch and threads), on budget `slot`'s host."""
        env = local.task_env({k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
        env["PYTHONUNBUFFERED"] = "1"
        logdir = self._fresh(logdir)
        log_path = os.path.join(logdir, "logs", "local.log")
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        argv = [*local.TRAIN_COMMAND, f"--logdir={logdir}"]
        argv += [f"--gin_file={f}" for f in self._gin_files()]
        argv += [f"--gin_param={p}" for p in self._bindings(STRATEGIES["async_ps"])]
        argv = budgets.wrap(slot, argv) if budgets is not None else argv
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen(argv, env=env, **local.task_process_options(log_file))
        return Proc(f"/job:localhost/replica:{slot}/task:0", proc, log_path)

    def _stop_alone(self, procs: list[Proc]) -> None:
        stop([p.proc for p in procs])
        for p in procs:
            self._drop_checkpoints(os.path.dirname(os.path.dirname(p.log_path)))

    def _run_copies(self, name: str, copies: int) -> tuple[measure_lib.Measurement, list[str], dict | None]:
        """`copies` processes alone, each on a host budget of its own (--host_cores), measured together:
        (Measurement, each copy's task name, what the budgets gave them or None)."""
        every_n, batch = self._model["every_n"], self._model["batch"]
        procs: list[Proc] = []
        with self._budgets(copies) as budgets:
            try:
                for i in range(copies):
                    logdir = os.path.join(self.config.logdir, name + (f"_copy{i}" if copies > 1 else ""))
                    procs.append(self._start_alone(logdir, budgets, i))
                self.log(f"{self._elapsed()} {name}: {copies} process(es) alone; logs {procs[0].log_path}")
                names = [p.name for p in procs]
                m = self._watch(procs, names, names[0], every_n, batch, None, name, budgets)
            finally:
                self._stop_alone(procs)
            return m, names, self._budget_got(m, budgets)

    def _run_reference(self, rep: int) -> dict:
        """One process alone, no cluster: the same model, batch and threads (and budget)."""
        batch = self._model["batch"]
        name = "reference" + (f"_{rep + 1}" if self.config.repeats > 1 else "")
        m, (task,), got = self._run_copies(name, 1)
        rate = m.steps_per_sec[task]
        cpu = (m.cpu_seconds_per_step() or {}).get(task)
        other = other_cores(m)
        self.log(
            f"{self._elapsed()} reference: {rate:.2f} steps/s, {rate * batch:.1f} examples/s"
            + (f" (other processes kept {other:.1f} cores busy)" if other is not None else "")
            + (
                f"; its budget {self.config.host_cores:g} core(s), used {got['hosts'][0]['used_cores']:.2f}"
                if got
                else ""
            )
        )
        return {
            "steps_per_sec": rate,
            "examples_per_sec": rate * batch,
            "step_time_sec": 1.0 / rate if rate else None,
            "cpu_seconds_per_step": cpu,
            "other_busy_cores": other,
            "window_seconds": m.window_seconds,
            "logdir": os.path.join(self.config.logdir, name),
            **({"host_budget": got} if got else {}),
        }

    @staticmethod
    def _fresh(path: str) -> str:
        """An empty directory (a leftover checkpoint would be restored by the chief)."""
        if os.path.isdir(path):
            shutil.rmtree(path)
        os.makedirs(path)
        return path

    def _hosts_of(self, spec: RunSpec) -> tuple[int, dict[tuple[str, int], int]]:
        """Number of emulated hosts and the host of each (job, index)."""
        n, p = spec.workers, spec.ps
        host = {(WORKER, i): i for i in range(n)}
        if spec.peer is not None and spec.peer.uses_ps:
            host[(CHIEF, 0)] = 0  # TF 2's coordinator: control traffic only, beside worker 0
        if spec.layout == traffic.DEDICATED:
            host.update({(PS, j): n + j for j in range(p)})
            return n + p, host
        host.update({(PS, j): j for j in range(p)})  # colocated: PS j on worker j's host
        return n, host

    def _cluster(self, spec: RunSpec, logdir: str, **where) -> local.LocalCluster:
        """The run's cluster, not started: disttrain-train tasks, or a TF 2 peer's (bench.tf2)."""
        if spec.peer is not None:
            peer_spec = self._peer_specs[spec.system]
            return tf2.PeerCluster(
                spec.peer, peer_spec, logdir, spec.ps, spec.workers, env=dict(os.environ), **where
            )
        return local.LocalCluster(
            gin_files=self._gin_files(),
            logdir=logdir,
            num_ps=spec.ps,
            num_workers=spec.workers,
            gin_params=self._bindings(spec.kind),
            env=dict(os.environ),
            **where,
        )

    def _run_cluster(self, spec: RunSpec, logdir: str, every_n: int, batch: int) -> tuple:
        """Start the cluster, measure it, stop it.

        Returns (Measurement, host roles, PS loads or None, what each host's CPU budget gave it or None).
        """
        c = self.config
        label = f"{spec.system} {spec.workers}w/{spec.ps}ps"
        if c.network == LOCALHOST:
            m, loads = self._measure_cluster(self._cluster(spec, logdir), logdir, every_n, batch, None, label)
            return m, None, loads, None
        num_hosts, host = self._hosts_of(spec)
        roles = [[] for _ in range(num_hosts)]
        for (job, i), h in sorted(host.items(), key=lambda item: (item[0][0] != WORKER, item[0][1])):
            roles[h].append(f"{job}{i}")  # "worker0+ps0" on a shared host
        emulated = netem.EmulatedHosts(num_hosts, self._link_mbit, c.latency_ms, prefix=c.netns_prefix)
        # With budgets, ALONGSIDE processes alone run beside the cluster, each on a host budget of its own
        # (the last ones): the cluster's rate is then compared with one host's in the same window, whatever
        # the machine's speed did meanwhile, on both cores (one can run 5% slower than the other for minutes).
        with emulated as hosts, self._budgets(num_hosts + ALONGSIDE) as budgets:

            def address(job: str, i: int) -> str:
                return f"{hosts.address(host[(job, i)])}:{_PORTS[job]}"

            def popen(task, argv, env, log_file):
                h = host[(task.job, task.index)]
                argv = budgets.wrap(h, argv) if budgets is not None else argv
                return hosts.popen(h, argv, env=env, **local.task_process_options(log_file))

            def counters() -> tuple:
                return tuple(hosts.link_bytes(h) for h in range(num_hosts))

            cluster = self._cluster(spec, logdir, addresses=address, popen=popen)
            m, loads = self._measure_cluster(cluster, logdir, every_n, batch, counters, label, budgets)
            got = self._budget_got(m, budgets)
        return m, ["+".join(r) for r in roles], loads, got

    def _measure_cluster(self, cluster, logdir, every_n, batch, counters, label, budgets=None) -> tuple:
        """(Measurement, bytes per PS as a TF 2 peer placed them, or None: disttrain's are planned).

        With budgets, the process alone beside the cluster is watched with it and taken out of the
        Measurement again: its rate is `alongside`."""
        alone: list[Proc] = []
        try:
            cluster.start()
            if isinstance(cluster, tf2.PeerCluster):
                procs, replicas, chief = cluster.watched()
            else:
                procs = [Proc(t.name, t.proc, t.log_path) for t in cluster.tasks]
                replicas = [t.name for t in cluster.tasks if t.job != PS]
                chief = cluster.chief_task.name
            for k in range(ALONGSIDE if budgets is not None else 0):
                slot = budgets.num_hosts - ALONGSIDE + k
                alone.append(self._start_alone(os.path.join(logdir, f"alongside{k}"), budgets, slot))
            names = [p.name for p in alone]
            m = self._watch(
                [*procs, *alone], replicas + names, chief, every_n, batch, counters, label, budgets
            )
            loads = cluster.ps_loads() if isinstance(cluster, tf2.PeerCluster) else None
            return _without(m, names), loads
        finally:
            cluster.stop()
            self._stop_alone(alone)

    # ---- the whole benchmark ------------------------------------------------------

    def run(self) -> dict:
        c = self.config
        specs = self._specs_cache = self._specs()
        self._check_budgets_fit(specs)
        base = c.load_config(self._bindings())
        every_n, batch = base.log_every_steps, base.batch_size
        sizes = traffic.model_bytes(base)
        self._model = {"every_n": every_n, "batch": batch, "bytes": sizes}
        report = {
            "config": self._report_config(base, sizes),
            "reference": None,
            "runs": [],
        }
        self.log(
            f"benchmark: {len(specs)} run(s) + reference, x{c.repeats}; model {report['config']['model']} "
            f"{sizes.total / 1e6:.1f} MB{_lookup_note(sizes)}, batch {batch}, {c.network}"
            + (f" {c.link_mbit:g} Mbit/s" if c.network == EMULATED and c.link_mbit else "")
            + (f" links at ratio {c.link_ratio:g} to one process's step" if c.link_ratio else "")
            + f"; logs in {c.logdir}"
        )
        self._peer_specs = self._tf2_specs()
        loads = {}
        for spec in specs:
            if spec.kind.uses_ps and spec.peer is None and (spec.system, spec.ps) not in loads:
                loads[(spec.system, spec.ps)] = ps_loads(c.load_config(self._bindings(spec.kind)), spec.ps)
        refs: list[dict] = []
        measured: list[list[dict]] = [[] for _ in specs]
        for rep in range(c.repeats):
            if c.reference:
                refs.append(self._reference(rep))
                if c.link_ratio is not None and self._link_mbit is None:
                    report["config"]["link_mbit"] = self._scaled_link(refs[0], sizes)
            for k, spec in enumerate(specs):
                measured[k].append(self._measure(spec, k, rep))
                report["reference"] = _quietest(refs) if refs else None
                ref = (report["reference"] or {}).get("steps_per_sec")
                report["runs"] = [
                    self._row(spec, loads.get((spec.system, spec.ps)), ref, ms)
                    for spec, ms in zip(specs, measured, strict=True)
                    if ms  # not run yet
                ]
                self.on_update(report)
        return report

    def _report_config(self, base: TrainConfig, sizes: traffic.ModelBytes) -> dict:
        """The report's `config`: what ran, on what, and when."""
        c = self.config
        return {
            "gin_files": list(c.gin_files),
            "gin_params": list(c.gin_params),
            "model": type(base.model).__name__,
            "model_bytes": sizes.total,
            **_lookup_fields(sizes),
            "batch_size": base.batch_size,
            "intra_op_threads": base.intra_op_threads,
            "inter_op_threads": base.inter_op_threads,
            "network": c.network,
            "link_mbit": c.link_mbit,
            "link_ratio": c.link_ratio,
            "latency_ms": c.latency_ms,
            "host_cores": c.host_cores,
            "budget_period_ms": budget_lib.PERIOD_US / 1000 if c.host_cores else None,
            "ps_placement": c.ps_placement,
            "warmup_steps": c.warmup_steps,
            "measure_steps": c.measure_steps,
            "repeats": c.repeats,
            "steps_per_log_line": base.log_every_steps,
            "cpus": os.cpu_count(),
            "tensorflow": tf.__version__,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),  # the tables' date
        }

    def check_budget(self, counts: Sequence[int]) -> dict:
        """Is --host_cores fair here? K copies of one process's step, each on a budget of its own, run
        together, against one copy alone under the same budget, for each K in `counts`.

        Fair when every copy's rate, together and alone, is within FAIR of every other's
        (budget.spread); each window also reports what each copy's budget gave it.
        """
        c = self.config
        if c.host_cores is None:
            raise BenchError("--budget_check needs --host_cores (the budget to check)")
        if not counts or min(counts) < 1:
            raise BenchError(
                f"--budget_check={','.join(map(str, counts))}: need copy counts >= 1, e.g. 2,4,8"
            )
        self._check_fits(max(counts), f"--budget_check={max(counts)}")
        base = c.load_config(self._bindings())
        self._model = {"every_n": base.log_every_steps, "batch": base.batch_size}
        report = {
            "config": {
                "gin_files": list(c.gin_files),
                "gin_params": list(c.gin_params),
                "model": type(base.model).__name__,
                "batch_size": base.batch_size,
                "host_cores": c.host_cores,
                "budget_period_ms": budget_lib.PERIOD_US / 1000,
                "intra_op_threads": budget_lib.threads(c.host_cores),
                "inter_op_threads": base.inter_op_threads,
                "cpus": self._ncpus,
                "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            "checks": [],
        }
        # Alone before and after each K together: the machine's own speed drifts by more than 5% over
        # minutes (a VM's cores share the host's caches with its other tenants), so each K is compared
        # with the mean of the two runs alone around it.
        n = 0
        alone = self._copies_rates("alone_0", 1)
        for rep in range(c.repeats):
            for k in counts:
                n += 1
                self._wait_quiet()
                together = self._copies_rates(f"together{k}_{rep + 1}", k)
                after = self._copies_rates(f"alone_{n}", 1)
                check = budget_lib.fairness(k, [alone, after], together)
                self.log(f"{self._elapsed()} {k} copies: {budget_lib.describe(check)}")
                report["checks"].append(check)
                self.on_update(report)
                alone = after
        return report

    def _copies_rates(self, name: str, copies: int) -> dict:
        """Each copy's steps/s and what its budget gave it; {"error": ...} if the run failed."""
        try:
            m, names, got = self._run_copies(name, copies)
        except (RunFailed, budget_lib.BudgetError) as e:
            self.log(f"{self._elapsed()} {name} FAILED: {e}")
            return {"error": str(e)}
        return {"steps_per_sec": [m.steps_per_sec[n] for n in names], "host_budget": got}

    def _scaled_link(self, ref: dict, sizes: traffic.ModelBytes) -> float:
        """--link_ratio: the link rate that moves the model's bytes (float32, each way) in that many of
        the reference's steps; set once, for every run."""
        if not ref.get("steps_per_sec"):
            raise BenchError(
                "--link_ratio: one process alone trained nothing, so there is no step to scale the link to "
                f"({ref.get('error', 'no steps')})"
            )
        step, ratio = 1 / ref["steps_per_sec"], self.config.link_ratio
        self._link_mbit = bound_lib.link_mbit_for_ratio(sizes.total, step, ratio)
        self.log(
            f"{self._elapsed()} link: {self._link_mbit:.0f} Mbit/s each way: the model's "
            f"{sizes.total / 1e6:.1f} MB in {ratio:g} x one process's {1000 * step:.0f} ms step"
        )
        return self._link_mbit

    def _itemsize(self, spec: RunSpec) -> int:
        """Bytes per float32 value `spec`'s system sends: disttrain's per its transfer_dtype, the peers' 4."""
        if spec.system != "disttrain" and _strategy_of(spec.system) is None:  # a peer or TF's default
            return traffic.FLOAT32_BYTES
        if spec.kind.name not in self._itemsizes:
            config = self.config.load_config(self._bindings(spec.kind))
            self._itemsizes[spec.kind.name] = transfer_itemsize(config)
        return self._itemsizes[spec.kind.name]

    def _sent_bytes(self, spec: RunSpec) -> traffic.ModelBytes:
        """D and R as `spec`'s system sends them (the bound and exp MB/st count these)."""
        return self._model["bytes"].on_wire(self._itemsize(spec))

    def _tf2_specs(self) -> dict[str, dict]:
        """The TF 2 peers' specs, by system (bench.tf2): refuses a model they do not implement, up front."""
        peers = [tf2.PEERS[s] for s in self.config.systems if s in tf2.PEERS]
        if not peers:
            return {}
        pack = 0
        if any(not p.uses_ps for p in peers):
            pack = tf2.bucket_bytes(self.config.load_config(self._bindings(STRATEGIES["allreduce"])))
        config = self.config.load_config(self._bindings())  # its gin-bound optimizer is called now
        try:
            return {p.system: tf2.spec(p, config, pack) for p in peers}
        except tf2.PeerUnsupported as e:
            raise BenchError(str(e)) from None

    def _wait_quiet(self) -> None:
        c = self.config
        if c.quiet_cores is not None:
            wait_until_quiet(c.quiet_cores, c.quiet_timeout, self.log)

    def _reference(self, rep: int) -> dict:
        self._wait_quiet()
        try:
            return self._run_reference(rep)
        except (RunFailed, budget_lib.BudgetError) as e:
            self.log(f"{self._elapsed()} reference FAILED: {e}")
            return {"error": str(e)}

    def _drop_checkpoints(self, logdir: str) -> None:
        """A measured run's checkpoints, never read again, deleted (its logs and events stay)."""
        if not self.config.keep_checkpoints:
            local.drop_checkpoints(logdir)

    def _measure(self, spec: RunSpec, k: int, rep: int) -> dict:
        """One run of `spec`: the Measurement and host roles, or its error or why it was skipped."""
        c, n = self.config, len(self._specs_cache)
        where = f"[{k + 1}/{n}]" + (f" #{rep + 1}" if c.repeats > 1 else "")
        if spec.layout == traffic.COLOCATED and spec.ps > spec.workers:
            why = f"colocated PS needs ps <= workers ({spec.ps} > {spec.workers})"
            self.log(f"{self._elapsed()} {where} {spec.label}: skipped, {why}")
            return {"skipped": why}
        name = f"{k + 1:02d}_{spec.system.replace(':', '_')}_{spec.workers}w{spec.ps}ps" + (
            f"_{rep + 1}" if c.repeats > 1 else ""
        )
        logdir = self._fresh(os.path.join(c.logdir, name))
        self._wait_quiet()
        self.log(f"{self._elapsed()} {where} {spec.label}: logs {logdir}/logs")
        t = time.monotonic()
        try:
            m, roles, loads, got = self._run_cluster(
                spec, logdir, self._model["every_n"], self._model["batch"]
            )
        except (RunFailed, netem.NetemError, budget_lib.BudgetError) as e:
            self.log(f"{self._elapsed()} {where} FAILED: {e}")
            return {"error": str(e), "logdir": logdir}
        finally:
            self._drop_checkpoints(logdir)
        other = other_cores(m)
        rates = list(m.steps_per_sec.values())
        self.log(
            f"{self._elapsed()} {where} done in {time.monotonic() - t:.0f}s: "
            f"{m.cluster_examples_per_sec / self._model['batch']:.2f} steps/s, "
            f"slowest worker {min(rates):.2f}"
            + (f"; other processes kept {other:.1f} cores busy" if other is not None else "")
            + (f"; DIVERGED (loss {m.first_loss:.3g} -> {m.max_loss:.3g})" if m.diverged else "")
        )
        found = {"measurement": m, "roles": roles, "logdir": logdir, "other_busy_cores": other}
        if got:
            found["host_budget"] = got
        found.update(diagnosis(logdir))
        if "verdict" in found:
            self.log(f"{self._elapsed()} {where} verdict: {found['verdict']}")
        return found if loads is None else dict(found, ps_loads=loads)

    def _row(self, spec: RunSpec, loads, ref: float | None, measured: list[dict]) -> dict:
        """A run's row: layout, placement and bound, and the quietest of its measurements."""
        c = self.config
        sizes, batch = self._sent_bytes(spec), self._model["batch"]
        link_mbit = self._link_mbit if c.network == EMULATED else None
        best = _quietest(measured)
        loads = best.get("ps_loads", loads)  # a TF 2 peer reports where it put its variables
        row = {
            "system": spec.system,
            "strategy": spec.kind.name,
            "synchronous": spec.kind.synchronous,
            "network": c.network,
            "layout": spec.layout,
            "workers": spec.workers,
            "ps": spec.ps,
            "link_mbit": link_mbit,
            "batch_size": batch,
            "ps_loads": loads,
            "ps_load_max_over_mean": placement.max_over_mean(loads) if loads else None,
            "transfer_bytes_per_value": self._itemsize(spec),
            "error": None,
        }
        if "skipped" in best:
            row["skipped"] = best["skipped"]
            return row
        row.update(_expected_link_fields(spec, sizes))
        alongside = best["measurement"].alongside if "measurement" in best else None
        if alongside:  # with budgets: one host alone in the same window is the reference
            row["alongside_steps_per_sec"] = ref = alongside
        if ref:
            row.update(_bound_fields(spec, sizes, link_mbit, ref))
        row["logdir"] = best.get("logdir")
        if len(measured) > 1:
            row["repeats"] = [_brief(x, batch, spec) for x in measured]
        if "error" in best:
            row["error"] = best["error"]
            return row
        row["worker_peak_memory_mb"] = _peak_memory_mb(best["logdir"])
        row.update(
            {k: best[k] for k in ("verdict", "top_change", "predicted_gain", "host_budget") if k in best}
        )
        row.update(_measured_fields(spec, best, batch, ref, row.get("bound_steps_per_sec")))
        return row


def _without(m: measure_lib.Measurement, names: list[str]) -> measure_lib.Measurement:
    """`m` without the replicas `names` (the processes alone beside a cluster); their mean rate is
    `alongside`."""
    if not names:
        return m
    return dataclasses.replace(
        m,
        steps_per_sec={k: v for k, v in m.steps_per_sec.items() if k not in names},
        intervals={k: v for k, v in m.intervals.items() if k not in names},
        alongside=sum(m.steps_per_sec[n] for n in names) / len(names),
    )


def _expected_link_fields(spec: RunSpec, sizes: traffic.ModelBytes) -> dict:
    """The bytes per global step the busiest and the least busy link should carry (exp MB/st)."""
    per_round = bound_lib.global_steps_per_round(spec.workers, spec.kind.synchronous)
    loads_per_round = traffic.link_loads(
        spec.layout, sizes.dense, spec.workers, spec.ps, sizes.sparse, spec.kind.dense_over_ring
    )
    return {
        "expected_busiest_link_bytes_per_step": max(x.bytes_per_round for x in loads_per_round) / per_round,
        "expected_min_link_bytes_per_step": min(x.bytes_per_round for x in loads_per_round) / per_round,
    }


def _bound_fields(spec: RunSpec, sizes: traffic.ModelBytes, link_mbit: float | None, ref: float) -> dict:
    """The bound (bench.bound) for the reference's step time `1 / ref`, and the ideal N x `ref`."""
    link_rate = bound_lib.link_rate_bytes(link_mbit)
    ring = spec.kind.dense_over_ring
    b = bound_lib.bound(
        spec.layout, sizes.dense, spec.workers, spec.ps, link_rate, 1.0 / ref, sizes.sparse, ring
    )
    return {
        "bound_steps_per_sec": b.steps_per_sec,
        "bound_limited_by": b.limited_by,
        "bound_comm_time_per_round": b.comm_time,
        "ideal_steps_per_sec": spec.workers * ref,
    }


def diagnosis(logdir: str) -> dict:
    """disttrain-diagnose's reading of a run: its verdict, and its first change with the gain predicted.

    {} for a run it cannot read (TF 2's peers write no run.json).
    """
    try:
        run = diagnose.read_run(logdir)
    except diagnose.RunError:
        return {}
    found = diagnose.findings(run)
    top = {"top_change": found[0].change, "predicted_gain": found[0].gain} if found else {}
    return {"verdict": diagnose.verdict(run), **top}


def _peak_memory_mb(logdir: str) -> float | None:
    """The largest peak memory of the run's tasks (what a replica holds), None if none reported one."""
    peaks = [r.get("peak_memory_mb", 0.0) for r in launch.read_results(logdir).values()]
    return max(peaks) if peaks else None


def _counted(spec: RunSpec, m: measure_lib.Measurement, batch: int) -> float:
    """Sync: every replica steps together, the cluster's rate counts. Async: N x the slowest."""
    if spec.kind.synchronous:
        return m.cluster_examples_per_sec / batch
    return metrics.async_throughput(list(m.steps_per_sec.values()))


def _measured_fields(spec: RunSpec, best: dict, batch: int, ref: float | None, bound: float | None) -> dict:
    """The row's measured figures: rates, counted throughput against ideal and `bound`, links, CPU, loss."""
    m = best["measurement"]
    per_worker = list(m.steps_per_sec.values())
    steps = m.cluster_examples_per_sec / batch
    counted = _counted(spec, m, batch)
    return {
        "steps_per_sec": steps,
        "global_steps_per_sec": m.global_steps_per_sec,
        "examples_per_sec": m.cluster_examples_per_sec,
        "per_worker_steps_per_sec": per_worker,
        "per_worker_examples_per_sec": [r * batch for r in per_worker],
        "min_worker_steps_per_sec": min(per_worker),
        "counted_steps_per_sec": counted,
        "counted_examples_per_sec": counted * batch,
        "scaling_efficiency": metrics.scaling_efficiency(counted, spec.workers, ref) if ref else None,
        "efficiency_vs_bound": bound_lib.efficiency(counted, bound) if bound is not None else None,
        **_measured_link_fields(m.link_bytes_per_step(), best["roles"]),
        "cpu_seconds_per_step": m.cpu_seconds_per_step(),
        "other_busy_cores": best["other_busy_cores"],
        "window_seconds": m.window_seconds,
        "window_global_steps": m.window_global_steps,
        "measured_intervals": dict(m.intervals),
        "first_loss": m.first_loss,
        "max_loss": m.max_loss,
        "diverged": m.diverged,
    }


def _measured_link_fields(links: list[tuple[float, float]] | None, roles: list[str] | None) -> dict:
    """The busiest and least busy host's measured bytes per step, and each host's (None without counters)."""
    return {
        "busiest_link_bytes_per_step": max(max(x) for x in links) if links else None,
        "min_link_bytes_per_step": min(max(x) for x in links) if links else None,
        "link_bytes_per_step": (
            [
                {"host": h, "tasks": r, "sent": s, "received": rcv}
                for h, (r, (s, rcv)) in enumerate(zip(roles, links, strict=True))
            ]
            if links
            else None
        ),
    }


def _lookup_fields(sizes: traffic.ModelBytes) -> dict:
    """The report's D and R, when a step looks rows up (nothing for a model without tables)."""
    if not sizes.tables:
        return {}
    return {
        "dense_bytes": sizes.dense,
        "sparse_bytes_per_step": sizes.sparse,
        "table_bytes": sizes.table_bytes,
        "table_fraction_per_step": sizes.table_fraction_per_step,
        "tables": [
            {
                "name": t.name,
                "bytes": t.nbytes,
                "row_bytes": t.row_bytes,
                "rows_per_step": t.rows_per_step,
                "bytes_per_step": t.bytes_per_step,
            }
            for t in sizes.tables
        ],
    }


def _lookup_note(sizes: traffic.ModelBytes) -> str:
    """` (D ... dense, R ... of rows per step ...)` for the progress line; empty without tables."""
    if not sizes.tables:
        return ""
    return (
        f" (D {sizes.dense / 1e6:.1f} MB dense; R {sizes.sparse / 1e6:.2f} MB of rows per replica step, "
        f"{100 * sizes.table_fraction_per_step:.2f}% of {sizes.table_bytes / 1e6:.1f} MB of tables)"
    )


QUIET_CORES = 0.3  # a measurement during which others used less than this counts as quiet


def _quietest(candidates: list[dict]) -> dict:
    """The repetition to report: the median of the quiet, sane ones, else the quietest.

    Sane: did not fail and did not diverge. Quiet: other processes used less than
    QUIET_CORES. Repetitions differ even on a quiet machine, hence the median (the
    lower one of an even count) rather than the first or the best.
    """
    ok = [x for x in candidates if "error" not in x and "skipped" not in x]
    if not ok:
        return candidates[-1]

    def other(x: dict) -> float:
        return x["other_busy_cores"] if x.get("other_busy_cores") is not None else 1e9

    def diverged(x: dict) -> bool:
        return x.get("measurement") is not None and x["measurement"].diverged

    def rate(x: dict) -> float:
        m = x.get("measurement")
        return m.cluster_examples_per_sec if m is not None else x.get("steps_per_sec", 0.0)

    sane = [x for x in ok if not diverged(x)] or ok
    quiet = sorted((x for x in sane if other(x) < QUIET_CORES), key=rate)
    if quiet:
        return quiet[(len(quiet) - 1) // 2]
    return min(sane, key=other)


def _brief(x: dict, batch: int, spec: RunSpec) -> dict:
    """One repetition's headline figures, kept in the row next to the chosen one (with a process alone
    alongside, its scaling efficiency against that one)."""
    m = x.get("measurement")
    if m is None:
        return {"error": x.get("error"), "skipped": x.get("skipped")}
    brief = {
        "steps_per_sec": m.cluster_examples_per_sec / batch,
        "min_worker_steps_per_sec": min(m.steps_per_sec.values()),
        "other_busy_cores": x["other_busy_cores"],
        "diverged": m.diverged,
    }
    if m.alongside:
        counted = _counted(spec, m, batch)
        brief["alongside_steps_per_sec"] = m.alongside
        brief["scaling_efficiency"] = metrics.scaling_efficiency(counted, spec.workers, m.alongside)
    return brief
