"""ModernBERT, DeBERTa-v3, MPNet, NomicBERT, GTE, EuroBERT, jina-embeddings-v3 and ELECTRA checkpoints through every downstream command: `evaluate`, `predict`, `glue`, `embed`,
`train-embeddings`, `serve` (in-process, one embed and one predict request), `fill-mask` and `attention`.

Each family's checkpoints are tiny random models built by `transformers` itself and saved with its
`save_pretrained`, with tokenizer files of the family's kind: ModernBERT (4 layers, a window of 4 tokens, shorter
than every input, and a global layer every third: layers 0 and 3) with byte-level BPE, DeBERTa-v3 (relative
attention with log buckets, c2p + p2c, shared keys) with a SentencePiece-style Unigram under DeBERTa's special
tokens. Wherever bertforge computes numbers, they are checked against `transformers` on the same files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.tokenizer import Tokenizer
from tests.finetune.conftest import NEGATIVE, NER_SENTENCES, POSITIVE, write_sentiment
from tests.finetune.test_glue import write_task

transformers = pytest.importorskip("transformers")

FAMILIES = ["modernbert", "deberta-v2", "mpnet", "nomic_bert", "gte", "eurobert", "jina_embeddings_v3", "electra"]
PREFIX = {"modernbert": "ModernBert", "deberta-v2": "DebertaV2", "mpnet": "MPNet", "nomic_bert": "NomicBert",
          "gte": "Gte", "eurobert": "EuroBert", "jina_embeddings_v3": "JinaEmbeddingsV3",
          "electra": "Electra"}
#: the tokenizer kind each family's checkpoints get here (DeBERTa's is transformers' own class, below)
KINDS = {"modernbert": "modernbert", "mpnet": "mpnet", "nomic_bert": "bert", "gte": "bert", "eurobert": "eurobert",
         "jina_embeddings_v3": "xlm-roberta", "electra": "bert"}
LABELS = {0: "neg", 1: "pos"}
#: Longer than ModernBERT's window of 4 tokens, so its local layers really cut.
TEXTS = ["john lives in paris and mary works at acme corp .", "a great film", "an awful plot of this film , not fun",
         "where does john live ?"]
WORDS = sorted({w for line in POSITIVE + NEGATIVE + TEXTS for w in line.split()}
               | {w for s in NER_SENTENCES for w, _ in s} | {"the", "is", "here", "now", "great", '"great"'})
SMALL = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64, max_position_embeddings=128, pad_token_id=0)


def _hf_config(family: str, vocab_size: int, **extra):
    if family == "modernbert":  # layer_types: global, sliding, sliding, global
        return transformers.ModernBertConfig(vocab_size=vocab_size, num_hidden_layers=4, local_attention=4,
                                             global_attn_every_n_layers=3, bos_token_id=1, eos_token_id=2,
                                             cls_token_id=1, sep_token_id=2, **SMALL, **extra)
    if family == "mpnet":  # positions after its tokenizer's padding id 1; the bias table of 32 buckets
        return transformers.MPNetConfig(vocab_size=vocab_size, num_hidden_layers=2, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0, **{**SMALL, "pad_token_id": 1}, **extra)
    if family == "nomic_bert":  # rotary θ 1,000, SwiGLU, no biases
        return transformers.NomicBertConfig(vocab_size=vocab_size, num_hidden_layers=2, **SMALL, **extra)
    if family == "gte":  # rotary, gated GELU, biases on attention and the feed-forward's output
        return transformers.GteConfig(vocab_size=vocab_size, num_hidden_layers=2, hidden_dropout_prob=0.0,
                                      type_vocab_size=2, **SMALL, **extra)
    if family == "eurobert":  # grouped-query attention (1 key/value head for 2), RMSNorm, late pooling
        return transformers.EuroBertConfig(vocab_size=vocab_size, num_hidden_layers=2, num_key_value_heads=1,
                                           bos_token_id=0, eos_token_id=1, mask_token_id=2,
                                           **{**SMALL, "pad_token_id": 1}, **extra)
    if family == "jina_embeddings_v3":  # XLM-R with rotary positions, its padding id 1
        return transformers.JinaEmbeddingsV3Config(vocab_size=vocab_size, num_hidden_layers=2, hidden_dropout_prob=0.0,
                                                   attention_probs_dropout_prob=0.0, **{**SMALL, "pad_token_id": 1},
                                                   **extra)
    if family == "electra":  # E 16 < H 32: embeddings projected after their norm
        return transformers.ElectraConfig(vocab_size=vocab_size, num_hidden_layers=2, embedding_size=16,
                                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **SMALL, **extra)
    return transformers.DebertaV2Config(vocab_size=vocab_size, num_hidden_layers=2, relative_attention=True,
                                        position_buckets=8, max_relative_positions=24, pos_att_type=["p2c", "c2p"],
                                        norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
                                        type_vocab_size=0, layer_norm_eps=1e-7, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0, **SMALL, **extra)


def _save_tokenizer(family: str, directory: Path) -> int:
    """The family's tokenizer files in `directory`; returns the vocabulary size."""
    if family in KINDS:
        lines = POSITIVE + NEGATIVE + TEXTS + [" ".join(w for w, _ in s) for s in NER_SENTENCES]
        tokenizer = Tokenizer.train(iter(lines * 20), vocab_size=300, kind=KINDS[family], show_progress=False)
        tokenizer.save_pretrained(directory)
        return tokenizer.vocab_size
    chars = sorted(set("".join(WORDS)) | set("abcdefghijklmnopqrstuvwxyz0123456789.,?!'\"-*()"))
    vocab = [("[PAD]", 0.0), ("[CLS]", 0.0), ("[SEP]", 0.0), ("[UNK]", 0.0), ("[MASK]", 0.0)]
    vocab += [("▁" + w, -3.0) for w in WORDS] + [("▁", -5.0)] + [(c, -8.0) for c in chars]
    tokenizer = transformers.DebertaV2Tokenizer(vocab=vocab, unk_id=3)  # DeBERTa-v3's normalizer, template, specials
    tokenizer.save_pretrained(directory)
    return len(vocab)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory) -> dict:
    """The family's name, and its checkpoints saved by `transformers`: "mlm" (ForMaskedLM), "classify" (sequence
    classification, neg/pos), "ner" (token classification, the CoNLL tags)."""
    name = request.param
    prefix = PREFIX[name]
    root = tmp_path_factory.mktemp(name)
    tags = sorted({t for s in NER_SENTENCES for _, t in s})
    kinds = {"mlm": ("ForMaskedLM", {}),
             "classify": ("ForSequenceClassification", dict(id2label=LABELS, label2id={v: k for k, v in LABELS.items()})),
             "ner": ("ForTokenClassification", dict(id2label=dict(enumerate(tags)),
                                                    label2id={t: i for i, t in enumerate(tags)}))}
    found = {"family": name}
    for kind, (suffix, labels) in kinds.items():
        directory = root / kind
        vocab_size = _save_tokenizer(name, directory)
        torch.manual_seed(0)
        model = getattr(transformers, prefix + suffix)(_hf_config(name, vocab_size, **labels))
        if kind == "classify":
            with torch.no_grad():  # confident, varied scores rather than ~0.5 everywhere
                classifier = getattr(model.classifier, "out_proj", model.classifier)  # MPNet's is a first-token head
                classifier.weight.normal_(0.0, 2.0)
        model.save_pretrained(directory)
        found[kind] = directory
    return found


def _reference(directory: Path, task: str = "Model"):
    model = getattr(transformers, f"AutoModel{'' if task == 'Model' else task}").from_pretrained(directory)
    model.config._attn_implementation = "eager"
    return model.eval(), transformers.AutoTokenizer.from_pretrained(directory)


def _run(capsys, *argv: str) -> str:
    rc = main(list(argv))
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return captured.out


# ------------------------------------------------------------------------------------------ evaluate, predict, glue


def test_predict_and_evaluate_a_classifier_agree_with_transformers(family, tmp_path, capsys):
    data = write_sentiment(tmp_path / "dev.tsv", 16)
    output = tmp_path / "pred.jsonl"
    _run(capsys, "predict", "--task", "classification", "--model", str(family["classify"]), "--input", str(data),
         "--out", str(output), "--no-progress")
    records = [json.loads(line) for line in output.read_text().splitlines()]
    texts = [line.split("\t")[0] for line in data.read_text().splitlines()[1:]]
    gold = [line.split("\t")[1] for line in data.read_text().splitlines()[1:]]
    ref, tokenizer = _reference(family["classify"], "ForSequenceClassification")
    with torch.no_grad():
        probs = ref(**tokenizer(texts, padding=True, return_tensors="pt")).logits.softmax(-1)
    expected = [LABELS[int(i)] for i in probs.argmax(-1)]
    assert [r["label"] for r in records] == expected
    assert [r["score"] for r in records] == pytest.approx(probs.max(-1).values.tolist(), abs=1e-5)
    evaluated = json.loads(_run(capsys, "evaluate", "--task", "classification", "--model", str(family["classify"]),
                                "--input", str(data), "--no-progress"))
    assert evaluated["accuracy"] == pytest.approx(np.mean([e == g for e, g in zip(expected, gold)]), abs=1e-6)


def test_predict_ner_tags_the_words_transformers_tags(family, tmp_path, capsys):
    data = tmp_path / "ner.conll"
    data.write_text("\n\n".join("\n".join(f"{w} NN B-NP {t}" for w, t in s) for s in NER_SENTENCES) + "\n")
    output = tmp_path / "ner.jsonl"
    _run(capsys, "predict", "--task", "ner", "--model", str(family["ner"]), "--input", str(data),
         "--out", str(output), "--no-progress")
    records = [json.loads(line) for line in output.read_text().splitlines()]
    ref, tokenizer = _reference(family["ner"], "ForTokenClassification")
    for sentence, record in zip(NER_SENTENCES, records, strict=True):
        words = [w for w, _ in sentence]
        enc = tokenizer(words, is_split_into_words=True, return_tensors="pt")
        with torch.no_grad():
            tags = ref(**enc).logits[0].argmax(-1)
        firsts = {}
        for position, word in enumerate(enc.word_ids()):
            if word is not None and word not in firsts:
                firsts[word] = ref.config.id2label[int(tags[position])]
        assert record["tags"] == [firsts[i] for i in range(len(words))], record


def test_glue_runs_one_task(family, tmp_path, capsys):
    data = tmp_path / "data"
    write_task(data, "SST-2", n_train=16, n_dev=8)
    out = tmp_path / "glue"
    printed = _run(capsys, "glue", "--model", str(family["mlm"]), "--data-dir", str(data), "--out", str(out),
                   "--tasks", "SST-2", "--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--max-length", "32",
                   "--device", "cpu", "--no-progress")
    report = json.loads((out / "glue.json").read_text())
    assert list(report["tasks"]) == ["SST-2"] and printed.startswith(report["table"])
    saved = json.loads((out / "SST-2" / "model" / "config.json").read_text())
    assert saved["model_type"] == json.loads((family["mlm"] / "config.json").read_text())["model_type"]


# ------------------------------------------------------------------------------------------ embed, train-embeddings


def _mean_pooled(directory: Path, texts: list[str], max_length: int | None = None) -> np.ndarray:
    ref, tokenizer = _reference(directory)
    enc = tokenizer(texts, padding=True, truncation=max_length is not None, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        hidden = ref(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    return ((hidden * mask).sum(1) / mask.sum(1)).numpy()


def test_embed_mean_pools_what_transformers_computes(family, tmp_path, capsys):
    texts = tmp_path / "in.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    output = tmp_path / "out.npy"
    _run(capsys, "embed", "--model", str(family["mlm"]), "--input", str(texts), "--out", str(output),
         "--pooling", "mean", "--no-normalize", "--no-progress")
    np.testing.assert_allclose(np.load(output), _mean_pooled(family["mlm"], TEXTS), rtol=0, atol=1e-5)
    _run(capsys, "embed", "--model", str(family["mlm"]), "--input", str(texts), "--out", str(tmp_path / "n.npy"),
         "--no-progress")  # the default: mean, as the model declares no sentence-transformers pooling
    default = np.load(tmp_path / "n.npy")
    np.testing.assert_allclose(default, np.load(output), rtol=0, atol=1e-5)


def test_train_embeddings_then_embed_the_result(family, tmp_path, capsys):
    rows = [("john lives in paris", "john lives in paris ."), ("a great film", "great film"),
            ("an awful plot", "awful plot"), ("mary works at acme corp", "mary works at acme"),
            ("where does john live ?", "john lives where ?"), ("very boring plot", "boring plot")]
    train = tmp_path / "pairs.tsv"
    train.write_text("anchor\tpositive\n" + "".join(f"{a}\t{b}\n" for a, b in rows))
    out = tmp_path / "run"
    _run(capsys, "train-embeddings", "--model", str(family["mlm"]), "--train", str(train), "--out", str(out),
         "--epochs", "1", "--batch-size", "6", "--lr", "1e-3", "--max-length", "32", "--pooling", "mean",
         "--device", "cpu", "--no-progress")
    model = out  # a sentence-transformers directory
    kind = json.loads((model / "config.json").read_text())["model_type"]
    assert kind == json.loads((family["mlm"] / "config.json").read_text())["model_type"]
    before, after = _mean_pooled(family["mlm"], TEXTS), _mean_pooled(model, TEXTS, max_length=32)  # its max_seq_length
    assert np.abs(before - after).max() > 1e-4  # the weights moved, and transformers reads them as the family
    texts = tmp_path / "in.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    _run(capsys, "embed", "--model", str(model), "--input", str(texts), "--out", str(tmp_path / "e.npy"),
         "--no-normalize", "--no-progress")
    np.testing.assert_allclose(np.load(tmp_path / "e.npy"), after, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------ serve


def test_serve_answers_an_embed_and_a_predict_request(family):
    pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
    pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")
    from bertforge.serve import ServeConfig
    from tests.serve.serve_helpers import ThreadServer

    with ThreadServer(ServeConfig(model=str(family["mlm"]), task="embed", pooling="mean")) as server:
        r = server.client.post("/embed", json={"inputs": TEXTS, "normalize": False})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json(), dtype=np.float32), _mean_pooled(family["mlm"], TEXTS),
                                   rtol=0, atol=1e-5)
    with ThreadServer(ServeConfig(model=str(family["classify"]), task="classify")) as server:
        r = server.client.post("/predict", json={"inputs": TEXTS[0]})
        assert r.status_code == 200, r.text
    ref, tokenizer = _reference(family["classify"], "ForSequenceClassification")
    with torch.no_grad():
        probs = ref(**tokenizer(TEXTS[0], return_tensors="pt")).logits.softmax(-1)[0]
    got = {x["label"]: x["score"] for x in r.json()}
    assert got == pytest.approx({LABELS[i]: float(p) for i, p in enumerate(probs)}, abs=1e-5)


# ------------------------------------------------------------------------------------------ fill-mask, attention


def test_fill_mask_predicts_what_transformers_predicts(family, capsys):
    mask = Tokenizer.from_pretrained(family["mlm"]).mask_token
    assert mask == {"mpnet": "<mask>", "eurobert": "<|mask|>", "jina_embeddings_v3": "<mask>"}.get(family["family"],
                                                                                                  "[MASK]")
    text = f"john lives in {mask} ."
    lines = _run(capsys, "fill-mask", "--model", str(family["mlm"]), text, "--top-k", "3", "--json").splitlines()
    [results] = json.loads(lines[0])["predictions"]  # one mask
    reference = transformers.pipeline("fill-mask", model=str(family["mlm"]), top_k=3)(text)
    assert [r["token"] for r in results] == [r["token"] for r in reference]
    assert [r["score"] for r in results] == pytest.approx([r["score"] for r in reference], abs=1e-5)


def test_attention_draws_the_probabilities_transformers_computes(family, tmp_path, capsys):
    from bertforge.commands.attention import attention_probabilities

    png = tmp_path / "attention.png"
    _run(capsys, "attention", "--model", str(family["mlm"]), "--text", TEXTS[0], "--out", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _run(capsys, "attention", "--model", str(family["mlm"]), "--text", TEXTS[0], "--text-pair", TEXTS[3],
         "--out", str(tmp_path / "pair.png"), "--layer", "1", "--head", "1")
    assert (tmp_path / "pair.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    layers, tokens = attention_probabilities(family["mlm"], TEXTS[0], None)
    ref, tokenizer = _reference(family["mlm"])
    enc = tokenizer(TEXTS[0], return_tensors="pt")
    with torch.no_grad():
        expected = ref(**enc, output_attentions=True).attentions
    assert len(tokens) == enc["input_ids"].shape[1] > 8  # longer than ModernBERT's window
    assert len(layers) == len(expected)
    for ours, theirs in zip(layers, expected):
        np.testing.assert_allclose(ours, theirs[0].numpy(), rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------ tokenizer files written back


def test_the_tokenizer_bertforge_writes_back_encodes_as_the_original_in_transformers(family, tmp_path):
    """What a fine-tuning or embedding run saves: transformers must read the same tokenizer back (its class, and
    the same ids for text with characters outside the vocabulary: upper case)."""
    Tokenizer.from_pretrained(family["mlm"]).save_pretrained(tmp_path)
    original = transformers.AutoTokenizer.from_pretrained(family["mlm"])
    written = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert type(written) is type(original)
    text = "John lives in Paris and Mary works at ACME corp ."
    assert written(text, "where ?")["input_ids"] == original(text, "where ?")["input_ids"]
