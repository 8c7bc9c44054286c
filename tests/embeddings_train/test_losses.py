"""Tests of `bertforge.embeddings_train.losses`: MNRL, CoSENT, cosine MSE and Matryoshka against sentence-transformers.

Everything runs on random embeddings or a tiny random BERT (2 layers, 32 wide)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertforge.embeddings_train.losses import Splade, flops, make_loss, regularizer_weight
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


def _sparse_columns(columns: int, batch: int = 8, vocab: int = 40) -> list[torch.Tensor]:
    """Random non-negative sparse-looking vectors (about half the entries 0), as SPLADE's are."""
    return [torch.relu(torch.randn(batch, vocab, dtype=torch.float64)) for _ in range(columns)]


@pytest.mark.parametrize("columns", [2, 3])
def test_sparse_mnrl_equals_sentence_transformers(columns):
    """On dot products with scale 1: SparseMultipleNegativesRankingLoss's defaults."""
    torch.manual_seed(columns)
    emb = _sparse_columns(columns)
    ours = make_loss("mnrl", scale=1.0, similarity="dot")(emb, None)
    reference = st.sparse_encoder.losses.SparseMultipleNegativesRankingLoss(model=None)
    assert abs(ours.item() - reference.compute_loss_from_embeddings(emb, None).item()) < 1e-10


def test_margin_mse_equals_sentence_transformers():
    torch.manual_seed(0)
    emb = _sparse_columns(3)
    margins = torch.randn(8, dtype=torch.float64) * 3
    ours = make_loss("margin-mse")(emb, margins)
    for reference in (st.sparse_encoder.losses.SparseMarginMSELoss(model=None),
                      st.sentence_transformer.losses.MarginMSELoss(model=None)):  # dense: the same, on dot products
        assert abs(ours.item() - reference.compute_loss_from_embeddings(emb, margins).item()) < 1e-10


@pytest.mark.parametrize("base", ["mnrl", "margin-mse"])
def test_splade_loss_equals_sentence_transformers(base, monkeypatch):
    """SpladeLoss's forward (the base loss plus the FLOPS regularizers of the queries and of every document
    column), its embeddings handed in where it would run the model; the non-zero counts as counted by hand."""
    from sentence_transformers.sparse_encoder.losses import splade as st_splade

    torch.manual_seed(1)
    emb = _sparse_columns(3)
    labels = torch.randn(8, dtype=torch.float64) if base == "margin-mse" else None
    monkeypatch.setattr(st_splade, "embed_columns", lambda model, features, **kw: emb)
    inner = (st.sparse_encoder.losses.SparseMarginMSELoss(model=None) if labels is not None
             else st.sparse_encoder.losses.SparseMultipleNegativesRankingLoss(model=None))
    reference = st.sparse_encoder.losses.SpladeLoss(model=None, loss=inner, document_regularizer_weight=3e-2,
                                                     query_regularizer_weight=5e-2)
    expected = sum(reference(None, labels).values())
    ours = Splade(make_loss(base, scale=1.0, similarity="dot"), query_weight=5e-2, document_weight=3e-2,
                  total_steps=3)
    ours.step = 3  # past the warm-up: the full weights
    assert abs(ours(emb, labels).item() - expected.item()) < 1e-10
    assert ours.nonzero["query_nonzero"].item() == pytest.approx((emb[0] != 0).sum().item() / 8)
    assert ours.nonzero["document_nonzero"].item() == pytest.approx((torch.cat(emb[1:]) != 0).sum().item() / 16)
    assert sum(ours.terms.values()).item() == pytest.approx(expected.item(), abs=1e-10)
    documents = torch.cat(emb[1:])
    assert flops(documents).item() == pytest.approx(
        st.sparse_encoder.losses.FlopsLoss(model=None).compute_loss_from_embeddings(documents).item(), abs=1e-12)


@pytest.mark.parametrize("total", [1, 2, 10, 31])
def test_regularizer_warmup_is_sentence_transformers_schedule(total):
    """SpladeRegularizerWeightSchedulerCallback (quadratic over the first third), step by step."""
    from types import SimpleNamespace

    from sentence_transformers.sparse_encoder.callbacks.splade_callbacks import SpladeRegularizerWeightSchedulerCallback

    inner = st.sparse_encoder.losses.SparseMultipleNegativesRankingLoss(model=None)
    loss = st.sparse_encoder.losses.SpladeLoss(model=None, loss=inner, document_regularizer_weight=3e-5,
                                                query_regularizer_weight=5e-5)
    callback = SpladeRegularizerWeightSchedulerCallback(loss)
    callback.on_train_begin(None, SimpleNamespace(max_steps=total), None)
    for step in range(total):
        callback.on_step_begin(None, SimpleNamespace(global_step=step), None)
        assert regularizer_weight(5e-5, step, total) == pytest.approx(loss.query_regularizer_weight, abs=1e-15)
        assert regularizer_weight(3e-5, step, total) == pytest.approx(loss.document_regularizer_weight, abs=1e-15)
