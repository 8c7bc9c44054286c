"""Tests of `bertforge.embeddings_train.evaluation`: retrieval metrics against sentence-transformers' evaluator."""

from __future__ import annotations

import pytest
import torch

import bertforge
from bertforge.embeddings_train.data import read_pairs
from bertforge.embeddings_train.evaluation import retrieval_metrics, retrieval_task

st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers: pip install -e '.[test]'")


def test_retrieval_metrics_equal_sentence_transformers_evaluator(trained, toy):
    data = read_pairs(toy[1])
    task = retrieval_task(data)
    model = st.SentenceTransformer(str(trained), device="cpu")
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    evaluator = InformationRetrievalEvaluator(
        queries={str(i): q for i, q in enumerate(task.queries)}, corpus={str(i): c for i, c in enumerate(task.corpus)},
        relevant_docs={str(i): {str(d) for d in rel} for i, rel in enumerate(task.relevant)},
        mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1], precision_recall_at_k=[1, 5, 10], map_at_k=[10], name="dev")
    expected = evaluator(model)
    embed = bertforge.pipeline("embed", model=trained)
    ours = retrieval_metrics(torch.from_numpy(embed(task.queries)), torch.from_numpy(embed(task.corpus)), task.relevant)
    for name, value in ours.items():
        assert abs(value - expected[f"dev_cosine_{name}"]) < 1e-6, name
