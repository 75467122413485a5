"""The evaluator role in-process, beside a local run that writes its checkpoints."""

import dataclasses
import os
import threading
import time

import gin
import tensorflow as tf

from disttrain.base.cluster import EVALUATOR, Cluster
from disttrain.edges import cli, zoo_run
from tests import REPO
from tests.cluster.helpers import scalars

EVALUATOR_TASK = Cluster(jobs={"worker": ["localhost:1"]}, task_type=EVALUATOR, task_index=0)


def tiny_config(steps: int):
    gin.clear_config()
    return cli.train_config(
        [os.path.join(REPO, "gin", "mlp_async.gin"), os.path.join(REPO, "gin", "testing", "tiny.gin")],
        [f"TrainConfig.train_steps={steps}", "TrainConfig.eval_steps=3"],
    )


def train(steps: int, logdir: str) -> None:
    with tf.Graph().as_default():  # a task process builds one graph; here each run gets its own
        assert zoo_run.run(Cluster.local(), tiny_config(steps), logdir) == 0


def test_each_checkpoint_is_evaluated_on_the_same_held_out_batches(tmp_path, capsys):
    logdir = str(tmp_path)
    calls, consumed = [], []

    def held_out(model, batch_size, replica_index, num_replicas):
        """Batch i is a pure function of i; which ones the evaluator reads is recorded."""
        calls.append((batch_size, replica_index, num_replicas))

        def batch(i):
            record = tf.py_function(lambda i: consumed.append(int(i)) or i, [i], tf.int64)
            shape = (batch_size, *model.input_shape)
            features = tf.random.stateless_uniform(shape, seed=tf.stack([record, 1]))
            labels = tf.random.stateless_uniform(
                (batch_size,), [i, 2], maxval=model.num_classes, dtype=tf.int32
            )
            return features, labels

        return tf.data.Dataset.range(1000).map(batch)

    final = dataclasses.replace(tiny_config(4), eval_input_fn=held_out)
    evaluator = threading.Thread(target=zoo_run.run, args=(EVALUATOR_TASK, final, logdir))
    evaluator.start()
    train(2, logdir)  # a checkpoint at step 2
    # Wait until the evaluator has measured it: once step 4's is written it takes the newest only.
    # (Waiting for three batches read was not enough: its evaluation of step 0, which the chief
    # saves as its session starts, could read them, and step 2 was then never measured.)
    out, deadline = "", time.monotonic() + 60
    while "evaluator: step 2 " not in out and time.monotonic() < deadline:
        time.sleep(0.1)
        out += capsys.readouterr().out
    train(4, logdir)  # and one at step 4
    evaluator.join(timeout=120)
    assert not evaluator.is_alive()
    # The chief also saves at step 0 when its session starts: the evaluator may find that one first.
    evaluated = [step for step, _ in scalars(os.path.join(logdir, "eval"), "eval/loss")]
    assert evaluated in ([2, 4], [0, 2, 4]), evaluated
    assert calls == [(final.batch_size, 0, 1)]  # the whole eval input, not a replica's share
    # The same first eval_steps batches for each checkpoint (tf.data may read a few ahead).
    starts = [k for k, i in enumerate(consumed) if i == 0]
    assert len(starts) == len(evaluated), consumed
    assert all(consumed[k : k + 3] == [0, 1, 2] for k in starts), consumed
    out += capsys.readouterr().out
    assert "evaluator: step 4 " in out, out  # the console is read, so the next line can fail
    assert "eval_input_fn is not set" not in out


def test_without_eval_input_fn_the_evaluator_says_it_measures_training_data(tmp_path, capsys):
    train(2, str(tmp_path))
    config = tiny_config(2)
    capsys.readouterr()
    assert zoo_run.run(EVALUATOR_TASK, config, str(tmp_path)) == 0
    for name in ("eval/loss", "eval/accuracy"):  # the zoo evaluator's two (docs/cluster.md)
        assert [step for step, _ in scalars(os.path.join(str(tmp_path), "eval"), name)] == [2], name
    [said] = [
        line for line in capsys.readouterr().out.splitlines() if "evaluates on the training input" in line
    ]
    assert "WARNING" in said
