"""Tests of `bertforge.embeddings_train.losses`: MNRL, CoSENT, cosine MSE and Matryoshka against sentence-transformers.

Everything runs on random embeddings or a tiny random BERT (2 layers, 32 wide)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertforge.embeddings_train.losses import make_loss
from bertforge.model.pooling import write_sentence_transformers_files
from bertforge.tokenizer import Tokenizer
from tests.embeddings_train.embeddings_train_helpers import DEV_TEMPLATES, make_model, pairs

st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers: pip install -e '.[test]'")


def _st_loss(name: str, **kwargs):
    losses = st.sentence_transformer.losses
    return getattr(losses, name)(model=None, **kwargs)


@pytest.mark.parametrize("columns", [2, 3, 4])
@pytest.mark.parametrize("symmetric", [False, True])
def test_mnrl_equals_sentence_transformers(columns, symmetric):
    torch.manual_seed(columns)
    emb = [torch.randn(8, 16, dtype=torch.float64) for _ in range(columns)]
    ours = make_loss("mnrl", scale=20.0, symmetric=symmetric)(emb, None)
    if symmetric:
        reference = _st_loss("MultipleNegativesRankingLoss", directions=("query_to_doc", "doc_to_query"),
                             partition_mode="per_direction")
    else:
        reference = _st_loss("MultipleNegativesRankingLoss")
    expected = reference.compute_loss_from_embeddings(emb, None)
    assert abs(ours.item() - expected.item()) < 1e-10


def test_scored_losses_equal_sentence_transformers():
    torch.manual_seed(0)
    a, b = torch.randn(12, 16, dtype=torch.float64), torch.randn(12, 16, dtype=torch.float64)
    labels = torch.tensor([0.0, 0.2, 0.2, 1.0, 0.6, 0.4, 0.8, 0.0, 1.0, 0.6, 0.1, 0.3], dtype=torch.float64)  # ties too
    for scale in (20.0, 7.0):
        ours = make_loss("cosent", scale=scale)([a, b], labels)
        expected = _st_loss("CoSENTLoss", scale=scale).compute_loss_from_embeddings([a, b], labels)
        assert abs(ours.item() - expected.item()) < 1e-9
    ours = make_loss("cosine")([a, b], labels)
    expected = _st_loss("CosineSimilarityLoss").compute_loss_from_embeddings([a, b], labels)
    assert abs(ours.item() - expected.item()) < 1e-7  # sentence-transformers casts the scores to float32


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory) -> Path:
    """The tiny model as a sentence-transformers directory (mean pooling, normalised)."""
    directory = make_model(tmp_path_factory.mktemp("st"))
    Tokenizer.from_pretrained(directory).save_pretrained(directory)
    write_sentence_transformers_files(directory, 32, "mean", True, 32)
    return directory


@pytest.mark.parametrize("loss", ["mnrl", "cosent"])
def test_matryoshka_equals_sentence_transformers(st_dir, loss):
    model = st.SentenceTransformer(str(st_dir), device="cpu").eval()
    dims = [32, 16, 8]
    texts = [[t for t, _ in pairs(DEV_TEMPLATES)[:8]], [t for _, t in pairs(DEV_TEMPLATES)[:8]]]
    labels = torch.linspace(0, 1, 8) if loss == "cosent" else None
    features = [model.tokenize(column) for column in texts]
    losses = st.sentence_transformer.losses
    inner = losses.CoSENTLoss(model) if loss == "cosent" else losses.MultipleNegativesRankingLoss(model)
    with torch.no_grad():
        expected = losses.MatryoshkaLoss(model, inner, matryoshka_dims=dims)(features, labels)
        embeddings = [model(dict(f))["sentence_embedding"] for f in features]
        ours = make_loss(loss, matryoshka_dims=dims)(embeddings, labels)
        single = make_loss(loss)([e[:, :16] for e in embeddings], labels)
    assert abs(ours.item() - expected.item()) < 1e-5
    assert ours.item() > single.item()  # the sum over three prefixes, not one
