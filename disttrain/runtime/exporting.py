"""From a checkpoint to a served model: a SavedModel with a `serving_default` signature.

`export(logdir, serve_fn, export_dir, inputs=...)` builds `serve_fn` in one
process, as `loss_fn` builds a replica, restores the newest (or a named)
checkpoint into it and writes a SavedModel in TF Serving's versioned layout,
`<export_dir>/<version>/`, the version being the checkpoint's global step.
A checkpoint of any layout restores: variables split over any number of PS
(partitioned variables, tables split by rows, pieces) are slices of one
checkpoint key, which TF reads back whole. The SavedModel holds only what
the signature's outputs need: the variables they read (no optimizer slots,
no global step) and their ops (no input pipeline, no update). It is a TF 1
SavedModel, which TF Serving serves and `tf.saved_model.load` loads in
plain TF 2.

`BestExport` says what an evaluator task exports when a checkpoint it
measured has the best metric so far (`fit(..., export_best=...)`).

Nothing here reads flags or gin; `disttrain-export` is the command line.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Mapping

import tensorflow as tf

from disttrain.base import logs, tf_internals
from disttrain.base.errors import ConfigError, DisttrainError
from disttrain.runtime import recovery, trainer

v1 = tf.compat.v1
log = logging.getLogger("disttrain")

SIGNATURE = "serving_default"  # TF Serving's and tf.saved_model.load's default signature key
LONE_INPUT, LONE_OUTPUT = "inputs", "outputs"  # names of an input or output given alone, not in a dict

# What `inputs` may be: one spec (the input named LONE_INPUT) or a dict name -> spec.
InputSpecs = tf.TypeSpec | Mapping[str, tf.TypeSpec]


class MismatchError(ConfigError):
    """The checkpoint does not hold what the serving model reads, or holds trained variables it does not."""


@dataclasses.dataclass(frozen=True)
class Serving:
    """A serving signature built in a graph: its inputs, its outputs and the variables they read."""

    inputs: dict[str, object]  # name -> placeholder (a Tensor or SparseTensor)
    outputs: dict[str, tf.Tensor]
    variables: list[tf.Variable]
    saver: v1.train.Saver  # restores and saves `variables`; exports only what the outputs need


@dataclasses.dataclass(frozen=True)
class BestExport:
    """What an evaluator task exports: each checkpoint it measures whose metric is the best so far.

    As Estimator's BestExporter did. Each export is `<export_dir>/<global
    step>/`, so the newest version TF Serving loads is always the best.

    serve_fn, inputs: as `export`'s.
    metric: the name of one of `eval_fn`'s metrics ('loss' when it returns
      a lone tensor).
    higher_is_better: False (the default) for a loss; True for an accuracy.
    keep: how many versions stay in `export_dir` (the newest, the best
      ones); None: every one.

    "So far" includes what an earlier evaluator of the same `logdir`
    measured (its `eval/<metric>` scalars): a restarted evaluator exports
    only a checkpoint better than every one measured before.
    """

    serve_fn: Callable
    export_dir: str
    inputs: InputSpecs = None
    metric: str = "loss"
    higher_is_better: bool = False
    keep: int | None = 5

    def __post_init__(self):
        if not callable(self.serve_fn):
            raise ConfigError(f"BestExport.serve_fn must be callable, got {self.serve_fn!r}")
        if self.inputs is None:
            raise ConfigError("BestExport needs inputs=: the serving inputs, e.g. tf.TensorSpec([None, 256])")
        if self.keep is not None and self.keep < 1:
            raise ConfigError(f"BestExport.keep must be >= 1 (or None: keep all), got {self.keep}")

    def improves(self, value: float, best: float | None) -> bool:
        """Whether `value` of the metric is better than `best` (None: nothing measured yet)."""
        if best is None:
            return True
        return value > best if self.higher_is_better else value < best

    def best(self, values) -> float | None:
        """The best of `values` (None if there is none)."""
        values = list(values)
        if not values:
            return None
        return max(values) if self.higher_is_better else min(values)


class BestExporter:
    """An evaluator's exports: serving built once in its graph, offered every checkpoint it measures.

    `earlier`: the metric's values measured before (by an evaluator of the
    same run that was restarted), which a first export must beat.
    """

    def __init__(self, spec: BestExport, metrics, earlier=()):
        if spec.metric not in metrics:
            raise ConfigError(
                f"BestExport.metric={spec.metric!r} is not one of eval_fn's metrics "
                f"({', '.join(sorted(metrics))}): name one of them"
            )
        self.spec = spec
        self.serving = build_serving(spec.serve_fn, spec.inputs)
        self.best = spec.best(v for v in earlier if math.isfinite(v))

    def check(self, path: str) -> None:
        """Refuse a checkpoint serving cannot be exported from (before the evaluator restores it)."""
        check_checkpoint(path, self.serving.variables)

    def offer(self, session: v1.Session, path: str, step: int, means: Mapping[str, float]) -> str | None:
        """Export `path` (restored in `session`) if its metric is the best so far; the version written."""
        value = means[self.spec.metric]
        if not math.isfinite(value) or not self.spec.improves(value, self.best):
            return None
        final = os.path.join(self.spec.export_dir, str(step))
        if tf.io.gfile.exists(final):  # exported before a restart of this evaluator
            log.info(f"evaluator: {final} exists already: not exported again")
            return None
        restore(self.serving, session, path)  # exactly the checkpoint measured, whatever the metrics ran
        written = write_version(session, self.serving, self.spec.export_dir, step)
        self.best = value
        keep_newest(self.spec.export_dir, self.spec.keep)
        log.info(
            f"evaluator: step {step} has the best eval {self.spec.metric} so far ({value:.4f}): "
            f"exported to {written}"
        )
        return written


def export(
    logdir: str,
    serve_fn: Callable,
    export_dir: str,
    *,
    inputs: InputSpecs,
    checkpoint: str | None = None,
    version: int | None = None,
) -> str:
    """Write the checkpoint as a SavedModel `<export_dir>/<version>/`; return that directory.

    serve_fn: `serve_fn(inputs) -> outputs` builds the model for serving in
      graph mode, with the variable names training gave it (the same
      `get_variable` calls and scopes, the same Keras layer names), as
      `loss_fn` does; `training=False` wherever it matters (batch norm's
      moving statistics, no dropout). It is given what `inputs` describes
      (one placeholder, or a dict of them) and returns a tensor (the output
      named 'outputs') or a dict name -> tensor. A Keras model (Keras 3)
      may be given itself: the export builds a copy of it in its own graph
      (`keras.models.clone_model`, which keeps its variables' names) and
      calls that with `training=False`; the model object holds the
      variables of the graph it was built in (training's).
    inputs: a `tf.TensorSpec` (or `tf.SparseTensorSpec`), or a dict name ->
      spec: the signature's inputs, None for sizes that vary (the batch).
    checkpoint: a checkpoint path (or its name within `logdir`); None: the
      newest in `logdir`.
    version: the version directory's number; None: the checkpoint's global
      step (else its `-N` suffix, else the time in seconds).

    A checkpoint that lacks a variable `serve_fn` reads, holds one in
    another shape, or holds a trained variable `serve_fn` does not read, is
    refused with ConfigError naming the first such variable, before anything
    is written. The version is written to a hidden directory beside it and
    renamed into place, so `export_dir` never holds half a model. Does not
    change `logdir`.
    """
    logs.to_console()
    path = find_checkpoint(logdir, checkpoint)
    with tf.Graph().as_default():
        serving = build_serving(_copied_if_keras(serve_fn), inputs)
        check_checkpoint(path, serving.variables)
        # On the CPU: an export beside training never takes a GPU's memory from it.
        with v1.Session(config=v1.ConfigProto(device_count={"GPU": 0})) as session:
            restore(serving, session, path)
            version = checkpoint_version(path) if version is None else version
            written = write_version(session, serving, export_dir, version)
    log.info(f"exported {path} ({len(serving.variables)} variables) to {written}")
    return written


def _copied_if_keras(serve_fn: Callable) -> Callable:
    """`serve_fn`, or for a Keras model a function that calls a copy of it built in the current graph."""
    import keras  # here: TensorFlow imports it anyway, but only a Keras model needs it

    if not isinstance(serve_fn, keras.Model):
        return serve_fn

    def serve(inputs):
        try:
            copy = keras.models.clone_model(serve_fn)
        except (NotImplementedError, TypeError, ValueError) as error:
            raise ConfigError(
                f"the Keras model {serve_fn.name!r} cannot be copied into the export's graph "
                f"({type(error).__name__}: {(str(error).splitlines() or [''])[0]}): give "
                "serve_fn=lambda x: make_model()(x, training=False), a function that builds the model "
                "as training did, with the same names"
            ) from error
        return copy(inputs, training=False)

    return serve


def find_checkpoint(logdir: str, checkpoint: str | None) -> str:
    """The checkpoint path to export: `checkpoint` (a path, or a name in `logdir`) or the newest."""
    if checkpoint is None:
        path = v1.train.latest_checkpoint(logdir)
        if path is None:
            raise ConfigError(f"no checkpoint in {logdir!r}: give the log directory a run wrote (--logdir)")
        return path
    for path in (checkpoint, os.path.join(logdir, checkpoint)):
        if tf.io.gfile.exists(path + ".index"):
            return path
    state = v1.train.get_checkpoint_state(logdir)
    known = [os.path.basename(p) for p in state.all_model_checkpoint_paths] if state else []
    raise ConfigError(
        f"no checkpoint {checkpoint!r} (looked for {checkpoint}.index, also in {logdir}): "
        f"checkpoints there: {', '.join(known) or 'none'}"
    )


def checkpoint_version(path: str) -> int:
    """The version number of an export of `path`: its `-N` suffix, else its global_step, else the time.

    The suffix first: under asynchronous training other replicas move the
    global step while the chief saves, so the value stored can be a step or
    two past the name the checkpoint was saved under, and a user looks for
    `model.ckpt-17`'s export under version 17.
    """
    step = recovery.checkpoint_step(path)
    if step is not None:
        return step
    reader = tf.train.load_checkpoint(path)
    if reader.has_tensor("global_step"):
        return int(reader.get_tensor("global_step"))
    return int(time.time())


def _placeholder(name: str, spec: tf.TypeSpec):
    try:
        if isinstance(spec, tf.SparseTensorSpec):
            return v1.sparse_placeholder(spec.dtype, spec.shape, name=name)
        if isinstance(spec, tf.TensorSpec):
            return v1.placeholder(spec.dtype, spec.shape, name=name)
    except ValueError as e:  # a name TF refuses for an op
        raise ConfigError(f"serving input name {name!r}: {e}") from None
    raise ConfigError(
        f"serving input {name!r} is {spec!r}: give a tf.TensorSpec or tf.SparseTensorSpec "
        "(e.g. tf.TensorSpec([None, 256], tf.float32))"
    )


def build_serving(serve_fn: Callable, inputs: InputSpecs) -> Serving:
    """Placeholders for `inputs`, `serve_fn` on them, in the default graph.

    Variables `serve_fn` finds by name are reused (AUTO_REUSE), so it may be
    built in a graph that already holds the model (the evaluator's).
    """
    if isinstance(inputs, tf.TypeSpec):
        placeholders = {LONE_INPUT: _placeholder(LONE_INPUT, inputs)}
        given = placeholders[LONE_INPUT]
    elif isinstance(inputs, Mapping) and inputs:
        placeholders = {str(n): _placeholder(str(n), s) for n, s in inputs.items()}
        given = dict(placeholders)
    else:
        raise ConfigError(
            f"inputs={inputs!r}: give the serving inputs as a tf.TensorSpec or a dict name -> tf.TensorSpec"
        )
    with v1.variable_scope(v1.get_variable_scope(), reuse=v1.AUTO_REUSE):
        try:
            built = serve_fn(given)
        except ValueError as error:
            if "must be from the same graph" not in str(error):
                raise
            raise ConfigError(
                "serve_fn used variables made in another graph (a Keras model holds those of the graph "
                "it was built in, training's): give the Keras model itself as serve_fn (the export "
                "copies it into its own graph), or build the model inside serve_fn"
            ) from error
    outputs = dict(built) if isinstance(built, Mapping) else {LONE_OUTPUT: built}
    for name, tensor in outputs.items():
        if not isinstance(tensor, tf.Tensor):
            raise ConfigError(
                f"serve_fn's output {name!r} is {type(tensor).__name__}, not a tensor: return a tensor "
                "or a dict name -> tensor"
            )
    needed = _ops_needed(list(outputs.values()))
    fed = {op for p in placeholders.values() for op in _placeholder_ops(p)}
    unfed = sorted(op.name for op in needed if op.type == "Placeholder" and op not in fed)
    if unfed:
        raise ConfigError(
            f"serve_fn's outputs need the placeholder {unfed[0]!r}, which is not one of the inputs: "
            "name it in inputs=, or make it a tf.compat.v1.placeholder_with_default"
        )
    variables = [v for v in v1.global_variables() if v.op in needed]
    ends = sorted(fed, key=lambda op: op.name) + [t.op for t in outputs.values()]
    return Serving(placeholders, outputs, variables, _ServingSaver(variables, ends))


def _placeholder_ops(placeholder) -> list[tf.Operation]:
    if isinstance(placeholder, tf.SparseTensor):
        return [placeholder.indices.op, placeholder.values.op, placeholder.dense_shape.op]
    return [placeholder.op]


def _ops_needed(outputs: list[tf.Tensor]) -> set[tf.Operation]:
    """Every op that computing `outputs` runs (data and control inputs, transitively)."""
    seen, stack = set(), [t.op for t in outputs]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def check_checkpoint(path: str, variables: list[tf.Variable]) -> None:
    """Refuse, in one line, a checkpoint that does not match what serving reads.

    Each serving variable must be in the checkpoint in its shape (whatever
    the layout it was saved in), and each variable training trained (the
    checkpoint's meta graph lists them) must be read by serving.
    """
    fix = "build it as training built it (the same variable names and shapes)"
    problem = trainer.checkpoint_mismatch(path, variables)
    if problem is not None:
        raise MismatchError(f"the checkpoint {path} {problem}, which the serving model reads: {fix}")
    served = set(tf_internals.checkpoint_keys(variables))
    for name in trained_variables(path):
        if name not in served:
            raise MismatchError(
                f"the serving model does not read {name!r}, which training trained (in {path}): {fix}, "
                "and return the outputs that use it"
            )


def trained_variables(path: str) -> list[str]:
    """The checkpoint keys of the variables training trained, from the checkpoint's meta graph.

    Empty when the checkpoint has no `.meta` file (a Saver told not to write one).
    """
    if not tf.io.gfile.exists(path + ".meta"):
        return []
    meta = v1.MetaGraphDef()
    with tf.io.gfile.GFile(path + ".meta", "rb") as f:
        meta.ParseFromString(f.read())
    names = []
    for serialized in meta.collection_def[v1.GraphKeys.TRAINABLE_VARIABLES].bytes_list.value:
        variable = tf_internals.VariableDef.FromString(serialized)
        full = variable.save_slice_info_def.full_name  # a part of a split variable: the whole one's key
        names.append(full or variable.variable_name.rsplit(":", 1)[0])
    return sorted(set(names))


def restore(serving: Serving, session: v1.Session, path: str) -> None:
    """Restore the serving variables from `path`; a TF error (a missing or corrupt file) as one line."""
    try:
        serving.saver.restore(session, path)
    except (tf.errors.OpError, ValueError) as e:
        first = str(getattr(e, "message", e)).strip().splitlines()[0]
        raise ConfigError(f"cannot read the checkpoint {path}: {first}") from None


class _ServingSaver(v1.train.Saver):
    """A Saver of the serving variables whose meta graph holds only what the signature needs.

    The graph may hold more (the evaluator's metrics and input pipeline, ops
    `serve_fn` built and did not return): the exported graph is pruned to
    the signature's inputs and the ops that its outputs, this saver and the variables' initializers
    reach, and the variable collections to the serving variables.
    """

    def __init__(self, variables: list[tf.Variable], ends: list[tf.Operation]):
        super().__init__(variables, sharded=True, allow_empty=True)
        self._variables, self._ends = variables, ends  # the signature's inputs and outputs

    def export_meta_graph(self, *args, **kwargs):
        meta = super().export_meta_graph(*args, **kwargs)
        collections = meta.collection_def
        served = {v.name for v in self._variables}
        kept = {}
        for key in (v1.GraphKeys.GLOBAL_VARIABLES, v1.GraphKeys.TRAINABLE_VARIABLES):
            defs = [tf_internals.VariableDef.FromString(b) for b in collections[key].bytes_list.value]
            kept[key] = [d for d in defs if d.variable_name in served]
        ops = {op.name for op in self._ends}
        ops |= {self.saver_def.restore_op_name, self.saver_def.save_tensor_name.split(":")[0]}
        for d in kept[v1.GraphKeys.GLOBAL_VARIABLES]:  # the ops a loader rebuilds each variable from
            names = (d.variable_name, d.initializer_name, d.snapshot_name, d.initial_value_name)
            ops |= {n.split(":")[0] for n in names if n}
        meta.graph_def.CopyFrom(v1.graph_util.extract_sub_graph(meta.graph_def, sorted(ops)))
        for key in list(collections):
            del collections[key]
        for key, defs in kept.items():
            collections[key].bytes_list.value.extend(d.SerializeToString() for d in defs)
        return meta


def write_version(session: v1.Session, serving: Serving, export_dir: str, version: int) -> str:
    """Write the serving graph with `session`'s variable values as `<export_dir>/<version>`; return it.

    Written to a hidden directory in `export_dir` (TF Serving reads only
    directories named by a number) and renamed into place; removed if
    anything fails.
    """
    if version < 0:
        raise ConfigError(f"version must be a number >= 0, got {version}")
    final = os.path.join(export_dir, str(int(version)))
    if tf.io.gfile.exists(final):
        raise ConfigError(f"{final} exists already: remove it, or export another checkpoint or version")
    partial = os.path.join(export_dir, f".partial-{version}-{os.getpid()}")
    created = not tf.io.gfile.exists(export_dir)
    try:
        builder = v1.saved_model.Builder(partial)
        signature = v1.saved_model.predict_signature_def(serving.inputs, serving.outputs)
        builder.add_meta_graph_and_variables(
            session,
            [v1.saved_model.tag_constants.SERVING],
            signature_def_map={SIGNATURE: signature},
            clear_devices=True,
            strip_default_attrs=True,
            saver=serving.saver,
        )
        builder.save()
        tf.io.gfile.rename(partial, final)
    except BaseException as e:
        if tf.io.gfile.exists(partial):
            tf.io.gfile.rmtree(partial)
        if created and tf.io.gfile.exists(export_dir) and not tf.io.gfile.listdir(export_dir):
            tf.io.gfile.rmtree(export_dir)
        if isinstance(e, tf.errors.OpError | OSError):  # a full disk, a lost mount: one line
            first = str(getattr(e, "message", None) or e).strip().splitlines()[0]
            raise DisttrainError(f"could not write {final} ({first}); nothing of it was left") from None
        raise
    return final


def versions(export_dir: str) -> list[int]:
    """The version numbers in `export_dir`, oldest first (directories named by a number)."""
    if not tf.io.gfile.isdir(export_dir):
        return []
    return sorted(int(n.rstrip("/")) for n in tf.io.gfile.listdir(export_dir) if n.rstrip("/").isdigit())


def keep_newest(export_dir: str, keep: int | None) -> None:
    """Delete all but the `keep` newest versions in `export_dir` (None: keep every one)."""
    if keep is None:
        return
    for version in versions(export_dir)[:-keep]:
        tf.io.gfile.rmtree(os.path.join(export_dir, str(version)))
