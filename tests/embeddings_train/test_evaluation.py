"""Tests of `bertforge.embeddings_train.evaluation`: the dev set's retrieval metrics against sentence-transformers'
evaluator, a BEIR folder as the dev set, and scored pairs."""

from __future__ import annotations

import pytest
import torch

import bertforge
from bertforge.embeddings_train.data import read_pairs
from bertforge.embeddings_train.evaluation import dev_evaluator, main_metric, read_dev, retrieval_set
from bertforge.evaluation.data import RetrievalData
from tests.evaluation.evaluation_helpers import write_beir, write_sts

st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers: pip install -e '.[test]'")


def embedder(model_dir):
    embed = bertforge.pipeline("embed", model=model_dir)
    return lambda texts: torch.from_numpy(embed(texts))


def test_retrieval_metrics_equal_sentence_transformers_evaluator(trained, toy):
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    data = read_pairs(toy[1])
    lookup = retrieval_set(data)
    assert lookup.corpus_ids == sorted(lookup.corpus_ids)  # positions as ids: the evaluator's tie order
    evaluator = InformationRetrievalEvaluator(
        queries=dict(zip(lookup.query_ids, lookup.queries)), corpus=dict(zip(lookup.corpus_ids, lookup.corpus)),
        relevant_docs=dict(zip(lookup.query_ids, lookup.relevant)), mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1],
        precision_recall_at_k=[1, 10, 100], map_at_k=[100], name="dev")
    expected = evaluator(st.SentenceTransformer(str(trained), device="cpu"))
    ours = dev_evaluator(data, embedder(trained))()
    assert main_metric(data) == "mrr@10" and "queries" not in ours
    for name, value in ours.items():
        assert abs(value - expected[f"dev_cosine_{name}"]) < 1e-6, name


def test_a_beir_folder_and_scored_pairs_as_the_dev_set(trained, tmp_path):
    folder = write_beir(tmp_path / "beir", documents=20, queries=5)
    beir = read_dev(folder)
    assert isinstance(beir, RetrievalData) and main_metric(beir) == "ndcg@10"
    assert 0 <= dev_evaluator(beir, embedder(trained))()["ndcg@10"] <= 1
    write_sts(tmp_path / "sts.csv", 10)
    scored = read_dev(tmp_path / "sts.csv")
    assert main_metric(scored) == "spearman"
    assert set(dev_evaluator(scored, embedder(trained))()) == {"spearman", "pearson"}
