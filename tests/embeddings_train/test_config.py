"""Tests of `bertforge.embeddings_train.config`: `EmbeddingsConfig`'s Matryoshka dimensions and its checks."""

from __future__ import annotations

import pytest

from bertforge.embeddings_train import EmbeddingsConfig
from bertforge.core.errors import BertforgeError

PATHS = dict(model="model_dir", train="pairs.tsv", out="out_dir")


def test_matryoshka_dims_are_read_largest_first():
    assert EmbeddingsConfig(**PATHS).dims() == []
    assert EmbeddingsConfig(**PATHS, matryoshka_dims="64, 256,128,").dims() == [256, 128, 64]
    for bad, message in [("32,x", "must be integers separated by commas, got '32,x'"),
                         ("32,32", "must be distinct positive integers"), ("0", "must be distinct positive integers"),
                         (",", "must be distinct positive integers")]:
        with pytest.raises(BertforgeError, match=message):
            EmbeddingsConfig(**PATHS, matryoshka_dims=bad).dims()


@pytest.mark.parametrize("settings, message", [
    (dict(out=""), "train-embeddings needs 'out'"),
    (dict(loss="triplet"), "loss must be one of auto, mnrl, cosent, cosine, got 'triplet'"),
    (dict(pooling="median"), "pooling must be one of mean, cls, max, mean-sqrt-len, weighted-mean, last-token, got 'median'"),
    (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
    (dict(mini_batch_size=True), "mini_batch_size must be an integer >= 1, got True"),
    (dict(max_length=2), "max_length must be an integer >= 3"),
    (dict(scale=0.0), "scale must be a positive number"),
    (dict(score_max=-5.0), "score_max must be a positive number"),
    (dict(lr=2.0), "lr must be a number in (0, 1)"),
    (dict(matryoshka_dims="8,x"), "--matryoshka-dims must be integers"),
], ids=["out", "loss", "pooling", "batch_size", "mini_batch_size", "max_length", "scale", "score_max", "lr",
        "matryoshka_dims"])
def test_validate_names_the_bad_setting(settings, message):
    EmbeddingsConfig(**PATHS).validate()  # the defaults pass
    with pytest.raises(BertforgeError) as error:
        EmbeddingsConfig(**{**PATHS, **settings}).validate()
    assert message in str(error.value)


def test_to_dict_round_trips():
    config = EmbeddingsConfig(**PATHS, loss="cosent", matryoshka_dims="32,16", mini_batch_size=8, pooling="cls")
    saved = config.to_dict()
    assert saved["loss"] == "cosent" and saved["mini_batch_size"] == 8 and saved["dev"] is None
    assert EmbeddingsConfig(**saved) == config
