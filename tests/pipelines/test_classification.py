"""Tests of `bertforge.pipelines.classification`: text and token classification against transformers' pipelines."""

from __future__ import annotations

import numpy as np
import pytest

import bertforge
from bertforge import BertforgeError
from tests.pipelines.pipelines_helpers import SENTENCES

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[test]'")


def test_text_classification_equals_transformers(heads):
    ours = bertforge.pipeline("text-classification", model=heads["tc"])
    ref = transformers.pipeline("text-classification", model=str(heads["tc"]), device="cpu")
    for text in SENTENCES:
        (theirs,) = ref(text)
        mine = ours(text)
        assert mine["label"] == theirs["label"] and abs(mine["score"] - theirs["score"]) < 1e-4
    pair = ours(("The cat sat.", "It was tired."))
    theirs = ref({"text": "The cat sat.", "text_pair": "It was tired."})
    assert pair["label"] == theirs["label"] and abs(pair["score"] - theirs["score"]) < 1e-4
    batch = ours([SENTENCES[0], {"text": "The cat sat.", "text_pair": "It was tired."}, SENTENCES[1]])
    for got, alone in ((batch[1], pair), (batch[0], ours(SENTENCES[0]))):
        assert got["label"] == alone["label"] and abs(got["score"] - alone["score"]) < 1e-6
    everything = bertforge.pipeline("text-classification", model=heads["tc"], top_k=None)(SENTENCES[0])
    reference = ref(SENTENCES[0], top_k=None)
    assert [r["label"] for r in everything] == [r["label"] for r in reference]
    assert np.allclose([r["score"] for r in everything], [r["score"] for r in reference], atol=1e-4)


def test_a_multi_label_model_scores_by_sigmoid_as_transformers_and_keeps_labels_over_a_threshold(heads, tmp_path):
    import json
    import shutil

    model = shutil.copytree(heads["tc"], tmp_path / "multi")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "problem_type": "multi_label_classification"}))
    ref = transformers.pipeline("text-classification", model=str(model), device="cpu")
    for text in SENTENCES[:3]:
        reference = {r["label"]: r["score"] for r in ref(text, top_k=None)}
        everything = bertforge.pipeline("text-classification", model=model, top_k=None)(text)
        assert {r["label"]: r["score"] for r in everything} == pytest.approx(reference, abs=1e-4)
        ordered = sorted(reference.values())
        threshold = (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2  # about half the labels pass
        kept = bertforge.pipeline("text-classification", model=model, threshold=threshold)(text)
        assert [r["label"] for r in kept] == [k for k, v in sorted(reference.items(), key=lambda kv: -kv[1])
                                              if v >= threshold]
        assert 0 < len(kept) < len(reference)
    with pytest.raises(BertforgeError, match="threshold must be a number or None"):
        bertforge.pipeline("text-classification", model=model, threshold="high")


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_token_classification_equals_transformers(heads, strategy):
    text = "John Smith lives in New York and works at Googleplex incorporated, ünïcode 中文 ☃ [UNK]."
    ours = bertforge.pipeline("token-classification", model=heads["ner"], aggregation_strategy=strategy)
    ref = transformers.pipeline("token-classification", model=str(heads["ner"]), aggregation_strategy=strategy,
                                device="cpu")
    mine, theirs = ours(text), ref(text)
    assert len(mine) == len(theirs) > 0
    for a, b in zip(mine, theirs):
        assert {k: v for k, v in a.items() if k != "score"} == {k: v for k, v in b.items() if k != "score"}
        assert abs(a["score"] - float(b["score"])) < 1e-4
        assert text[a["start"] : a["end"]].lower().replace(" ", "") != ""  # a real character span


def test_token_classification_batch_empty_and_long(heads, caplog):
    pipe = bertforge.pipeline("token-classification", model=heads["ner"], ignore_labels=[])
    results = pipe(["", "Paris", "word " * 700])
    assert results[0] == [] and results[1][0]["start"] == 0 and results[1][0]["end"] == 5
    assert "truncated" in caplog.text


def test_missing_heads_and_wrong_architectures(heads, minilm_dir):
    with pytest.raises(BertforgeError, match=r"no sequence-classification head \(classifier\.\*.*--task classification"):
        bertforge.pipeline("text-classification", model=minilm_dir)
    with pytest.raises(BertforgeError, match=r"no token-classification head.*--task ner"):
        bertforge.pipeline("ner", model=minilm_dir)
    with pytest.raises(BertforgeError, match=r"no question-answering head \(qa_outputs\.\*.*--task qa"):
        bertforge.pipeline("question-answering", model=minilm_dir)
    with pytest.raises(BertforgeError, match="is a BertForSequenceClassification checkpoint"):
        bertforge.pipeline("token-classification", model=heads["tc"])


def test_text_classification_call_time_options(heads):
    """top_k and function_to_apply at call time, as transformers takes them, for that call only."""
    tc = bertforge.pipeline("text-classification", model=heads["tc"])
    ref = transformers.pipeline("text-classification", model=str(heads["tc"]), device="cpu")
    text = SENTENCES[0]
    for options in (dict(top_k=None), dict(top_k=2, function_to_apply="sigmoid"), dict(function_to_apply="none")):
        mine = tc(text, **options)
        assert mine == bertforge.pipeline("text-classification", model=heads["tc"], **options)(text)
        theirs = ref(text, **options)
        theirs = theirs[0] if options.get("top_k", 1) == 1 else theirs
        mine, theirs = (mine, theirs) if isinstance(mine, list) else ([mine], [theirs])
        assert [r["label"] for r in mine] == [r["label"] for r in theirs]
        assert np.allclose([r["score"] for r in mine], [r["score"] for r in theirs], atol=1e-4)
    assert isinstance(tc(text), dict) and tc.function_to_apply == "softmax"  # later calls: the pipeline's own
    assert tc([text, "Hi!"], max_length=8) == bertforge.pipeline(
        "text-classification", model=heads["tc"], max_length=8)([text, "Hi!"])
    with pytest.raises(BertforgeError, match=r"text-classification: `padding` is not supported; .*no padding"):
        tc(text, padding=True)
    with pytest.raises(BertforgeError, match=r"unknown option `labels`; a call takes: .*top_k, function_to_apply"):
        tc(text, labels=["a"])


def test_token_classification_call_time_options(heads):
    ner = bertforge.pipeline("token-classification", model=heads["ner"])  # "first"
    ref = transformers.pipeline("token-classification", model=str(heads["ner"]), device="cpu")
    text = "John Smith lives in New York."
    for options in (dict(aggregation_strategy="average"), dict(aggregation_strategy="none", ignore_labels=[])):
        mine = ner(text, **options)
        assert mine == bertforge.pipeline("token-classification", model=heads["ner"], **options)(text)
        theirs = ref(text, **options)
        assert [{k: v for k, v in e.items() if k != "score"} for e in mine] == [
            {k: v for k, v in e.items() if k != "score"} for e in theirs]
    assert ner(text) == bertforge.pipeline("token-classification", model=heads["ner"])(text)
    assert ner.aggregation == "first" and ner.ignore_labels == {"O"}
    with pytest.raises(BertforgeError, match=r"`stride` is not supported; a text over max_length is cut"):
        ner(text, stride=16)
    with pytest.raises(BertforgeError, match=r"`is_split_into_words` is not supported; give each text as one string"):
        ner(text, is_split_into_words=True)
    with pytest.raises(BertforgeError, match="aggregation_strategy must be one of"):
        ner(text, aggregation_strategy="longest")
