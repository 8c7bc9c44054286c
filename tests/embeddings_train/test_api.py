"""Tests of `bertforge.embeddings_train.api`: a short run learns the toy task and writes a sentence-transformers model.

The run (the `trained` fixture) goes through `bertforge train-embeddings` with most training options set."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bertforge
from tests.embeddings_train.embeddings_train_helpers import DEV_TEMPLATES, pairs

st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers: pip install -e '.[test]'")


def test_training_raises_retrieval_mrr(trained):
    summary = json.loads((trained / "eval.json").read_text())
    before, best = summary["before"], summary["best"]["metrics"]
    assert summary["shape"] == "pairs" and summary["loss"] == "mnrl" and summary["main_metric"] == "mrr@10"
    assert before["mrr@10"] < 0.45 and best["mrr@10"] > before["mrr@10"] + 0.3, (before, best)
    assert set(best) == {"ndcg@10", "mrr@10", "map@100", "recall@1", "recall@10", "recall@100", "precision@1",
                         "precision@10"}
    rows = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {"type": "eval", "step": 0, "epoch": 0.0, **before}
    assert any(r["type"] == "train" and "loss" in r for r in rows)
    assert (trained / "training_curve.png").stat().st_size > 1000
    assert any((trained / "tensorboard").iterdir())
    saved = json.loads((trained / "train_embeddings_config.json").read_text())
    assert saved["max_length"] == 16 and saved["batch_size"] == 16


def test_sentence_transformers_loads_the_output_identically(trained):
    """...with the run's checkpoints/ (a directory holding config.json and weights) beside the model's files."""
    assert [p.name for p in (trained / "checkpoints").iterdir()] == ["step-24"]
    texts = [a for a, _ in pairs(DEV_TEMPLATES)] + ["the a3 and b4 is here now", "see"]
    model = st.SentenceTransformer(str(trained), device="cpu")
    reference = model.encode(texts, batch_size=5)
    ours = bertforge.pipeline("embed", model=trained)(texts)
    assert np.abs(reference - ours).max() <= 1e-5
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # the Normalize module is there
    assert model.max_seq_length == 16
    modules = json.loads((trained / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]


def test_the_output_has_a_model_card_with_the_run(trained):
    """README.md: the Hub's metadata for a sentence-transformers model, the recipe, and the best evaluation's
    metrics as eval.json states them (#33)."""
    card = (trained / "README.md").read_text(encoding="utf-8")
    summary = json.loads((trained / "eval.json").read_text())
    assert card.startswith("---\nlibrary_name: sentence-transformers\npipeline_tag: sentence-similarity\n")
    assert "`bertforge train-embeddings`" in card and '- loss: `"mnrl"`' in card
    assert f"| mrr@10 | {summary['best']['metrics']['mrr@10']:.4f} |" in card
