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
    (dict(loss="triplet"), "loss must be one of auto, mnrl, cosent, cosine, margin-mse, got 'triplet'"),
    (dict(sparse="bm25"), "sparse must be one of splade, got 'bm25'"),
    (dict(query_regularizer=-1.0), "query_regularizer must be a number >= 0, got -1.0"),
    (dict(document_regularizer="x"), "document_regularizer must be a number >= 0, got 'x'"),
    (dict(prompts=["query"]), "--prompts takes NAME=TEXT (e.g. query='query: '), got 'query'"),
    (dict(prompts=["query=a", "query=b"]), "--prompts names 'query' twice"),
    (dict(pooling="median"), "pooling must be one of mean, cls, max, mean-sqrt-len, weighted-mean, last-token, got 'median'"),
    (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
    (dict(mini_batch_size=True), "mini_batch_size must be an integer >= 1, got True"),
    (dict(max_length=2), "max_length must be an integer >= 3"),
    (dict(scale=0.0), "scale must be a positive number"),
    (dict(score_max=-5.0), "score_max must be a positive number"),
    (dict(lr=2.0), "lr must be a number in (0, 1)"),
    (dict(matryoshka_dims="8,x"), "--matryoshka-dims must be integers"),
], ids=["out", "loss", "sparse", "query_regularizer", "document_regularizer", "prompts", "prompts_twice", "pooling",
        "batch_size", "mini_batch_size", "max_length", "scale", "score_max", "lr", "matryoshka_dims"])
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


def test_prompts_scale_and_their_defaults():
    assert EmbeddingsConfig(**PATHS).prompt_map() == {}
    given = EmbeddingsConfig(**PATHS, prompts=["query=query: ", "document=passage: a=b"])
    assert given.prompt_map() == {"query": "query: ", "document": "passage: a=b"}  # the first = splits
    assert EmbeddingsConfig(**PATHS, prompts={"anchor": "q: "}).prompt_map() == {"anchor": "q: "}  # the Python API
    assert EmbeddingsConfig(**PATHS).scale_value("mnrl") == 20.0  # cosine's
    assert EmbeddingsConfig(**PATHS, sparse="splade").scale_value("mnrl") == 1.0  # SparseMNRL's, on dot products
    assert EmbeddingsConfig(**PATHS, sparse="splade").scale_value("cosent") == 20.0
    assert EmbeddingsConfig(**PATHS, sparse="splade", scale=5.0).scale_value("mnrl") == 5.0
