"""What both TF 2 peers share: their spec, threads, the model, the optimizer and the console lines.

The peers (tf2_pss.py, tf2_mwms.py) are programs run by file path, never
imported as `disttrain.bench.peers...`: importing the disttrain package
switches the process to graph mode, and TF 2's strategies need eager mode and
tf.function. So nothing here imports disttrain; what the peers must share with
it (the model's sizes, the optimizer's settings, the console format the
benchmark reads back) comes in the JSON spec the benchmark writes
(disttrain/bench/tf2.py).

The models are model_zoo's MLP and CIFAR-10 CNN written with tf.Variable and
tf.nn ops: the same layers, shapes, names and initializers (He truncated
normal weights, zero biases), softmax cross-entropy, and the same synthetic
input (one fixed random batch per replica, repeated); the spec lists
model_zoo's variables and a peer checks its own against them. The optimizer
applies the same fused kernels as TF 1's optimizers (ResourceApplyAdam,
ResourceApplyGradientDescent, ResourceApplyMomentum), so a step costs what
disttrain's step costs.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import sys

import tensorflow as tf

PS, WORKER, CHIEF = "ps", "worker", "chief"


def load_spec(argv: list[str]) -> dict:
    """The spec from `--spec=PATH` (the only argument)."""
    paths = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--spec=")]
    if len(paths) != 1 or len(argv) != 2:
        sys.exit(f"usage: {os.path.basename(argv[0])} --spec=PATH (the benchmark writes it); got {argv[1:]}")
    with open(paths[0]) as f:
        return json.load(f)


def tf_config() -> tuple[dict, str, int]:
    """The cluster, this task's type and index, from TF_CONFIG."""
    config = json.loads(os.environ["TF_CONFIG"])
    return config["cluster"], config["task"]["type"], int(config["task"]["index"])


def task_name(job: str, index: int) -> str:
    return f"/job:{job}/task:{index}"


def set_threads(spec: dict) -> None:
    """The benchmark's thread settings for this process's eager runtime (before any op runs)."""
    if spec["intra_op_threads"]:
        tf.config.threading.set_intra_op_parallelism_threads(spec["intra_op_threads"])
    if spec["inter_op_threads"]:
        tf.config.threading.set_inter_op_parallelism_threads(spec["inter_op_threads"])


# A worker server given one inter-op thread never finishes a scheduled function (measured on TF
# 2.21: the coordinator waits for ever, the workers idle); two is the least that runs.
WORKER_INTER_OP_THREADS_AT_LEAST = 2


def server_config(spec: dict, job: str) -> tf.compat.v1.ConfigProto:
    """Thread settings for a tf.distribute.Server (it does not read the eager context's).

    A PS gets the intra-op setting alone, as disttrain's PS servers do; a
    worker both, with at least WORKER_INTER_OP_THREADS_AT_LEAST inter-op threads.
    """
    intra, inter = spec["intra_op_threads"], spec["inter_op_threads"]
    if job == PS:
        return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra)
    if inter:
        inter = max(inter, WORKER_INTER_OP_THREADS_AT_LEAST)
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra, inter_op_parallelism_threads=inter)


# ---- console lines, in the format the benchmark reads back ----------------------------------


def line_logger(spec: dict, path: str | None = None) -> logging.Logger:
    """A logger whose lines are `spec['console']['format']`, to stdout or to `path`."""
    fmt = spec["console"]
    logger = logging.getLogger(f"tf2_peer.{path or 'stdout'}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = logging.FileHandler(path, mode="w") if path else logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(fmt["format"], fmt["date_format"]))
    logger.addHandler(handler)
    return logger


class Interval:
    """One replica's throughput lines: every `every_n` of its steps, its rate and (chief) the cluster's.

    Timed by the caller's clock (`now`, seconds); the first call only sets the
    mark (the first interval includes start-up, as disttrain's ThroughputHook).
    """

    def __init__(self, spec: dict, task: str, logger: logging.Logger, examples_per_global_step: int | None):
        self.spec, self.task, self.log = spec, task, logger
        self.batch, self.every_n = spec["batch_size"], spec["log_every_steps"]
        self.per_global = examples_per_global_step  # None: not the chief
        self.steps = 0
        self.mark: tuple[float, int, int] | None = None  # (time, local steps, global step)

    def add(self, steps: int, global_step: int, loss: float, now: float) -> None:
        self.steps += steps
        if self.mark is None:
            self.mark = (now, self.steps, global_step)
            return
        t0, s0, g0 = self.mark
        if self.steps - s0 < self.every_n:
            return
        seconds = max(now - t0, 1e-9)
        fmt = self.spec["console"]
        msg = fmt["line"].format(
            task=self.task, step=global_step, loss=loss, local=(self.steps - s0) * self.batch / seconds
        )
        if self.per_global is not None:
            msg += fmt["cluster_suffix"].format(
                cluster=(global_step - g0) * self.per_global / seconds, gsps=(global_step - g0) / seconds
            )
        self.log.info(msg)
        for handler in self.log.handlers:
            handler.flush()
        self.mark = (now, self.steps, global_step)


# ---- the model ---------------------------------------------------------------------------------

_TRUNCATED_STDDEV = 0.87962566103423978  # stddev of a unit normal truncated at 2 sigma


def he_truncated_normal(shape, dtype=tf.float32, partition_shape=None, partition_offset=None):
    """TF 1's variance_scaling_initializer(2.0, 'fan_in', 'truncated_normal'): fan_in from the full shape.

    With `partition_shape` (TF 2's sharded variables ask for one part at a
    time) it returns that part, drawn from the same distribution.
    """
    del partition_offset
    fan_in = shape[0] if len(shape) == 2 else math.prod(shape[:-1])
    stddev = math.sqrt(2.0 / max(1, fan_in)) / _TRUNCATED_STDDEV
    return tf.random.truncated_normal(partition_shape or shape, stddev=stddev, dtype=dtype)


def zeros(shape, dtype=tf.float32, partition_shape=None, partition_offset=None):
    del partition_offset
    return tf.zeros(partition_shape or shape, dtype)


def _variable(name: str, shape: list[int], init) -> tf.Variable:
    """A float32 variable initialized where it lives (the initializer is called on its device)."""
    init_fn = lambda **kw: init(shape, tf.float32, **kw)
    return tf.Variable(initial_value=init_fn, shape=shape, dtype=tf.float32, name=name)


def components(var) -> list:
    """A variable's parts: a sharded variable's shards, or the variable itself."""
    return list(getattr(var, "variables", None) or [var])


class Model:
    """Layers of weights and biases, as model_zoo.layers names them; softmax cross-entropy of `logits`.

    Subclasses create their layers with `_layer` in model_zoo's order and
    implement `logits(features)`.
    """

    def __init__(self):
        self.layers: dict[str, tuple] = {}

    def _layer(self, name: str, weights_shape: list[int]) -> None:
        w = _variable(f"{name}/weights", weights_shape, he_truncated_normal)
        b = _variable(f"{name}/biases", weights_shape[-1:], zeros)
        self.layers[name] = (w, b)

    def _dense(self, x: tf.Tensor, name: str, relu: bool = True) -> tf.Tensor:
        w, b = self.layers[name]
        x = tf.reshape(x, [-1, w.shape[0]])  # flattened as model_zoo.layers.dense does
        x = tf.nn.bias_add(tf.matmul(x, w), b)  # a sharded w is read whole, its parts concatenated
        return tf.nn.relu(x) if relu else x

    @property
    def variables(self) -> list:
        """As created (each may be sharded)."""
        return [v for layer in self.layers.values() for v in layer]

    @property
    def trainable(self) -> list:
        """Every variable's parts: what gradients are taken for and updates applied to."""
        return [part for v in self.variables for part in components(v)]

    def logits(self, features: tf.Tensor) -> tf.Tensor:
        raise NotImplementedError

    def loss(self, features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        logits = self.logits(features)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


class MLP(Model):
    """model_zoo's MLP: dense layers `fc1..fcK` with relu, then `logits`."""

    def __init__(self, input_shape: list[int], num_classes: int, hidden_sizes: list[int]):
        super().__init__()
        (fan_in,) = input_shape
        names = [f"fc{i + 1}" for i in range(len(hidden_sizes))] + ["logits"]
        for name, units in zip(names, [*hidden_sizes, num_classes], strict=True):
            self._layer(name, [fan_in, units])
            fan_in = units

    def logits(self, features: tf.Tensor) -> tf.Tensor:
        x = features
        for name in list(self.layers)[:-1]:
            x = self._dense(x, name)
        return self._dense(x, "logits", relu=False)


def _lrn(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.local_response_normalization(x, depth_radius=4, bias=1.0, alpha=0.001 / 9.0, beta=0.75)


def _conv_relu(x: tf.Tensor, w, b) -> tf.Tensor:
    return tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, strides=[1, 1, 1, 1], padding="SAME"), b))


def _max_pool(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.max_pool2d(x, 3, 2, "SAME")


class Cifar10(Model):
    """model_zoo's CIFAR-10 CNN: conv5x5 - pool - lrn - conv5x5 - lrn - pool - fc - fc - logits.

    No batch norm and no dropout, as in model_zoo; the same local response
    normalisation, 3x3/2 max pools (SAME) and 5x5 convolutions (SAME).
    """

    def __init__(self, input_shape: list[int], num_classes: int, width: int):
        super().__init__()
        height, breadth, channels = input_shape
        self._layer("conv1", [5, 5, channels, width])
        self._layer("conv2", [5, 5, width, width])
        pooled = lambda n: math.ceil(math.ceil(n / 2) / 2)  # two SAME pools of stride 2
        self._layer("local3", [pooled(height) * pooled(breadth) * width, 6 * width])
        self._layer("local4", [6 * width, 3 * width])
        self._layer("softmax_linear", [3 * width, num_classes])

    def logits(self, features: tf.Tensor) -> tf.Tensor:
        x = _lrn(_max_pool(_conv_relu(features, *self.layers["conv1"])))
        x = _max_pool(_lrn(_conv_relu(x, *self.layers["conv2"])))
        x = self._dense(x, "local3")
        x = self._dense(x, "local4")
        return self._dense(x, "softmax_linear", relu=False)


MODELS = {"mlp": MLP, "cifar10": Cifar10}


def build_model(spec: dict) -> Model:
    """The spec's model, its variables created here; exits if they differ from model_zoo's (the spec's list).

    The benchmark writes model_zoo's own variables (name, shape) into the
    spec, so a peer that would train other math than disttrain stops before
    its first step.
    """
    params = dict(spec["model"])
    model = MODELS[params.pop("name")](**params)
    mine = [{"name": variable_name(v), "shape": v.shape.as_list()} for v in model.variables]
    for ours, zoo in itertools.zip_longest(mine, spec["variables"]):
        if ours != zoo:
            sys.exit(f"the peer's {type(model).__name__} has variable {ours} where model_zoo's has {zoo}")
    return model


def synthetic(spec: dict, replica_index) -> tf.data.Dataset:
    """model_zoo.inputs.synthetic: one fixed random batch per replica, repeated (same seeds)."""
    m, batch, seed = spec["model"], spec["batch_size"], spec["seed"]
    index = tf.cast(replica_index, tf.int64)
    features = tf.random.stateless_uniform(
        (batch, *m["input_shape"]), seed=tf.stack([tf.constant(seed, tf.int64), index]), dtype=tf.float32
    )
    labels = tf.random.stateless_uniform(
        (batch,),
        seed=tf.stack([tf.constant(seed + 1, tf.int64), index]),
        maxval=m["num_classes"],
        dtype=tf.int32,
    )
    return tf.data.Dataset.from_tensors((features, labels)).repeat()


# ---- the optimizer -----------------------------------------------------------------------------


def _handle(var):
    """The resource handle of a variable or of a strategy's wrapper around one."""
    return var.handle


class Optimizer:
    """TF 1's Adam, momentum SGD or plain SGD, as fused kernels on each variable (where the variable lives).

    Slots are made with `colocate(var)` (the strategy's colocate_vars_with), so
    they live with their variable. `step` (an int64 variable the caller makes
    where its strategy wants it) counts updates as a global step does; Adam's
    beta powers are computed from it, as TF 2 optimizers do (TF 1 keeps them
    as two variables; the values are the same).
    """

    SLOTS = {"adam": ("Adam", "Adam_1"), "momentum": ("Momentum",), "sgd": ()}  # as TF 1 names them

    def __init__(self, spec: dict, variables: list, colocate, step: tf.Variable):
        o = spec["optimizer"]
        self.name = o["name"]
        if self.name not in self.SLOTS:
            raise ValueError(f"optimizer {self.name!r}: expected one of {sorted(self.SLOTS)}")
        self.lr = o["learning_rate"]
        # Linear warmup from 0 to lr over these steps, as disttrain.graph.schedules.Constant(warmup=...);
        # with decay_steps, then a cosine from lr to 0 at that step, as disttrain.graph.schedules.Cosine.
        self.warmup_steps = o.get("warmup_steps", 0)
        self.decay_steps = o.get("decay_steps", 0)
        self.beta1, self.beta2, self.epsilon = o.get("beta1"), o.get("beta2"), o.get("epsilon")
        self.momentum = o.get("momentum")
        self.step = step
        self.slots = []
        for var in variables:
            with colocate(var):
                self.slots.append(tuple(_zeros_like(var, suffix) for suffix in self.SLOTS[self.name]))

    def rate(self) -> tf.Tensor:
        """The learning rate at this step: the warmup's ramp, then the peak or its cosine decay."""
        lr = tf.constant(self.lr, tf.float32)
        if not self.warmup_steps and not self.decay_steps:
            return lr
        step = tf.cast(self.step.read_value(), tf.float32)
        after = lr
        if self.decay_steps:
            span = max(self.decay_steps - self.warmup_steps, 1)
            progress = tf.clip_by_value((step - self.warmup_steps) / span, 0.0, 1.0)
            after = lr * 0.5 * (1.0 + tf.cos(math.pi * progress))
        if not self.warmup_steps:
            return after
        return tf.where(step < self.warmup_steps, lr * step / self.warmup_steps, after)

    def apply(self, grads: list, variables: list):
        """The update ops for one step's gradients, then the step's increment; returns the increment."""
        const = lambda x: tf.constant(x, tf.float32)
        lr = self.rate()
        if self.name == "adam":
            t = tf.cast(self.step.read_value() + 1, tf.float32)
            b1p, b2p = tf.pow(self.beta1, t), tf.pow(self.beta2, t)
        updates = []
        for g, var, slots in zip(grads, variables, self.slots, strict=True):
            if self.name == "adam":
                m, v2 = slots
                updates.append(
                    tf.raw_ops.ResourceApplyAdam(
                        var=_handle(var),
                        m=_handle(m),
                        v=_handle(v2),
                        beta1_power=b1p,
                        beta2_power=b2p,
                        lr=lr,
                        beta1=const(self.beta1),
                        beta2=const(self.beta2),
                        epsilon=const(self.epsilon),
                        grad=g,
                    )
                )
            elif self.name == "momentum":
                (accum,) = slots
                updates.append(
                    tf.raw_ops.ResourceApplyMomentum(
                        var=_handle(var),
                        accum=_handle(accum),
                        lr=lr,
                        grad=g,
                        momentum=const(self.momentum),
                        use_nesterov=False,
                    )
                )
            else:
                updates.append(tf.raw_ops.ResourceApplyGradientDescent(var=_handle(var), alpha=lr, delta=g))
        with tf.control_dependencies(updates):
            return self.step.assign_add(1)


def _base_name(var) -> str:
    return var.name.split(":")[0]


def variable_name(var) -> str:
    """The name a variable was created with; a sharded one's from its first part (`<name>/part_0`)."""
    return _base_name(components(var)[0]).removesuffix("/part_0")


def ps_bytes(variables: list, num_ps: int) -> list[int]:
    """Bytes of `variables` (parts) on each PS task, from where each part was created."""
    loads = [0] * num_ps
    for var in variables:
        spec = tf.DeviceSpec.from_string(var.device)
        if spec.job == PS and spec.task is not None:
            loads[spec.task] += var.shape.num_elements() * var.dtype.size
    return loads


def _zeros_like(var, suffix: str) -> tf.Variable:
    """An optimizer slot for `var`: zeros of its shape, named as TF's v1 Adam names its slots."""
    return tf.Variable(
        initial_value=lambda: tf.zeros(var.shape, var.dtype),
        shape=var.shape,
        dtype=var.dtype,
        trainable=False,
        name=f"{_base_name(var)}/{suffix}",
    )


def replica_steps(strategy, model: Model, optimizer: Optimizer, steps: int, reduce=None):
    """`run(iterator[, n]) -> (loss, global step)`: `steps` replica steps, for the body of a tf.function.

    `reduce(grads)` combines the replicas' gradients before the update (MWMS's
    all-reduce); None applies each replica's own (PSS).
    """

    def replica_step(features, labels):
        with tf.GradientTape() as tape:
            loss = model.loss(features, labels)
        grads = tape.gradient(loss, model.trainable)
        if reduce is not None:
            grads = reduce(grads)
        return loss, optimizer.apply(grads, model.trainable)

    def run(iterator, n=None):
        """`n` (a scalar int tensor: one trace for any count) replaces `steps` when given."""
        loss, global_step = tf.constant(0.0), tf.constant(0, tf.int64)
        for _ in tf.range(steps if n is None else n):
            features, labels = next(iterator)
            loss, global_step = strategy.run(replica_step, args=(features, labels))
        return loss, global_step

    return run
