"""Tests of `bertforge.embeddings_train.evaluation`: retrieval metrics against sentence-transformers' evaluator."""

from __future__ import annotations

import pytest
import torch

import bertforge
from bertforge.embeddings_train.data import read_pairs
from bertforge.embeddings_train.evaluation import retrieval_metrics, retrieval_set

st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers: pip install -e '.[test]'")


def test_retrieval_metrics_equal_sentence_transformers_evaluator(trained, toy):
    data = read_pairs(toy[1])
    lookup = retrieval_set(data)
    model = st.SentenceTransformer(str(trained), device="cpu")
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    evaluator = InformationRetrievalEvaluator(
        queries={str(i): q for i, q in enumerate(lookup.queries)}, corpus={str(i): c for i, c in enumerate(lookup.corpus)},
        relevant_docs={str(i): {str(d) for d in rel} for i, rel in enumerate(lookup.relevant)},
        mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1], precision_recall_at_k=[1, 5, 10], map_at_k=[10], name="dev")
    expected = evaluator(model)
    embed = bertforge.pipeline("embed", model=trained)
    ours = retrieval_metrics(torch.from_numpy(embed(lookup.queries)), torch.from_numpy(embed(lookup.corpus)), lookup.relevant)
    for name, value in ours.items():
        assert abs(value - expected[f"dev_cosine_{name}"]) < 1e-6, name
