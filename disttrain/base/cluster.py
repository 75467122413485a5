"""The whole cluster from one task's point of view.

A `Cluster` is an immutable value: the addresses of every job and which task
this process is. It is built from TF_CONFIG (as Kubeflow TFJob, Vertex AI and
SageMaker write it), from host lists, or for a single process with no cluster.
It validates its input and says exactly what is wrong; it starts nothing
(see `disttrain.launch` for servers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from collections.abc import Mapping, Sequence

from disttrain.base.errors import ConfigError

PS, WORKER, CHIEF, EVALUATOR, LOCAL = "ps", "worker", "chief", "evaluator", "local"
TASK_TYPES = (PS, WORKER, CHIEF, EVALUATOR)
# Names some platforms use for the chief (older TFJob, SageMaker, Vertex AI).
_CHIEF_ALIASES = {"master": CHIEF}


def _parse_address(job: str, index: int, address: object) -> str:
    if not isinstance(address, str) or ":" not in address:
        raise ConfigError(f"bad address {address!r} for /job:{job}/task:{index}: expected 'host:port'")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"bad address {address!r} for /job:{job}/task:{index}: expected 'host:port'")
    return address


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Jobs -> task addresses, and this task's role.

    `jobs` maps job names (`ps`, `worker`, `chief`) to their addresses in task
    order. `task_type` is one of `ps`, `worker`, `chief`, `evaluator`, or
    `local` for a single process training alone (no servers at all).
    """

    jobs: Mapping[str, tuple[str, ...]]
    task_type: str
    task_index: int = 0

    def __post_init__(self):
        jobs = {}
        for job, addresses in dict(self.jobs).items():
            if job not in (PS, WORKER, CHIEF):
                raise ConfigError(f"unknown job {job!r} in cluster: expected some of ps, worker, chief")
            if isinstance(addresses, str):
                addresses = [addresses]
            jobs[job] = tuple(_parse_address(job, i, a) for i, a in enumerate(addresses))
        object.__setattr__(self, "jobs", types.MappingProxyType(jobs))
        if self.task_type == LOCAL:
            if jobs:
                raise ConfigError("a local (single-process) task takes no cluster addresses")
            return
        if self.task_type not in TASK_TYPES:
            raise ConfigError(f"unknown job {self.task_type!r}: expected one of {', '.join(TASK_TYPES)}")
        if not isinstance(self.task_index, int) or self.task_index < 0:
            raise ConfigError(f"bad task index {self.task_index!r}: expected an integer >= 0")
        if CHIEF in jobs and len(jobs[CHIEF]) != 1:
            raise ConfigError(f"job 'chief' must have exactly 1 task, got {len(jobs[CHIEF])}")
        if not jobs.get(WORKER) and not jobs.get(CHIEF):
            raise ConfigError("cluster has no 'worker' or 'chief' task: nothing would train")
        if self.task_type != EVALUATOR:
            count = len(jobs.get(self.task_type, ()))
            if self.task_index >= count:
                raise ConfigError(
                    f"task index {self.task_index} out of range: job {self.task_type!r} has {count} tasks"
                )

    # ---- constructors -------------------------------------------------

    @classmethod
    def local(cls) -> Cluster:
        """One process training alone: no servers, no network."""
        return cls(jobs={}, task_type=LOCAL, task_index=0)

    @classmethod
    def from_tf_config(cls, tf_config: str | Mapping) -> Cluster:
        """From TF_CONFIG text or its parsed dict, as real platforms write it.

        Accepts an `environment` key (TFJob), `master` as the chief's name,
        extra keys such as `job`/`trial` (Vertex AI), and an `evaluator` entry
        in `cluster` or none: Kubeflow's TFJob lists every replica type, the
        evaluator too, where TF's own convention leaves it out. Either way the
        evaluator is no job of the cluster (it serves nothing; nobody connects
        to it), and an evaluator task has no address.
        """
        tf_config = _parse_tf_config(tf_config)
        spec = tf_config.get("cluster")
        task = tf_config.get("task")
        if not isinstance(spec, Mapping) or not isinstance(task, Mapping):
            raise ConfigError("malformed TF_CONFIG: expected keys 'cluster' (object) and 'task' (object)")
        jobs = {}
        for job, addresses in spec.items():
            job = _CHIEF_ALIASES.get(job, job)
            if job == EVALUATOR:  # evaluators serve nothing; nobody connects to them
                continue
            if not isinstance(addresses, Sequence) or isinstance(addresses, str):
                raise ConfigError(f"malformed TF_CONFIG: cluster.{job} must be a list of 'host:port'")
            jobs[job] = tuple(addresses)
        task_type = task.get("type")
        task_type = _CHIEF_ALIASES.get(task_type, task_type)
        index = task.get("index", 0)
        if isinstance(index, str) and index.isdigit():
            index = int(index)
        if not isinstance(task_type, str):
            raise ConfigError(
                "malformed TF_CONFIG: task.type missing (expected ps, worker, chief or evaluator)"
            )
        return cls(jobs=jobs, task_type=task_type, task_index=index)

    @classmethod
    def from_hosts(
        cls,
        job: str,
        task: int,
        ps_hosts: Sequence[str] = (),
        worker_hosts: Sequence[str] = (),
        chief_host: str | None = None,
    ) -> Cluster:
        """From explicit host lists (the --ps_hosts/--worker_hosts/--chief_host flags)."""
        jobs = {}
        if ps_hosts:
            jobs[PS] = tuple(ps_hosts)
        if worker_hosts:
            jobs[WORKER] = tuple(worker_hosts)
        if chief_host:
            jobs[CHIEF] = (chief_host,)
        return cls(jobs=jobs, task_type=_CHIEF_ALIASES.get(job, job), task_index=task)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Cluster:
        """From TF_CONFIG if it is set and names a cluster, else local."""
        environ = os.environ if environ is None else environ
        text = environ.get("TF_CONFIG", "").strip()
        if not text:
            return cls.local()
        return cls.from_tf_config(text)

    # ---- views ----------------------------------------------------------

    @property
    def is_local(self) -> bool:
        return self.task_type == LOCAL

    @property
    def num_ps(self) -> int:
        return len(self.jobs.get(PS, ()))

    @property
    def replica_jobs(self) -> tuple[tuple[str, int], ...]:
        """(job, index) of every training replica: the chief first, then workers."""
        if self.is_local:
            return ((LOCAL, 0),)
        chief = [(CHIEF, 0)] if CHIEF in self.jobs else []
        return tuple(chief + [(WORKER, i) for i in range(len(self.jobs.get(WORKER, ())))])

    @property
    def num_replicas(self) -> int:
        """How many tasks compute gradients (chief and workers)."""
        return len(self.replica_jobs)

    @property
    def is_replica(self) -> bool:
        return self.task_type in (CHIEF, WORKER, LOCAL)

    @property
    def replica_index(self) -> int:
        """This task's position among the replicas (the chief is 0)."""
        return self.replica_jobs.index((self.task_type, self.task_index))

    @property
    def is_chief(self) -> bool:
        """The chief initialises, checkpoints and writes cluster summaries.

        That is the `chief` task if there is one, else worker 0.
        """
        if self.is_local:
            return True
        if CHIEF in self.jobs:
            return self.task_type == CHIEF
        return self.task_type == WORKER and self.task_index == 0

    @property
    def task_name(self) -> str:
        """`/job:worker/task:3`: how errors and logs name this task."""
        if self.is_local:
            return "/job:localhost/replica:0/task:0"
        return task_name(self.task_type, self.task_index)

    @property
    def address(self) -> str | None:
        if self.is_local or self.task_type == EVALUATOR:
            return None
        return self.jobs[self.task_type][self.task_index]

    @property
    def ps_devices(self) -> tuple[str, ...]:
        return tuple(f"/job:ps/task:{i}" for i in range(self.num_ps))

    @property
    def task_device(self) -> str:
        """Device prefix for ops that run on this task ('' when local)."""
        if self.is_local:
            return ""
        return self.task_name

    def as_dict(self) -> dict:
        """The cluster spec as TF's ClusterSpec takes it."""
        return {job: list(addresses) for job, addresses in self.jobs.items()}

    def describe(self) -> str:
        """Multi-line text for --dry_run and logs."""
        lines = [f"task: {self.task_name}" + (" (chief)" if self.is_chief else "")]
        for job in (CHIEF, WORKER, PS):
            for i, address in enumerate(self.jobs.get(job, ())):
                mark = "  <- this task" if (job, i) == (self.task_type, self.task_index) else ""
                lines.append(f"  /job:{job}/task:{i}  {address}{mark}")
        return "\n".join(lines)


def task_name(job: str, index: int) -> str:
    return f"/job:{job}/task:{index}"


def resolve(
    job: str | None = None,
    task: int | None = None,
    ps_hosts: Sequence[str] = (),
    worker_hosts: Sequence[str] = (),
    chief_host: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Cluster:
    """The cluster as a launcher sees it: host lists, else TF_CONFIG, else local.

    `job`/`task` name this task; with TF_CONFIG they override its `task`
    entry (one TF_CONFIG can then serve a whole cluster's command lines).
    """
    environ = os.environ if environ is None else environ
    if ps_hosts or worker_hosts or chief_host:
        if job is None:
            raise ConfigError("--job is required with --ps_hosts/--worker_hosts/--chief_host")
        return Cluster.from_hosts(job, task or 0, ps_hosts, worker_hosts, chief_host)
    text = environ.get("TF_CONFIG", "").strip()
    if text:
        return Cluster.from_tf_config(_with_task(text, job, task))
    if job not in (None, LOCAL):
        raise ConfigError(
            f"--job={job} but no cluster is given: set TF_CONFIG or --ps_hosts/--worker_hosts/--chief_host"
        )
    return Cluster.local()


def _parse_tf_config(tf_config: str | Mapping) -> Mapping:
    if isinstance(tf_config, str):
        try:
            tf_config = json.loads(tf_config)
        except json.JSONDecodeError as e:
            raise ConfigError(f"malformed TF_CONFIG: not JSON ({e.msg} at char {e.pos})") from None
    if not isinstance(tf_config, Mapping):
        raise ConfigError("malformed TF_CONFIG: expected a JSON object with 'cluster' and 'task'")
    return tf_config


def _with_task(text: str, job: str | None, task: int | None) -> Mapping:
    """TF_CONFIG with its `task` replaced by the --job/--task flags where given."""
    tf_config = _parse_tf_config(text)
    if job is not None or task is not None:
        own = dict(tf_config.get("task") or {})
        if job is not None:
            own["type"] = job
        if task is not None:
            own["index"] = task
        tf_config = {**tf_config, "task": own}
    return tf_config
