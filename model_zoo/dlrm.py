"""DLRM (Naumov et al. 2019): a click model of embedding tables, two MLPs and dot-product interactions.

Default: 13 dense features and 26 categorical ones with Criteo Kaggle's
vocabularies, each capped at 140,000 rows (as DLRM's --max-ind-range caps
them by hashing ids modulo the cap): 1,120,543 rows of 64 float32, 286.9 MB
of tables (71,714,752 parameters) against 499,521 dense parameters (2.0 MB)
in the MLPs, 72,214,273 parameters and 288.9 MB in all. A step reads only
the rows its batch looks up, so the tables' bytes on the wire follow the
batch's distinct ids, not the tables' size.

Features are (dense float32 [B, num_dense], ids int64 [B, num_categorical]);
labels are 0/1; the logit has shape [B].
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from model_zoo import layers
from model_zoo.base import Features, Model
from model_zoo.registry import register

v1 = tf.compat.v1

# Criteo Kaggle's (Display Advertising Challenge) cardinalities, capped at 140,000.
_CRITEO_KAGGLE = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194)
_CRITEO_KAGGLE += (27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
VOCAB_SIZES = tuple(min(n, 140_000) for n in _CRITEO_KAGGLE)

SCOPE = "dlrm"


@register("dlrm")
class DLRM(Model):
    """Bottom MLP on the dense features, one table per categorical feature, top MLP on their interactions.

    The bottom MLP's output and the categorical features' embeddings (all
    `embedding_dim` wide) interact by pairwise dot products (each pair once,
    no self-products); the top MLP reads the products and the bottom output
    and ends in one logit. Every layer is ReLU but the logit.
    """

    def __init__(
        self,
        num_dense: int = 13,
        vocab_sizes: Sequence[int] = VOCAB_SIZES,
        embedding_dim: int = 64,
        bottom_mlp: Sequence[int] = (512, 256, 64),
        top_mlp: Sequence[int] = (512, 256),
    ):
        self.num_dense = num_dense
        self.vocab_sizes = tuple(int(n) for n in vocab_sizes)
        self.embedding_dim = embedding_dim
        self.bottom_mlp = tuple(bottom_mlp)
        self.top_mlp = tuple(top_mlp)
        if num_dense < 1:
            raise ValueError(f"dlrm: num_dense must be >= 1, got {num_dense}")
        if not self.vocab_sizes or min(self.vocab_sizes) < 1:
            raise ValueError(f"dlrm: vocab_sizes must be one size >= 1 per feature, got {self.vocab_sizes}")
        if not self.bottom_mlp or self.bottom_mlp[-1] != embedding_dim:
            raise ValueError(
                f"dlrm: bottom_mlp={self.bottom_mlp} must end in embedding_dim={embedding_dim}: "
                "its output is dotted with the embeddings"
            )

    @property
    def num_categorical(self) -> int:
        return len(self.vocab_sizes)

    def table_name(self, column: int) -> str:
        """The variable op name of categorical column `column`'s table, as built at top level."""
        return f"{SCOPE}/{_embedding_scope(column)}/table"

    def __call__(self, features: Features, training: bool) -> tf.Tensor:
        del training  # no dropout, no batch norm
        dense, ids = features
        with v1.variable_scope(SCOPE):
            x = dense
            with v1.variable_scope("bottom"):
                for i, units in enumerate(self.bottom_mlp):
                    x = layers.dense(x, units, name=f"fc{i + 1}", activation=tf.nn.relu)
            vectors = [x] + [
                layers.embedding(ids[:, c], vocab, self.embedding_dim, name=_embedding_scope(c))
                for c, vocab in enumerate(self.vocab_sizes)
            ]
            x = tf.concat([x, _interactions(tf.stack(vectors, axis=1))], axis=1)
            with v1.variable_scope("top"):
                for i, units in enumerate(self.top_mlp):
                    x = layers.dense(x, units, name=f"fc{i + 1}", activation=tf.nn.relu)
                logit = layers.dense(x, 1, name="logit")
        return tf.squeeze(logit, axis=1)

    def loss(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Mean sigmoid cross-entropy; labels 0/1."""
        labels = tf.cast(labels, logits.dtype)
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))

    def accuracy(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Fraction of the batch where sigmoid(logit) > 0.5 says the label."""
        predictions = tf.cast(logits > 0, tf.int64)
        return tf.reduce_mean(tf.cast(tf.equal(predictions, tf.cast(labels, tf.int64)), tf.float32))

    def lookups(self, features: Features) -> dict[str, tf.Tensor]:
        _, ids = features
        return {self.table_name(c): ids[:, c] for c in range(self.num_categorical)}

    def build_variables(self) -> None:
        dense = tf.zeros([1, self.num_dense], tf.float32)
        ids = tf.zeros([1, self.num_categorical], tf.int64)
        self((dense, ids), training=True)

    def serving_inputs(self) -> dict[str, tf.TensorSpec]:
        """A batch of any size: dense features (float32) and categorical ids (int64)."""
        return {
            "dense": tf.TensorSpec([None, self.num_dense], tf.float32),
            "ids": tf.TensorSpec([None, self.num_categorical], tf.int64),
        }

    def serve(self, inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """The click logit and its probability, per example."""
        logits = self((inputs["dense"], inputs["ids"]), training=False)
        return {"logits": logits, "probabilities": tf.sigmoid(logits)}


def _embedding_scope(column: int) -> str:
    return f"embedding_{column}"


def _interactions(vectors: tf.Tensor) -> tf.Tensor:
    """[B, F, D] -> [B, F(F-1)/2]: the dot product of every pair i < j (DLRM's strict triangle)."""
    count = int(vectors.shape[1])
    products = tf.matmul(vectors, vectors, transpose_b=True)  # [B, F, F]
    pairs = [i * count + j for i in range(count) for j in range(i + 1, count)]
    return tf.gather(tf.reshape(products, [-1, count * count]), pairs, axis=1)
