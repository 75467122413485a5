"""The edge between command-line scripts and the library.

bin/ scripts parse flags and call these: gin files become a TrainConfig,
flags and TF_CONFIG become a Cluster, and any DisttrainError (or a TF error
that means a lost peer) becomes one line on stderr and its exit code. The
library below never reads flags or gin.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys

import gin

from disttrain import launch
from disttrain.base import cluster as cluster_lib
from disttrain.base import logs
from disttrain.base.config import TrainConfig
from disttrain.base.errors import EXIT_TRANSIENT, DisttrainError
from disttrain.edges import configurables, zoo_run
from disttrain.launch import errors_to_exit, fail
from disttrain.runtime import breakdown, metrics

OPERATIVE_CONFIG = "operative_config.gin"


def cluster(job, task, ps_hosts, worker_hosts, chief_host) -> cluster_lib.Cluster:
    with errors_to_exit():
        return cluster_lib.resolve(job, task, ps_hosts, worker_hosts, chief_host)


def _gin_error(e: Exception) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    where = next((line for line in lines[1:] if line.startswith("In ")), "")
    return f"{lines[0] if lines else type(e).__name__} {where}".strip()


def shipped_gin_dir() -> str:
    """The directory of the .gin files that ship with disttrain.

    An installed package carries them as `disttrain/gin/`; a checkout has
    them at the top level, `gin/`.
    """
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # disttrain/, above edges/
    installed = os.path.join(package, "gin")
    return installed if os.path.isdir(installed) else os.path.join(os.path.dirname(package), "gin")


_SEARCHED: list[str] = []


def _gin_search_path() -> list[str]:
    """Where gin files are looked for, after the current directory.

    The shipped directory itself (`mlp_async.gin`) and its parent, because
    includes and older commands spell shipped files `gin/models/mlp.gin`.
    """
    shipped = shipped_gin_dir()
    return [shipped, os.path.dirname(shipped)]


def fresh_train_config(gin_files, gin_params) -> TrainConfig:
    """`train_config` after clearing what gin parsed before: one config after another, in one process."""
    gin.clear_config()
    return train_config(list(gin_files), list(gin_params))


def train_config(gin_files, gin_params) -> TrainConfig:
    """Parse gin files and bindings (unknown names are errors) into a TrainConfig."""
    configurables.register_all()
    search = _gin_search_path()
    for directory in search:
        if directory not in _SEARCHED:  # gin would append a duplicate on every call
            _SEARCHED.append(directory)
            gin.add_config_file_search_path(directory)
    if not gin_files:
        fail("no --gin_file given: pass one, e.g. --gin_file=mlp_async.gin")
    for path in gin_files:
        if not any(os.path.isfile(os.path.join(d, path)) for d in ["", *search]):
            fail(
                f"gin file {path!r} not found: looked in the current directory and in "
                f"{search[0]} (the shipped configs)"
            )
    try:
        # gin logs every place it looked for a file in vain at ERROR; a miss on the search path is normal.
        logging.disable(logging.ERROR)
        try:
            gin.parse_config_files_and_bindings(gin_files, gin_params, skip_unknown=False)
        finally:
            logging.disable(logging.NOTSET)
        config = configurables.train_config().validate()
        unset = _unset_argument()
    except DisttrainError as e:
        fail(str(e), e.exit_code)
    except Exception as e:  # noqa: BLE001  anything gin or a constructor raises is a config error
        fail(f"bad gin config: {_gin_error(e)}")
    if unset:
        fail(unset)
    return config


# The TrainConfig fields the launcher calls, and how many positional arguments it passes them
# (the cluster; model, batch size, replica index, replicas); gin must bind every other required one.
_CALLED_WITH = {"optimizer": 0, "strategy": 1, "input_fn": 4, "eval_input_fn": 4}


def _unset_argument() -> str | None:
    """The line naming a required argument that neither gin nor the launcher gives a bound callable.

    `TrainConfig.optimizer = @SGD` without `SGD.learning_rate` would fail only
    once the graph is built, in a traceback that names gin's internals.
    """
    bound = gin.get_bindings("TrainConfig", resolve_references=False)
    for field, passed in _CALLED_WITH.items():
        ref = bound.get(field)
        if not isinstance(ref, gin.config.ConfigurableReference) or ref.evaluate:
            continue
        parameters = list(inspect.signature(ref.configurable.wrapped).parameters.values())
        required = [
            p.name
            for p in parameters[passed:]
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        given = gin.get_bindings(ref.scoped_selector)
        for name in required:
            if name not in given:
                what = f"{ref.configurable.name}.{name}"
                return (
                    f"gin: {what} is not set, and TrainConfig.{field} = @{ref.scoped_selector} needs it: "
                    f"bind it (--gin_param={what}=...)"
                )
    return None


def dry_run(cluster: cluster_lib.Cluster, config: TrainConfig) -> int:
    with errors_to_exit():
        print(zoo_run.dry_run(cluster, config))
    print("operative gin config:")
    print(gin.operative_config_str())
    return 0


def run(cluster: cluster_lib.Cluster, config: TrainConfig, logdir: str) -> int:
    def write_operative_config():
        path = os.path.join(logdir, OPERATIVE_CONFIG)
        text = gin.operative_config_str()
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        metrics.write_texts(logdir, {"run/gin_config": text})

    logs.to_console()
    with errors_to_exit(cluster):
        return zoo_run.run(cluster, config, logdir, on_built=write_operative_config)


def launch_local(
    gin_files,
    gin_params,
    num_ps,
    num_workers,
    chief,
    evaluator,
    logdir,
    timeout,
    max_restarts=0,
    private_network=True,
) -> int:
    """bin/launch_local.py: run a local cluster, echo the chief, summarise, exit like the worst task.

    With `private_network`, the tasks run in a network namespace of their
    own (root only; otherwise it says what is exposed, and goes on).
    """
    from disttrain.edges import local
    from disttrain.edges.private_network import PrivateNetwork

    if not gin_files:
        fail("no --gin_file given: pass one, e.g. --gin_file=mlp_async.gin")
    if num_workers < (0 if chief else 1) or num_ps < 0:
        fail(
            f"need at least one replica and no negative counts: --num_ps={num_ps} --num_workers={num_workers}"
        )
    network = PrivateNetwork()
    if private_network and network.open():
        print("tasks in a network namespace of their own (loopback only): nothing else reaches them")
    else:
        why = f" (no private network: {network.why_not})" if private_network else ""
        print(
            f"tasks on this machine's network{why}: TensorFlow's servers listen on every interface and "
            "run whatever they are sent, so anyone who reaches this machine reaches them; firewall "
            "their ports, or run as root for a private network",
            flush=True,
        )
    try:
        return _run_local(
            local.LocalCluster(
                gin_files,
                logdir,
                num_ps,
                num_workers,
                chief,
                evaluator,
                gin_params,
                max_restarts=max_restarts,
                on_event=lambda message: print(message, flush=True),
                popen=network.popen if network.holder else None,
            ),
            logdir,
            timeout,
        )
    finally:
        network.close()


def _run_local(cluster, logdir: str, timeout) -> int:
    from disttrain.edges import local

    follower = local.LogFollower(cluster.chief_task.log_path)

    def echo():
        for line in follower.new_lines():
            if line.strip():
                print(line, flush=True)

    print(f"starting {len(cluster.tasks)} tasks; logs in {logdir}/logs", flush=True)
    for task in cluster.tasks:
        print(f"  {task.name:22s} {task.address or '-':22s} {task.log_path}", flush=True)
    cluster.start()
    try:
        codes = cluster.wait(timeout=timeout, on_tick=echo)
    except TimeoutError as e:
        fail(str(e), EXIT_TRANSIENT)
    except KeyboardInterrupt:
        cluster.stop()
        fail(f"interrupted: every task stopped; logs in {logdir}/logs", 130)
    if cluster.failed:
        task = cluster.failed[0]
        print(cluster.log_tail(task), file=sys.stderr, end="")
        fail(
            f"{task.name} failed with exit code {task.proc.returncode}; every task stopped; "
            f"log: {task.log_path}",
            task.proc.returncode if 0 < task.proc.returncode < 256 else 1,
        )
    print(summary(launch.read_results(logdir), codes, logdir), flush=True)
    return 0


def summary(results: dict[str, dict], codes: dict[str, int], logdir: str) -> str:
    """The closing table of a local run."""
    lines = ["", "summary:", f"  {'task':14s} {'steps':>7s} {'examples/sec':>13s} {'final loss':>11s}"]
    total = 0.0
    for name, r in results.items():
        total += r["examples_per_sec"]
        lines.append(
            f"  {name:14s} {r['local_steps']:7d} {r['examples_per_sec']:13.1f} {r['final_loss']:11.4f}"
        )
    chief = [r for r in results.values() if r.get("chief")]
    if results and not any(r["local_steps"] for r in results.values()):
        step = max(r["global_step"] for r in results.values())
        lines.append(f"  nothing trained: the global step was already {step} (a finished run in {logdir})")
    elif chief:
        lines.append(
            f"  global step {chief[0]['global_step']}, cluster examples/sec "
            f"{chief[0]['cluster_examples_per_sec']:.1f} (from the global step)"
        )
    lines.append(f"  sum over tasks: {total:.1f} examples/sec")
    traced = {name: r["breakdown"] for name, r in results.items() if r.get("breakdown")}
    if traced:
        lines.append("  where the step went:")
        lines += [f"    {name:12s} {breakdown.Breakdown.of(b).summary()}" for name, b in traced.items()]
    lines.append("  exit codes: " + ", ".join(f"{n} {c}" for n, c in codes.items()))
    lines.append(f"  logs: {logdir}/logs   TensorBoard: tensorboard --logdir={logdir}")
    return "\n".join(lines)
