"""The TF 2 peers' accuracy mode: a task's data, its input pipeline, the chief's held-out curve.

The time-to-accuracy tool (disttrain/bench/accuracy.py) runs tf2_pss.py and
tf2_mwms.py with a spec that has a `heldout` section; this module is what
both peers then share. As everything under peers/, it never imports disttrain
(see tf2_common.py): the tool writes the task's data (its training and
held-out split, one definition, made by the tool) to an .npz file and the
spec says where. The tool imports this module too (for `Curve`), so nothing
here may need eager mode at import.

Measured as the tool's HeldOutHook measures disttrain's systems: the chief
(MWMS's worker 0, PSS's coordinator) evaluates the whole held-out set, 500
images at a time, with the live variables, every `eval_every_steps` global
steps and at the end; the clock starts when the first step ends and stops
during evaluations; each evaluation is one JSON line of global step,
examples, seconds, accuracy and the wall time the first step ended.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

EVAL_BATCH = 500  # held-out images per evaluation batch, as HeldOutHook


def load_task(spec: dict) -> dict[str, np.ndarray]:
    """The task's arrays: train_x, train_y, held_x, held_y."""
    with np.load(spec["heldout"]["data_path"]) as data:
        return {name: data[name] for name in ("train_x", "train_y", "held_x", "held_y")}


def train_dataset(spec: dict, data: dict, pipeline, pipelines: int) -> tf.data.Dataset:
    """One input pipeline's batches, as the tool's `loss_fn` builds them for disttrain.

    Every `pipelines`-th training example from `pipeline`, shuffled over the
    whole set with seed `pipeline` (under the global seed the tool passes),
    repeated, in batches of the per-replica batch size. `pipeline` may be an
    int64 tensor (PSS: the worker's index, known on the worker only): then the
    seed is 0 for every pipeline (TF's seeding cannot take a tensor under a
    global seed), each shuffling its own examples.
    """
    x, y = data["train_x"], data["train_y"]
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shard(pipelines, pipeline)
    seed = pipeline if isinstance(pipeline, int) else 0
    dataset = dataset.shuffle(len(y), seed=seed, reshuffle_each_iteration=True)
    return dataset.repeat().batch(spec["batch_size"], drop_remainder=True)


def chunks(total: int, every: int, per_function: int) -> list[tuple[int, bool]]:
    """(steps, evaluate after them) for a run of `total` global steps.

    The first step alone (its end starts the clock), then functions of at
    most `per_function` steps that end at every multiple of `every` and at
    `total`, where the chief evaluates.
    """
    done, out = 0, []
    while done < total:
        n = 1 if done == 0 else min(per_function, every - done % every, total - done)
        done += n
        out.append((n, done % every == 0 or done == total))
    return out


class Curve:
    """The chief's held-out curve: a clock that excludes evaluations, one JSON line per evaluation.

    Pure Python: the tool's HeldOutHook (disttrain's systems, graph mode)
    keeps its curve with this class too, so both write the same rows.
    """

    def __init__(self, path: str, examples_per_step: int, x: np.ndarray, y: np.ndarray):
        self.path, self.per_step, self.x, self.y = path, examples_per_step, x, y
        self.t0 = self.first_wall = None
        self.eval_secs, self.last, self.start_step = 0.0, -1, 0

    def start(self, step: int = 1) -> None:
        """The first call (the first steps have ended, the global step is `step`) starts the clock."""
        if self.t0 is None:
            self.t0, self.first_wall, self.start_step = time.perf_counter(), time.time(), step

    def evaluate(self, step: int, correct: Callable[[np.ndarray, np.ndarray], int]) -> None:
        """One row at global step `step`; `correct(x, y)`: how many of a held-out batch the model gets."""
        if step == self.last:
            return
        began = time.perf_counter()
        seconds = began - self.t0 - self.eval_secs  # training time only
        right = sum(
            int(correct(self.x[i : i + EVAL_BATCH], self.y[i : i + EVAL_BATCH]))
            for i in range(0, len(self.y), EVAL_BATCH)
        )
        self.eval_secs += time.perf_counter() - began
        row = {
            "global_step": step,
            "examples": step * self.per_step,
            "seconds": seconds,
            "accuracy": right / len(self.y),
            "first_step_wall": self.first_wall,
            "start_examples": self.start_step * self.per_step,  # trained before the clock started
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        self.last = step


def peer_curve(spec: dict, data: dict) -> Curve:
    """The spec's curve of the task's held-out set."""
    h = spec["heldout"]
    return Curve(h["path"], h["examples_per_step"], data["held_x"], data["held_y"])


def correct_fn(model):
    """`correct(x, y)` for Curve.evaluate: a tf.function of the peer's model (its live variables)."""

    @tf.function
    def correct(x, y):
        predicted = tf.argmax(model.logits(x), -1, output_type=tf.int32)
        return tf.reduce_sum(tf.cast(tf.equal(predicted, y), tf.int32))

    return correct
