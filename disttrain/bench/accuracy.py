"""Time to accuracy: one model trained to a held-out target in one process and under each strategy.

Every system trains the same model on the same training examples (the same
budget of examples for all) from a real local cluster of `disttrain.fit`
processes, or of TF 2's own strategies' programs (the peers, tf2_pss and
tf2_mwms: disttrain/bench/peers/, given the task's data and a JSON spec),
and the chief measures held-out accuracy every `eval_every_steps`
global steps, on the whole held-out set, with the live variables. Time runs
from the end of the chief's first step (start-up, from spawning the
processes through that step and its one-off graph optimisation, is reported
apart) and excludes the chief's evaluations. Every task computes on one
thread, as in the benchmark. The initial weights are seeded. A row
gives the seconds and examples to the first evaluation at or above the
target, and the last evaluation's accuracy.

Tasks ship their data, no download at run time:
- digits: the UCI digits as scikit-learn's `load_digits` gives them (1,797 8x8 images, 10 classes), a
  held-out split fixed by seed, the zoo's MLP;
- teacher: CIFAR-shaped images (24x24x3, the zoo's CIFAR-10 CNN crop):
  seeded 8x8 blocks of colour plus pixel noise, labelled by a fixed teacher
  (a random linear layer on the block colours), so the zoo's CIFAR-10 CNN
  has something learnable at its real shapes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

import disttrain
from disttrain.bench import tf2
from disttrain.bench.peers import tf2_heldout
from disttrain.edges.local import drop_checkpoints, free_port, task_env
from disttrain.graph import run_steps, schedules
from disttrain.strategies import TFDefault

v1 = tf.compat.v1

HELD_OUT_FILE = "heldout.jsonl"
CLOCK_FILE = "clock_started"  # written by the chief when its first step has ended
MOMENTUM = 0.9
# As the benchmark (gin/bench/common.gin): one compute thread per task, so that one
# process uses one core, as each worker does.
COMPUTE_THREADS = 1
PEER_WAIT_SECS = 120  # a TF 2 PSS chief waits this long for its PS and workers to listen


# ---- tasks: data that ships in a package, and the zoo model that learns it ----------------------


@dataclasses.dataclass(frozen=True)
class Task:
    """A dataset with a fixed held-out split and the zoo model trained on it."""

    name: str
    data: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]  # train x, y, held-out x, y
    model: Callable[[], object]  # a model_zoo Model: model(features, training) -> logits
    learning_rate: float  # at momentum MOMENTUM
    batch_size: int  # per replica
    target: float  # held-out accuracy
    examples: int  # training examples per run, the same for every system
    eval_every_steps: int
    scale_learning_rate: bool = True  # linearly with the global batch, for sync systems
    warmup_examples: int = 0  # a scaled rate ramps up linearly over these (Goyal et al. 2017)
    # After warmup, the rate decays along a cosine to 0 at the run's last step (schedules.Cosine), so
    # that the end is where a run has settled, not a point of a swing: at a constant rate teacher's
    # held-out accuracy moved by 3-6 points between evaluations 12 steps apart.
    decays: bool = False


# The UCI "Optical Recognition of Handwritten Digits" test set (E. Alpaydin, C. Kaynak; CC BY 4.0),
# as scikit-learn ships it (sklearn/datasets/data/digits.csv.gz, byte for byte): 1,797 rows of 64
# pixel counts (0-16) and the label. Shipped here so that the accuracy tool needs no scikit-learn:
# with it installed, Keras imports it inside `import tensorflow`, in every process of every task.
DIGITS_FILE = os.path.join(os.path.dirname(__file__), "data", "digits.csv.gz")


def digits_data(seed: int = 0, held_out: int = 397):
    """The digits (pixels scaled to [0, 1]); `held_out` images, chosen by `seed`, kept apart.

    The same arrays as scikit-learn's `load_digits()` gives (its data and target).
    """
    table = np.loadtxt(DIGITS_FILE, delimiter=",")  # gzip by the name, as scikit-learn reads it
    pixels, labels = table[:, :-1], table[:, -1].astype(np.int32)
    order = np.random.RandomState(seed).permutation(len(labels))
    x, y = (pixels / 16.0).astype(np.float32)[order], labels[order]
    return x[held_out:], y[held_out:], x[:held_out], y[:held_out]


def teacher_data(seed: int = 0, train: int = 8000, held_out: int = 1000, image_size: int = 24):
    """CIFAR-shaped images labelled by a fixed teacher: a random linear layer on their 8x8 block means.

    Each image is a grid of 8x8 blocks of one random colour each, plus pixel
    noise of the same scale; the label is the argmax of a fixed random
    linear map of the block colours.
    """
    rng = np.random.RandomState(seed)
    blocks = image_size // 8
    colours = rng.randn(train + held_out, blocks, 1, blocks, 1, 3)
    x = np.broadcast_to(colours, (len(colours), blocks, 8, blocks, 8, 3)).reshape(
        -1, image_size, image_size, 3
    )
    x = (x + rng.randn(*x.shape)).astype(np.float32)
    teacher = rng.randn(blocks * blocks * 3, 10)
    y = np.argmax(colours.reshape(len(colours), -1) @ teacher, axis=1).astype(np.int32)
    return x[:train], y[:train], x[train:], y[train:]


def _mlp():
    from model_zoo.mlp import MLP

    return MLP(64, (128,), 10)


def _cifar10(width: int = 16):
    from model_zoo.cifar10 import Cifar10

    return Cifar10(image_size=24, num_classes=10, width=width)


TASKS = {
    "digits": Task("digits", digits_data, _mlp, 0.02, 32, target=0.95, examples=20000, eval_every_steps=25),
    # The CIFAR-10 CNN collapsed to one class at 0.008 (2 sync workers' scaled rate) and at 0.01
    # without warmup.
    "teacher": Task(
        "teacher",
        teacher_data,
        _cifar10,
        0.004,
        32,
        target=0.6,
        examples=40000,
        eval_every_steps=50,
        warmup_examples=6400,
        decays=True,
    ),
}


# ---- systems: how many processes, which strategy --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class System:
    """One way of training: the strategy fit builds, or a TF 2 peer program; whether it has a PS.

    Neither strategy nor peer: one process alone.
    """

    strategy: Callable | None
    uses_ps: bool = False
    synchronous: bool = False
    backup_workers: int = 0
    # Staleness handled: the momentum (and past zero, the rate) lowered for the implicit
    # momentum asynchrony adds (disttrain.graph.schedules.async_momentum).
    compensated: bool = False
    overlap: bool = False
    peer: str | None = None  # a TF 2 strategy's program (bench.tf2.PEERS), run instead of disttrain.fit

    @property
    def one_process(self) -> bool:
        return self.strategy is None and self.peer is None


SYSTEMS = {
    "one_process": System(None),
    "async": System(disttrain.AsyncParameterServer, uses_ps=True),
    "async_overlap": System(
        functools.partial(disttrain.AsyncParameterServer, overlap=True), uses_ps=True, overlap=True
    ),
    "async_compensated": System(disttrain.AsyncParameterServer, uses_ps=True, compensated=True),
    "async_overlap_compensated": System(
        functools.partial(disttrain.AsyncParameterServer, overlap=True),
        uses_ps=True,
        overlap=True,
        compensated=True,
    ),
    "async_bf16": System(
        functools.partial(disttrain.AsyncParameterServer, transfer_dtype="bfloat16"), uses_ps=True
    ),
    "async_compensated_bf16": System(
        functools.partial(disttrain.AsyncParameterServer, transfer_dtype="bfloat16"),
        uses_ps=True,
        compensated=True,
    ),
    "async_overlap_bf16": System(
        functools.partial(disttrain.AsyncParameterServer, overlap=True, transfer_dtype="bfloat16"),
        uses_ps=True,
        overlap=True,
    ),
    "sync_ps": System(disttrain.SyncParameterServer, uses_ps=True, synchronous=True),
    "sync_ps_bf16": System(
        functools.partial(disttrain.SyncParameterServer, transfer_dtype="bfloat16"),
        uses_ps=True,
        synchronous=True,
    ),
    "sync_ps_backup": System(
        functools.partial(disttrain.SyncParameterServer, backup_workers=1),
        uses_ps=True,
        synchronous=True,
        backup_workers=1,
    ),
    "allreduce": System(disttrain.SyncAllReduce, synchronous=True),
    "allreduce_bf16": System(
        functools.partial(disttrain.SyncAllReduce, transfer_dtype="bfloat16"), synchronous=True
    ),
    "tf_default": System(TFDefault, uses_ps=True),  # TF 1's default layout
    # TF 2's strategies: PSS is async (as `async`), MWMS all-reduces (as `allreduce`).
    "tf2_pss": System(None, uses_ps=True, peer="tf2_pss"),
    "tf2_mwms": System(None, synchronous=True, peer="tf2_mwms"),
}


def examples_per_step(system: System, workers: int, batch_size: int, accumulate: int = 1) -> int:
    """Training examples behind one increment of the global step (`accumulate` micro-batches each)."""
    if system.one_process or not system.synchronous:
        return batch_size * accumulate
    return (workers - system.backup_workers) * batch_size * accumulate


def staleness(system: System, workers: int) -> int:
    """Updates, on average, between the read of the parameters a gradient comes from and its update.

    Async: the other workers' updates, and this worker's own previous one under
    overlap (its gradient is computed while the last one is in flight). Sync: 1.
    """
    if system.one_process or system.synchronous:
        return 1
    return schedules.async_staleness(workers, system.overlap)


def learning_rate(task: Task, system: System, workers: int, accumulate: int = 1) -> float:
    """The task's rate, scaled linearly with the global batch (sync systems, and accumulated
    micro-batches in any; Goyal et al. 2017).

    A compensated async system takes `schedules.async_momentum`'s rate (the
    task's, unless the staleness is more than the momentum can absorb).
    """
    rate, _ = rate_and_momentum(task, system, workers, accumulate)
    return rate


def rate_and_momentum(task: Task, system: System, workers: int, accumulate: int = 1) -> tuple[float, float]:
    """The peak rate and the momentum `system` trains `task` with on `workers` workers."""
    rate, momentum = task.learning_rate, MOMENTUM
    if system.compensated:
        rate, momentum = schedules.async_momentum(rate, momentum, staleness(system, workers))
    if task.scale_learning_rate:
        rate *= examples_per_step(system, workers, task.batch_size, accumulate) / task.batch_size
    return rate, momentum


def warmup_steps(task: Task, system: System, workers: int, accumulate: int = 1) -> int:
    """Global steps of linear warmup: only where the rate was scaled up, over the task's examples."""
    per_step = examples_per_step(system, workers, task.batch_size, accumulate)
    if not task.scale_learning_rate or per_step == task.batch_size:
        return 0
    return task.warmup_examples // per_step


# ---- in each task process -----------------------------------------------------------------------


def train_process(
    task: str,
    system: str,
    workers: int,
    examples: int,
    eval_every_steps: int,
    logdir: str,
    steps_per_run: int = 1,
    accumulate_steps: int = 1,
    seed: int = 0,
    batch_scale: int = 1,
):
    """One task's life under `disttrain.fit` (any role; TF_CONFIG says which), with held-out evaluation.

    `seed` is the graph seed: the initial weights and the input shuffles
    (never the task's held-out split). `batch_scale` multiplies the task's
    per-replica batch; the rate, warmup and step count follow the examples
    per update, as for accumulated micro-batches.
    """
    spec, how = TASKS[task], SYSTEMS[system]
    train_x, train_y, held_x, held_y = spec.data()
    model = spec.model()
    batch = spec.batch_size * batch_scale
    per_update = accumulate_steps * batch_scale  # task batches per replica per update
    started = os.path.join(logdir, CLOCK_FILE)
    loss_fn = _loss_fn(model, train_x, train_y, batch, seed, started, steps_per_run * accumulate_steps)
    per_step = examples_per_step(how, workers, spec.batch_size, per_update)
    steps = max(1, examples // per_step)
    rate, momentum = _scheduled_rate(spec, how, workers, per_update, steps)
    hook = HeldOutHook(model, held_x, held_y, eval_every_steps, per_step, os.path.join(logdir, HELD_OUT_FILE))
    disttrain.fit(
        loss_fn,
        lambda: v1.train.MomentumOptimizer(rate, momentum),
        steps=steps,
        logdir=logdir,
        strategy=how.strategy,
        batch_size=batch,
        hooks=[hook],
        log_every_steps=100,
        save_checkpoint_steps=10**9,
        intra_op_threads=COMPUTE_THREADS,
        inter_op_threads=COMPUTE_THREADS,
        check_numerics=False,  # no NaN guard in the measured steps
        steps_per_run=steps_per_run,
        accumulate_steps=accumulate_steps,
    )


def _loss_fn(
    model, train_x: np.ndarray, train_y: np.ndarray, batch: int, seed: int, started: str, first_run: int
) -> Callable:
    """The loss fit calls per micro-batch and step, on a pipeline built once per graph and pipeline."""
    pipelines = {}  # one per graph and pipeline: the loss is built once per micro-batch and step

    def loss_fn(ctx):
        # The same initial weights for every system at a seed; the shuffles below (op seeds by
        # pipeline) take the graph seed too, so another seed is another data order.
        v1.set_random_seed(seed)
        key = (v1.get_default_graph(), ctx.input_pipeline_id)
        if key not in pipelines:
            data = ctx.shard(tf.data.Dataset.from_tensor_slices((train_x, train_y)))
            data = data.shuffle(len(train_y), seed=ctx.input_pipeline_id, reshuffle_each_iteration=True)
            data = data.repeat().batch(batch, drop_remainder=True)
            if not disttrain.Cluster.from_env().is_chief:
                data = _after_the_chiefs_first_step(data, started, first_run)
            pipelines[key] = data
        features, labels = ctx.get_next(pipelines[key])
        return model.loss(model(features, training=True), labels)

    return loss_fn


def _scheduled_rate(
    task: Task, system: System, workers: int, per_update: int, steps: int
) -> tuple[float | schedules.Schedule, float]:
    """(the rate, as a schedule if it warms up or decays over `steps`, the momentum) `system` trains with."""
    rate, momentum = rate_and_momentum(task, system, workers, per_update)
    warmup = warmup_steps(task, system, workers, per_update)
    if task.decays:
        return schedules.Cosine(rate, warmup=warmup, total=steps), momentum
    if warmup:
        return schedules.Constant(rate, warmup=warmup), momentum
    return rate, momentum


def _after_the_chiefs_first_step(data: tf.data.Dataset, started: str, first_run: int = 1) -> tf.data.Dataset:
    """`data`, whose batches after the first run's `first_run` wait until the chief's clock has started.

    The clock starts when the chief's first run ends (its one-off graph
    optimisation is start-up; the file `started` says so); an async worker
    would otherwise train on through that run uncounted (teacher once
    reached its target "in 0.0 s"). Its own first run, with its own one-off
    cost, runs before the wait (and, under all-reduce, with the chief's).
    """

    def wait(index):
        deadline = time.monotonic() + 600
        while index >= first_run and not os.path.exists(started) and time.monotonic() < deadline:
            time.sleep(0.01)
        return index

    def gate(index, batch):
        passed = tf.numpy_function(wait, [index], tf.int64)
        with tf.control_dependencies([passed]):
            return tuple(tf.identity(t) for t in batch)

    return data.enumerate().map(gate)


class HeldOutHook(v1.train.SessionRunHook):
    """On the chief: held-out accuracy every `every` global steps, with the live variables.

    Writes one JSON line per evaluation (tf2_heldout.Curve, as the TF 2
    peers do): global step, examples, seconds since the first run ended
    (evaluations excluded; the first run, with its one-off graph
    optimisation, counts as start-up), accuracy, the wall time the first
    run ended (for the start-up figure) and the examples trained before it.
    With several steps per run the global step is read again after a run
    (a step fetched with the run may be read before its steps).
    """

    def __init__(self, model, x, y, every: int, per_step: int, path: str):
        self._model, self._every = model, every
        self._curve = tf2_heldout.Curve(path, per_step, x, y)

    def begin(self):
        self._active = disttrain.Cluster.from_env().is_chief
        if not self._active:
            return
        self._step = v1.train.get_global_step()
        self._features = v1.placeholder(tf.float32, (None,) + self._curve.x.shape[1:])
        self._labels = v1.placeholder(tf.int32, (None,))
        with v1.variable_scope(v1.get_variable_scope(), reuse=True), tf.name_scope("heldout"):
            logits = self._model(self._features, training=False)
        self._correct = tf.reduce_sum(
            tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), self._labels), tf.int32)
        )
        self._next = self._every

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self._step) if self._active else None

    def after_run(self, run_context, run_values):
        if not self._active:
            return
        session = run_context.session
        if self._curve.t0 is None:
            self._curve.start(int(session.run(self._step)))
            open(os.path.join(os.path.dirname(self._curve.path), CLOCK_FILE), "w").close()
        if run_values.results + run_steps.steps_in(run_context) >= self._next:
            step = int(session.run(self._step))
            if step >= self._next:
                self._evaluate(session, step)
                self._next = (step // self._every + 1) * self._every

    def end(self, session):
        if self._active and self._curve.t0 is not None:
            self._evaluate(session, int(session.run(self._step)))

    def _evaluate(self, session, step: int):
        self._curve.evaluate(
            step, lambda x, y: session.run(self._correct, {self._features: x, self._labels: y})
        )


# ---- the launcher -------------------------------------------------------------------------------


def run_system(
    task: str,
    system: str,
    workers: int,
    logdir: str,
    examples: int | None = None,
    eval_every_steps: int | None = None,
    target: float | None = None,
    timeout: float = 600,
    steps_per_run: int = 1,
    accumulate_steps: int = 1,
    seed: int = 0,
    batch_scale: int = 1,
    keep_checkpoints: bool = False,
) -> dict:
    """Train `task` under `system` on a local cluster of real processes; its row of the report.

    examples, eval_every_steps, target: None takes the task's. steps_per_run,
    accumulate_steps: disttrain's settings (a TF 2 peer runs its own
    `tf.function` of several steps and does not accumulate). seed: the
    initial weights' and shuffles' (the held-out split stays). batch_scale:
    the task's per-replica batch times this (disttrain's systems only).
    keep_checkpoints: keep the run's checkpoints (by default deleted after
    it; those of an earlier run in `logdir` are always deleted first, or its
    chief would resume from them).
    """
    spec = TASKS[task]
    examples = examples or spec.examples
    eval_every_steps = eval_every_steps or spec.eval_every_steps
    how = SYSTEMS[system]
    os.makedirs(logdir, exist_ok=True)
    for stale in (CLOCK_FILE, HELD_OUT_FILE):  # a rerun in the same directory starts afresh
        if os.path.exists(os.path.join(logdir, stale)):
            os.remove(os.path.join(logdir, stale))
    drop_checkpoints(logdir)
    if how.peer:
        argv = peer_command(task, system, workers, examples, eval_every_steps, logdir, seed)
        steps_per_run, accumulate_steps, batch_scale = tf2.steps_per_function(eval_every_steps), 1, 1
    else:
        args = dict(task=task, system=system, workers=workers, examples=examples)
        args.update(eval_every_steps=eval_every_steps, logdir=logdir)
        args.update(steps_per_run=steps_per_run, accumulate_steps=accumulate_steps)
        args.update(seed=seed, batch_scale=batch_scale)
        code = f"from disttrain.bench.accuracy import train_process; train_process(**{args!r})"
        argv = [sys.executable, "-c", code]
    spawned = time.time()
    codes = run_cluster(argv, cluster_of(how, workers), logdir, timeout)
    if not keep_checkpoints:
        drop_checkpoints(logdir)
    curve = read_curve(logdir)
    row = summarize(task, system, workers, curve, spawned, codes, spec.target if target is None else target)
    row.update(steps_per_run=steps_per_run, accumulate_steps=accumulate_steps)
    row.update(seed=seed, batch_scale=batch_scale)
    return row


def cluster_of(system: System, workers: int) -> dict[str, list[str]]:
    """Each job's task addresses: none for one process; else the workers, a PS if the system uses one.

    TF 2's PSS also has a chief: its coordinator, which schedules the steps on the workers.
    """
    cluster: dict[str, list[str]] = {}
    if system.one_process:
        return cluster
    if system.peer and system.uses_ps:
        cluster["chief"] = [f"127.0.0.1:{free_port()}"]
    cluster["worker"] = [f"127.0.0.1:{free_port()}" for _ in range(workers)]
    if system.uses_ps:
        cluster["ps"] = [f"127.0.0.1:{free_port()}"]
    return cluster


def run_cluster(argv: list[str], cluster: dict, logdir: str, timeout: float) -> list[int] | None:
    """`argv` once per task of `cluster` (TF_CONFIG says which; one process if empty); the exit codes.

    Each task logs to `<logdir>/<job>_<i>.log`. None if they outlived `timeout` seconds.
    """
    base = task_env({k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
    tasks = [(job, i) for job in cluster for i in range(len(cluster[job]))] or [("local", 0)]
    procs = []
    for job, i in tasks:
        env = dict(base)
        if cluster:
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": i}})
        with open(os.path.join(logdir, f"{job}_{i}.log"), "w") as log:
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        return None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def peer_command(
    task: str, system: str, workers: int, examples: int, eval_every_steps: int, logdir: str, seed: int = 0
):
    """A TF 2 peer's command line, after writing what it needs (it cannot import disttrain) to `logdir`.

    The task's data as made here (task.npz: one definition of the split) and
    a JSON spec (peer_spec.json): the model_zoo model's sizes and variables,
    the batch, momentum SGD at the rate of disttrain's systems of its kind,
    one compute thread, the run's steps and evaluation cadence, and the seed
    of its initial weights and shuffles.
    """
    spec, how = TASKS[task], SYSTEMS[system]
    data_path, done_path = os.path.join(logdir, "task.npz"), os.path.join(logdir, "done")
    np.savez(data_path, **dict(zip(("train_x", "train_y", "held_x", "held_y"), spec.data(), strict=True)))
    if os.path.exists(done_path):
        os.remove(done_path)  # a PS or worker would take it for this run's end
    model, per_step = spec.model(), examples_per_step(how, workers, spec.batch_size)
    steps = max(1, examples // per_step)
    rate, momentum = rate_and_momentum(spec, how, workers)  # as disttrain's systems of its kind
    peer_spec = {
        "system": system,
        "model": tf2.zoo_model_spec(model),
        "variables": tf2.zoo_variables(model),
        "batch_size": spec.batch_size,
        "optimizer": {
            "name": "momentum",
            "learning_rate": rate,
            "momentum": momentum,
            "warmup_steps": warmup_steps(spec, how, workers),
            # Cosine to 0 at the last step after warmup, as schedules.Cosine (the task's `decays`).
            "decay_steps": steps if spec.decays else 0,
        },
        "intra_op_threads": COMPUTE_THREADS,
        "inter_op_threads": COMPUTE_THREADS,
        "steps_per_function": tf2.steps_per_function(eval_every_steps),
        "variable_partitioner": None,  # TF's default placement, round robin by count
        "min_shard_bytes": tf2.MIN_SHARD_BYTES,
        "bytes_per_pack": tf2.strategy_bucket_bytes(disttrain.SyncAllReduce),
        "peer_wait_secs": PEER_WAIT_SECS,
        "placement_path": os.path.join(logdir, "placement.json"),
        "heldout": {
            "data_path": data_path,
            "path": os.path.join(logdir, HELD_OUT_FILE),
            "done_path": done_path,
            "eval_every_steps": eval_every_steps,
            "steps": steps,
            "examples_per_step": per_step,
            "seed": seed,
        },
    }
    spec_path = os.path.join(logdir, "peer_spec.json")
    with open(spec_path, "w") as f:
        json.dump(peer_spec, f, indent=1)
    return [sys.executable, tf2.PEERS[how.peer].path, f"--spec={spec_path}"]


def read_curve(logdir: str) -> list[dict]:
    path = os.path.join(logdir, HELD_OUT_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize(
    task: str, system: str, workers: int, curve: list[dict], spawned: float, codes, target: float
) -> dict:
    """A report row: seconds and examples to the target, final accuracy; `failed` says why not."""
    row = {"task": task, "system": system, "workers": workers if system != "one_process" else 1}
    row["target"] = target
    row["curve"] = [(c["seconds"], c["examples"], c["accuracy"]) for c in curve]
    if codes is None or any(codes):
        row["failed"] = f"exit codes {codes}" if codes else "timed out"
        return row
    if len(curve) < 2 or curve[-1]["global_step"] <= curve[0]["global_step"]:
        row["failed"] = "did not train: the global step did not move between evaluations"
        return row
    if max(c["accuracy"] for c in curve) <= 0.2:
        row["failed"] = f"did not train: held-out accuracy stayed at {curve[-1]['accuracy']:.3f}"
        return row
    reached = next((c for c in curve if c["accuracy"] >= target), None)
    row.update(
        startup_secs=round(curve[0]["first_step_wall"] - spawned, 2),
        secs_to_target=None if reached is None else round(reached["seconds"], 2),
        examples_to_target=None if reached is None else reached["examples"],
        final_accuracy=curve[-1]["accuracy"],
        last3_accuracy=last_mean(row["curve"]),
        final_examples=curve[-1]["examples"],
        train_secs=round(curve[-1]["seconds"], 2),
    )
    # Training speed: the examples trained on the clock (after the first run), per second of it.
    timed = curve[-1]["examples"] - curve[-1].get("start_examples", 0)
    row["examples_per_sec"] = round(timed / curve[-1]["seconds"], 1) if curve[-1]["seconds"] > 0 else None
    return row


# ---- the report ---------------------------------------------------------------------------------


def one_line(row: dict) -> str:
    if "failed" in row:
        return f"failed: {row['failed']}"
    secs = row["secs_to_target"]
    reached = "not reached" if secs is None else f"{secs:.1f} s and {row['examples_to_target']} examples"
    return (
        f"start-up {row['startup_secs']:.1f} s; target {row['target']} {reached}; "
        f"final held-out accuracy {row['final_accuracy']:.4f} after {row['final_examples']} examples, "
        f"{row['train_secs']:.1f} s, {row.get('examples_per_sec') or 0:.0f} examples/s"
    )


def reference_row(rows: list[dict], row: dict) -> dict | None:
    """The one-process row `row` is compared with: its task's, at its steps per run and seed, without
    accumulation or a scaled batch (else at its steps per run, else the task's first such row, else any)."""
    alone = [
        r for r in rows if r["task"] == row["task"] and r["system"] == "one_process" and "failed" not in r
    ]
    plain = [r for r in alone if r.get("accumulate_steps", 1) == 1 and r.get("batch_scale", 1) == 1]
    same = [r for r in plain if r.get("steps_per_run", 1) == row.get("steps_per_run", 1)]
    seeded = [r for r in same if r.get("seed", 0) == row.get("seed", 0)]
    return (seeded or same or plain or alone or [None])[0]


def _ratio(value, reference) -> str:
    return f"{value / reference:.2f}" if value is not None and reference else "-"


def table(rows: list[dict]) -> str:
    """A Markdown table of the rows: time to target and training speed against one process's.

    Each is compared with one process at the same steps per run and
    without accumulation (`reference_row`).
    """
    header = ["task", "system", "workers", "steps/run", "accumulate", "start-up s", "s to target"]
    header += ["x one process", "examples to target", "examples/s", "x one process"]
    header += ["final held-out acc.", "vs one process (points)"]
    body = []
    for r in rows:
        scaled = f" (batch x{r['batch_scale']})" if r.get("batch_scale", 1) != 1 else ""
        head = [r["task"], r["system"], r["workers"], r.get("steps_per_run", 1)]
        head.append(f"{r.get('accumulate_steps', 1)}{scaled}")
        if "failed" in r:
            body.append(head + [f"failed: {r['failed']}"] + [""] * 7)
            continue
        ref, secs, speed = reference_row(rows, r) or {}, r["secs_to_target"], r.get("examples_per_sec")
        base = ref.get("final_accuracy")
        reached = r["examples_to_target"]
        body.append(
            head
            + [f"{r['startup_secs']:.1f}", "-" if secs is None else f"{secs:.1f}"]
            + [_ratio(secs, ref.get("secs_to_target")), "not reached" if reached is None else reached]
            + ["-" if speed is None else f"{speed:.0f}", _ratio(speed, ref.get("examples_per_sec"))]
            + [
                f"{r['final_accuracy']:.4f}",
                f"{100 * (r['final_accuracy'] - base):+.1f}" if base is not None else "-",
            ]
        )
    return _markdown(header, body)


def _settings(row: dict) -> str:
    """', 10 steps/run, 2 accumulated, 2 x the batch' for a row's settings that are not 1."""
    named = (
        ("steps/run", row.get("steps_per_run", 1)),
        ("accumulated", row.get("accumulate_steps", 1)),
        ("x the batch", row.get("batch_scale", 1)),
    )
    return "".join(f", {value} {name}" for name, value in named if value != 1)


# ---- over seeds: each system's end figures, and 16-bit and accumulation against their twins -------

END_FIGURES = ("final", "last3")  # the last evaluation's accuracy; the mean of the last 3 (steadier)
SETTINGS = ("task", "system", "workers", "steps_per_run", "accumulate_steps", "batch_scale")


def last_mean(curve: list, last: int = 3) -> float:
    """Mean held-out accuracy of the last `last` evaluations of a row's curve (seconds, examples, accuracy).

    An evaluation at the same examples as the one before (the end of a run
    that ends on the cadence) counts once.
    """
    points = [p for i, p in enumerate(curve) if i + 1 == len(curve) or curve[i + 1][1] != p[1]]
    return float(np.mean([p[2] for p in points[-last:]]))


def end_figures(row: dict) -> dict[str, float]:
    """A finished row's end figures (END_FIGURES), as accuracies (`summarize` computed both)."""
    return {"final": row["final_accuracy"], "last3": row["last3_accuracy"]}


def mean_and_se(values: list[float]) -> tuple[float, float | None]:
    """The mean and its standard error (sample standard deviation over sqrt(n)); no SE for one value."""
    mean = float(np.mean(values))
    return mean, (float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else None)


def _settings_of(row: dict) -> tuple:
    defaults = {"steps_per_run": 1, "accumulate_steps": 1, "batch_scale": 1}
    return tuple(row.get(k, defaults.get(k)) for k in SETTINGS)


def over_seeds(rows: list[dict]) -> list[dict]:
    """Per system and settings, the mean and SE over seeds of each end figure; failed runs left out."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if "failed" not in r:
            groups.setdefault(_settings_of(r), []).append(r)
    out = []
    for key, members in groups.items():
        entry = dict(zip(SETTINGS, key, strict=True), seeds=[r.get("seed", 0) for r in members])
        for figure in END_FIGURES:
            entry[figure], entry[f"{figure}_se"] = mean_and_se([end_figures(r)[figure] for r in members])
        out.append(entry)
    return out


def twin(row: dict) -> tuple[str, dict] | None:
    """What `row` is compared with at its seed: (kind, the twin's settings that differ), or None.

    16-bit: `X_bf16` against `X` at the same settings. Accumulation: k
    micro-batches of the task's batch against one step of k times it
    (`batch_scale`), the same system, global batch and rate.
    """
    if row["system"].endswith("_bf16"):
        return "16-bit", {"system": row["system"][: -len("_bf16")]}
    k = row.get("accumulate_steps", 1)
    if k > 1 and row.get("batch_scale", 1) == 1:
        return "accumulation", {"accumulate_steps": 1, "batch_scale": k}
    return None


def paired_differences(rows: list[dict]) -> list[dict]:
    """Per compared system and settings, the mean over seeds of (its end figure minus its twin's at
    the same seed), in points, and its standard error. Seeds where either run failed are left out.

    The same seed gives both the same initial weights and data order, so the
    difference is the setting's alone (and, for async systems, their timing).
    """
    done = {(_settings_of(r), r.get("seed", 0)): r for r in rows if "failed" not in r}
    groups: dict[tuple, list[tuple[int, dict, dict]]] = {}
    for (settings, seed), r in done.items():
        paired = twin(r)
        if paired is None:
            continue
        kind, change = paired
        other = done.get((_settings_of(dict(r, **change)), seed))
        if other is not None:
            groups.setdefault((kind, settings, other["system"]), []).append((seed, r, other))
    out = []
    for (kind, settings, against), pairs in groups.items():
        entry = dict(zip(SETTINGS, settings, strict=True), kind=kind, against=against)
        entry["seeds"] = [seed for seed, _, _ in pairs]
        for figure in END_FIGURES:
            diffs = [100 * (end_figures(r)[figure] - end_figures(o)[figure]) for _, r, o in pairs]
            entry[f"{figure}_points"], entry[f"{figure}_points_se"] = mean_and_se(diffs)
        out.append(entry)
    return out


def _pm(mean: float, se: float | None, scale: float = 1.0, digits: int = 1, sign: str = "") -> str:
    """'mean ± se' at `scale` (or the mean alone without an SE)."""
    text = f"{scale * mean:{sign}.{digits}f}"
    return text + (f" ± {scale * se:.{digits}f}" if se is not None else "")


SETTING_COLUMNS = ("task", "system", "workers", "steps/run", "accumulate", "batch x")  # of SETTINGS


def _markdown(header: list[str], body: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in cells) + " |" for cells in body])


def seeds_table(rows: list[dict]) -> str:
    """A Markdown table: per system and settings, seeds and each end figure's mean ± SE, in %."""
    body = [
        [*(e[k] for k in SETTINGS), len(e["seeds"]), _pm(e["final"], e["final_se"], 100)]
        + [_pm(e["last3"], e["last3_se"], 100)]
        for e in over_seeds(rows)
    ]
    return _markdown([*SETTING_COLUMNS, "seeds", "final held-out acc. %", "mean of last 3 %"], body)


def paired_table(rows: list[dict]) -> str:
    """A Markdown table of `paired_differences`: points, mean ± SE over seeds."""
    body = [
        [e["task"], e["system"], e["against"], *(e[k] for k in SETTINGS[2:]), len(e["seeds"])]
        + [_pm(e["final_points"], e["final_points_se"], sign="+")]
        + [_pm(e["last3_points"], e["last3_points_se"], sign="+")]
        for e in paired_differences(rows)
    ]
    header = ["task", "system", "against", *SETTING_COLUMNS[2:], "seeds"]
    return _markdown(header + ["final (points)", "mean of last 3 (points)"], body)


def plot(rows: list[dict], path: str) -> str | None:
    """Held-out accuracy against seconds since the first step, per system; None without matplotlib.

    Another seed's run of the same system and settings is drawn fainter, under the first one's label.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    tasks = sorted({r["task"] for r in rows})
    colours, styles = plt.get_cmap("tab20"), ["-", "--", ":", "-."]  # colour: system; style: workers
    workers = {r["workers"] for r in rows}
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        labelled = set()
        for r in rows:
            if r["task"] == task and r["curve"]:
                secs, _, acc = zip(*r["curve"], strict=True)
                label = f"{r['system']} ({r['workers']}{_settings(r)})"
                ax.plot(
                    secs,
                    acc,
                    marker=".",
                    color=colours(list(SYSTEMS).index(r["system"]) % 20),
                    linestyle=styles[sorted(workers).index(r["workers"]) % len(styles)],
                    alpha=0.35 if label in labelled else 1.0,
                    label=None if label in labelled else label,
                )
                labelled.add(label)
        ax.axhline(
            next(r["target"] for r in rows if r["task"] == task), color="grey", linestyle="--", linewidth=0.8
        )
        ax.set(
            title=f"{task}: held-out accuracy",
            xlabel="seconds of training (from the end of the first step)",
            ylabel="accuracy",
        )
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
