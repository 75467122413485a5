"""TF 2's own strategies as benchmark systems: the peers' specs and their clusters.

    tf2_pss           ParameterServerStrategy with a ClusterCoordinator on a chief task, TF's
                      default placement (round robin by count), asynchronous updates
    tf2_pss_minsize   the same with MinSizePartitioner(256 KiB, max_shards=P), as a careful
                      TF user would set it: variables split along axis 0 over the PS
    tf2_mwms          MultiWorkerMirroredStrategy, CommunicationImplementation.RING,
                      bytes_per_pack = SyncAllReduce.bucket_bytes of the run's config

The peers are programs in peers/ run by file path in eager mode (nothing in
them imports disttrain, which would switch the process to graph mode). This
module, on the benchmark's side, turns the run's TrainConfig into the JSON
spec they read (the model's sizes and model_zoo's variables, batch, optimizer,
threads, log interval and the console format the benchmark parses back), and starts them as a cluster
of processes with TF_CONFIG, as disttrain.edges.local starts disttrain's. The peers
implement model_zoo's MLP and CIFAR-10 CNN on synthetic input with Adam or
SGD: another config is refused before anything starts.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys

import tensorflow as tf

from disttrain.base import logs
from disttrain.base.cluster import WORKER, Cluster
from disttrain.base.config import TrainConfig
from disttrain.base.errors import ConfigError
from disttrain.bench.watch import Proc
from disttrain.edges import local
from disttrain.runtime import metrics
from model_zoo import inputs
from model_zoo.cifar10 import Cifar10
from model_zoo.mlp import MLP

v1 = tf.compat.v1

PEERS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers")
MAX_STEPS_PER_FUNCTION = 10  # steps per scheduled tf.function, at most (a divisor of the log interval)
FUNCTIONS_AHEAD_PER_WORKER = 8  # PSS: scheduled and not yet fetched, so no worker waits for work
MIN_SHARD_BYTES = 256 << 10  # MinSizePartitioner's default


@dataclasses.dataclass(frozen=True)
class Peer:
    """A TF 2 system: its program and how it is set up."""

    system: str
    script: str  # under peers/
    uses_ps: bool  # PS tasks and a chief (the coordinator); else workers only
    partitioner: str | None = None  # tf2_pss: None (round robin) or "min_size"

    @property
    def path(self) -> str:
        return os.path.join(PEERS_DIR, self.script)


PEERS = {
    p.system: p
    for p in (
        Peer("tf2_pss", "tf2_pss.py", uses_ps=True),
        Peer("tf2_pss_minsize", "tf2_pss.py", uses_ps=True, partitioner="min_size"),
        Peer("tf2_mwms", "tf2_mwms.py", uses_ps=False),
    )
}


class PeerUnsupported(ConfigError):
    """The run's config is one the TF 2 peers do not implement."""


def steps_per_function(every_n: int) -> int:
    """The largest divisor of the log interval up to MAX_STEPS_PER_FUNCTION: each line is whole functions."""
    return max(k for k in range(1, min(every_n, MAX_STEPS_PER_FUNCTION) + 1) if every_n % k == 0)


def optimizer_spec(config: TrainConfig) -> dict:
    """The optimizer's settings, read from the TF 1 optimizer the config builds.

    Calls `config.optimizer()`: the gin bindings the config was loaded with must still be in force.
    """
    optimizer = config.optimizer()
    # TF 1 optimizers keep their settings in private attributes only.
    if isinstance(optimizer, v1.train.AdamOptimizer):
        spec = dict(name="adam", learning_rate=optimizer._lr, beta1=optimizer._beta1)
        spec.update(beta2=optimizer._beta2, epsilon=optimizer._epsilon)
    elif type(optimizer) is v1.train.GradientDescentOptimizer:
        spec = dict(name="sgd", learning_rate=optimizer._learning_rate)
    else:
        raise PeerUnsupported(
            f"the TF 2 peers implement Adam and SGD; the config's optimizer is {type(optimizer).__name__}: "
            "leave tf2_* out of --systems for it"
        )
    if not all(isinstance(v, (int, float)) for k, v in spec.items() if k != "name"):
        raise PeerUnsupported(f"the TF 2 peers need constant optimizer settings, got {spec}")
    return spec


# The model_zoo models the peers implement (peers/tf2_common.MODELS), by their name there.
PEER_MODELS = {MLP: "mlp", Cifar10: "cifar10"}


def model_spec(config: TrainConfig) -> dict:
    """The model's name and sizes as the peers build it; PeerUnsupported for any other model or input."""
    spec = zoo_model_spec(config.model)
    if inspect.unwrap(config.input_fn) is not inputs.synthetic:
        raise PeerUnsupported(
            f"the TF 2 peers implement synthetic input only; the config's input is {config.input_fn!r}"
        )
    return spec


def zoo_model_spec(model) -> dict:
    """A model_zoo model's name and sizes as the peers build it; PeerUnsupported for a model they lack."""
    name = PEER_MODELS.get(type(model))
    if name is None:
        known = " and ".join(cls.__name__ for cls in PEER_MODELS)
        raise PeerUnsupported(
            f"the TF 2 peers implement the model_zoo {known} only; the config's model is "
            f"{type(model).__name__}: leave tf2_* out of --systems for it"
        )
    spec = dict(name=name, input_shape=list(model.input_shape), num_classes=model.num_classes)
    if name == "mlp":
        spec.update(hidden_sizes=list(model.hidden_sizes))
    else:
        spec.update(width=model.width)
    return spec


def model_variables(config: TrainConfig) -> list[dict]:
    """model_zoo's trainable variables of the config's model: `zoo_variables`."""
    return zoo_variables(config.model)


def zoo_variables(model) -> list[dict]:
    """A model_zoo model's trainable variables, in creation order: name and shape.

    The peers build their own copy of the model and stop if its variables
    differ from these. PeerUnsupported if the model has non-trainable
    variables (batch norm's moving statistics), which the peers do not update.
    """
    with tf.Graph().as_default():
        model.build_variables()
        trainable = v1.trainable_variables()
        others = [v.op.name for v in v1.global_variables() if v.op.name not in {t.op.name for t in trainable}]
        if others:
            raise PeerUnsupported(
                f"the TF 2 peers update trainable variables only; {type(model).__name__} also has "
                f"{', '.join(others)}: leave tf2_* out of --systems for it"
            )
        return [{"name": v.op.name, "shape": v.shape.as_list()} for v in trainable]


def bucket_bytes(allreduce_config: TrainConfig) -> int:
    """SyncAllReduce.bucket_bytes as the config binds it (for MWMS's bytes_per_pack)."""
    return strategy_bucket_bytes(allreduce_config.strategy)


def strategy_bucket_bytes(make_strategy) -> int:
    """The bucket_bytes of the SyncAllReduce `make_strategy(cluster)` builds."""
    view = Cluster(jobs={WORKER: ["localhost:1", "localhost:2"]}, task_type=WORKER, task_index=0)
    return make_strategy(view).bucket_bytes


def spec(peer: Peer, config: TrainConfig, pack_bytes: int) -> dict:
    """Everything a peer needs but its cluster (TF_CONFIG) and its files (PeerCluster adds them)."""
    every_n = config.log_every_steps
    return {
        "system": peer.system,
        "model": model_spec(config),
        "variables": model_variables(config),
        "batch_size": config.batch_size,
        "seed": 0,  # model_zoo.inputs.synthetic's default
        "optimizer": optimizer_spec(config),
        "intra_op_threads": config.intra_op_threads,
        "inter_op_threads": config.inter_op_threads,
        "log_every_steps": every_n,
        "steps_per_function": steps_per_function(every_n),
        "functions_ahead_per_worker": FUNCTIONS_AHEAD_PER_WORKER,
        "variable_partitioner": peer.partitioner,
        "min_shard_bytes": MIN_SHARD_BYTES,
        "bytes_per_pack": pack_bytes,
        "peer_wait_secs": config.peer_wait_secs,
        "console": {
            "format": logs.FORMAT,
            "date_format": logs.DATE_FORMAT,
            "line": metrics.THROUGHPUT_LINE,
            "cluster_suffix": metrics.CLUSTER_SUFFIX,
        },
    }


class PeerCluster(local.LocalCluster):
    """A TF 2 peer's processes: TF_CONFIG per task, free ports, one log per task (as LocalCluster).

    tf2_pss: P PS tasks, N workers and a chief (the coordinator), which writes
    each worker's throughput lines to `logs/worker_<i>.lines`. tf2_mwms: N
    workers, each printing its own lines to its log.
    """

    def __init__(self, peer: Peer, peer_spec: dict, logdir: str, num_ps: int, num_workers: int, **kwargs):
        super().__init__(
            gin_files=(),
            logdir=logdir,
            num_ps=num_ps if peer.uses_ps else 0,
            num_workers=num_workers,
            chief=peer.uses_ps,
            **kwargs,
        )
        self.peer = peer
        self.lines_paths = (
            [os.path.join(logdir, "logs", f"{WORKER}_{i}.lines") for i in range(num_workers)]
            if peer.uses_ps
            else None
        )
        self.placement_path = os.path.join(logdir, "placement.json")
        self.spec_path = os.path.join(logdir, "peer_spec.json")
        self.spec = dict(peer_spec, lines_paths=self.lines_paths, placement_path=self.placement_path)

    def argv(self, task) -> list[str]:
        return [sys.executable, self.peer.path, f"--spec={self.spec_path}"]

    def start(self) -> PeerCluster:
        os.makedirs(os.path.join(self.logdir, "logs"), exist_ok=True)
        with open(self.spec_path, "w") as f:
            json.dump(self.spec, f, indent=1)
        for path in self.lines_paths or ():
            open(path, "w").close()  # followed from the start, written by the coordinator
        super().start()
        return self

    def watched(self) -> tuple[list[Proc], list[str], str]:
        """(every process, the replicas whose lines count, the replica whose lines carry the cluster's)."""
        procs = []
        for t in self.tasks:
            lines = self.lines_paths[t.index] if self.lines_paths and t.job == WORKER else None
            procs.append(Proc(t.name, t.proc, t.log_path, lines_path=lines))
        replicas = [t.name for t in self.tasks if t.job == WORKER]
        return procs, replicas, replicas[0]

    def ps_loads(self) -> list[int] | None:
        """Bytes of model variables per PS, as the coordinator placed them (None: no PS or not yet)."""
        if not self.peer.uses_ps:
            return None
        try:
            with open(self.placement_path) as f:
                return json.load(f)["ps_bytes"]
        except (OSError, ValueError, KeyError):
            return None
