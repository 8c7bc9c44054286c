"""Fine-tuning and using RoBERTa, ALBERT, DistilBERT, ModernBERT, MPNet, NomicBERT, GTE and ELECTRA checkpoints through the CLI and the pipelines, as for BERT:
each family's tokenizer kind (byte-level BPE, Unigram, WordPiece) trained in the test, a tiny random model of the
family, `finetune` / `predict` / `evaluate`, and `transformers` loading what comes out as that family."""

import json
from pathlib import Path

import pytest
import torch

import bertforge
from bertforge import BertConfig
from bertforge.cli import main
from bertforge.tokenizer import Tokenizer

from .conftest import NER_SENTENCES, NEGATIVE, POSITIVE, write_conll, write_sentiment, write_squad

transformers = pytest.importorskip("transformers")

FAST = ["--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--no-progress"]
PREFIX = {"roberta": "Roberta", "albert": "Albert", "distilbert": "DistilBert", "modernbert": "ModernBert",
          "mpnet": "MPNet", "nomic_bert": "NomicBert", "gte": "Gte",
          "eurobert": "EuroBert", "jina_embeddings_v3": "JinaEmbeddingsV3",
          "electra": "Electra"}


@pytest.fixture(scope="module", params=["roberta", "albert", "distilbert", "modernbert", "mpnet", "nomic_bert", "gte",
                                                 "eurobert", "jina_embeddings_v3", "electra"])
def family_model(request, tmp_path_factory) -> tuple[str, Path]:
    """A tiny random model of the family with its own kind of tokenizer, trained on the tests' words."""
    family = request.param
    directory = tmp_path_factory.mktemp(family)
    lines = POSITIVE + NEGATIVE + [" ".join(w for w, _ in s) for s in NER_SENTENCES]
    lines += ["where does john live ?", "mary works at acme corp in paris ."]
    kind = bertforge.BertConfig.preset(f"{family}-tiny").family.tokenizer_kind  # NomicBERT, GTE, ELECTRA: WordPiece
    tokenizer = Tokenizer.train(iter(lines * 20), vocab_size=300, kind=kind)
    tokenizer.save_pretrained(directory)
    config = BertConfig.preset(f"{family}-tiny", vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                               hidden_size=32, num_attention_heads=2, intermediate_size=64, max_position_embeddings=140)
    torch.manual_seed(0)
    bertforge.AutoModel.from_config(config).save_pretrained(directory)
    return family, directory


def run(capsys, *argv: str) -> dict:
    rc = main(list(argv))
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out) if captured.out.strip().startswith("{") else {}


def test_classification_through_the_cli_and_transformers(tmp_path, family_model, capsys):
    family, model = family_model
    train, dev = write_sentiment(tmp_path / "train.tsv", 32), write_sentiment(tmp_path / "dev.tsv", 8)
    out = tmp_path / "run"
    run(capsys, "finetune", "--task", "classification", "--model", str(model), "--train", str(train), "--dev", str(dev),
        "--out", str(out), *FAST)
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["model_type"] == family and config["architectures"] == [f"{PREFIX[family]}ForSequenceClassification"]
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(out / "model").eval()
    assert type(reference).__name__ == f"{PREFIX[family]}ForSequenceClassification"
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out / "model")
    texts = ["good movie", "an awful plot of this film"]
    batch = hf_tokenizer(texts, padding=True, return_tensors="pt")
    ours = bertforge.AutoModelForSequenceClassification.from_pretrained(out / "model").eval()
    with torch.no_grad():
        expected = reference(**batch).logits
        assert (expected - ours(**batch).logits).abs().max() <= 1e-5
    pipe = bertforge.pipeline("text-classification", model=out / "model", top_k=None, function_to_apply="none")
    for text, row in zip(texts, expected):
        got = {r["label"]: r["score"] for r in pipe(text)}
        assert got == pytest.approx({"neg": float(row[0]), "pos": float(row[1])}, abs=1e-5)
    evaluated = run(capsys, "evaluate", "--task", "classification", "--model", str(out / "model"), "--input", str(dev),
                    "--no-progress")
    assert 0.0 <= evaluated["accuracy"] <= 1.0


def test_ner_through_the_cli_and_the_pipeline(tmp_path, family_model, capsys):
    family, model = family_model
    data = write_conll(tmp_path / "train.conll", 6)
    out = tmp_path / "run"
    run(capsys, "finetune", "--task", "ner", "--model", str(model), "--train", str(data), "--dev", str(data),
        "--out", str(out), "--epochs", "30", "--batch-size", "4", "--lr", "3e-3", "--no-progress")
    reference = transformers.AutoModelForTokenClassification.from_pretrained(out / "model")
    assert type(reference).__name__ == f"{PREFIX[family]}ForTokenClassification"
    summary = json.loads((out / "eval.json").read_text())
    assert summary["metrics"]["f1"] > 0.5, summary  # the tiny set is learnable: the labels reach the right tokens
    entities = bertforge.pipeline("token-classification", model=out / "model")("john lives in amsterdam .")
    words = {e["word"]: e["entity_group"] for e in entities}
    assert words.get("john") == "PER", entities  # whole words, not "Ġjohn" or "▁john"
    assert all(e["word"] == "john lives in amsterdam ."[e["start"] : e["end"]] for e in entities), entities


def test_question_answering_windows_use_the_family_template(tmp_path, family_model, capsys):
    family, model = family_model
    data = write_squad(tmp_path / "squad.json")
    out = tmp_path / "run"
    run(capsys, "finetune", "--task", "qa", "--model", str(model), "--train", str(data), "--dev", str(data),
        "--out", str(out), "--max-length", "96", "--doc-stride", "16", *FAST)
    tokenizer = Tokenizer.from_pretrained(out / "model")
    from bertforge.finetune.squad import QAExample
    from bertforge.data.qa_spans import encode_qa

    features, _ = encode_qa(tokenizer, [QAExample("q1", "where does john live ?", "john lives in paris .")],
                            max_length=64, doc_stride=16, max_query_length=32, with_targets=False)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out / "model")
    expected = hf_tokenizer("where does john live ?", "john lives in paris .")["input_ids"]
    assert features[0]["input_ids"] == expected  # <s> q </s></s> c </s> for RoBERTa, [CLS] q [SEP] c [SEP] else


def test_fill_mask_with_the_family_mask_token(family_model, tmp_path):
    family, model = family_model
    config = BertConfig.from_pretrained(model)
    torch.manual_seed(0)
    bertforge.AutoModelForMaskedLM.from_config(config).save_pretrained(tmp_path)
    Tokenizer.from_pretrained(model).save_pretrained(tmp_path)
    mask = Tokenizer.from_pretrained(tmp_path).mask_token
    assert mask == {"roberta": "<mask>", "mpnet": "<mask>", "eurobert": "<|mask|>", "jina_embeddings_v3": "<mask>"}.get(family, "[MASK]")
    results = bertforge.pipeline("fill-mask", model=tmp_path, top_k=3)(f"john lives in {mask} .")
    assert len(results) == 3 and all(0.0 <= r["score"] <= 1.0 for r in results)
    reference = transformers.pipeline("fill-mask", model=str(tmp_path), top_k=3)(f"john lives in {mask} .")
    assert [r["token"] for r in results] == [r["token"] for r in reference]
    assert [r["score"] for r in results] == pytest.approx([r["score"] for r in reference], abs=1e-5)


def test_attention_plot_and_onnx_export_of_the_family(family_model, tmp_path, capsys):
    family, model = family_model
    png = tmp_path / "attention.png"
    assert main(["attention", "--model", str(model), "--text", "john lives in paris .", "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pytest.importorskip("onnxruntime")
    assert main(["export-onnx", "--model", str(model), "--out", str(tmp_path / "model.onnx")]) == 0
    assert (tmp_path / "model.onnx").stat().st_size > 0


def test_a_reranker_of_the_family_through_the_cli(tmp_path, family_model, capsys):
    """`finetune --task rerank` (lambdaloss, listwise rows) on the family's checkpoint: transformers loads the
    one-logit classifier with the same logits, and `pipeline("rerank")` ranks with `predict --task rerank`'s scores."""
    family, model = family_model
    rows = [{"query": "where does john live ?", "documents": ["john lives in paris .", "mary works at acme corp ."],
             "labels": [1, 0]},
            {"query": "where does mary work ?", "documents": ["mary works at acme corp .", "good movie"],
             "labels": [1, 0]}] * 4
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "run"
    run(capsys, "finetune", "--task", "rerank", "--loss", "lambdaloss", "--model", str(model), "--train", str(train),
        "--dev", str(train), "--out", str(out), *FAST)
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == [f"{PREFIX[family]}ForSequenceClassification"] and config["num_labels"] == 1
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(out / "model").eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out / "model")
    documents = rows[0]["documents"]
    batch = hf_tokenizer([rows[0]["query"]] * 2, documents, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = torch.sigmoid(reference(**batch).logits[:, 0])
    ranked = bertforge.pipeline("rerank", model=out / "model")(rows[0]["query"], documents)
    assert max(abs(r["score"] - float(expected[r["corpus_id"]])) for r in ranked) <= 1e-5
    predictions = tmp_path / "ranked.jsonl"
    run(capsys, "predict", "--task", "rerank", "--model", str(out / "model"), "--input", str(train), "--out",
        str(predictions), "--no-progress")
    first = json.loads(predictions.read_text().splitlines()[0])["ranking"]
    assert {r["corpus_id"]: r["score"] for r in first} == pytest.approx({r["corpus_id"]: r["score"] for r in ranked},
                                                                        abs=1e-5)


def test_multiple_choice_of_the_family_through_the_cli(tmp_path, family_model, capsys):
    """`finetune --task multiple-choice` on SWAG rows: transformers' AutoModelForMultipleChoice loads the family's
    ForMultipleChoice with bertforge's logits on its own tokenizer's pairs, and `pipeline("multiple-choice")` gives
    their softmax; a family transformers has no such class for is refused before anything is written."""
    from .test_multiple_choice import swag_rows, write_jsonl

    family, model = family_model
    train = write_jsonl(tmp_path / "train.jsonl", swag_rows(16))
    dev = write_jsonl(tmp_path / "dev.jsonl", swag_rows(4, seed=1))
    out = tmp_path / "run"
    argv = ["finetune", "--task", "multiple-choice", "--model", str(model), "--train", str(train), "--dev", str(dev),
            "--out", str(out), *FAST]
    if not BertConfig.from_pretrained(model).family.multiple_choice:
        assert main(argv) != 0
        assert "multiple choice is not available for" in capsys.readouterr().err and not out.exists()
        return
    assert 0.0 <= run(capsys, *argv)["metrics"]["accuracy"] <= 1.0
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == [
        f"{PREFIX[family]}ForMultipleChoice"]
    reference = transformers.AutoModelForMultipleChoice.from_pretrained(out / "model").eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out / "model")
    rows = swag_rows(2, seed=1)
    choices = [[f"{r['sent2']} {r[f'ending{k}']}" for k in range(4)] for r in rows]
    batch = hf_tokenizer([r["sent1"] for r in rows for _ in range(4)], [c for row in choices for c in row],
                         padding=True, return_tensors="pt")
    batch = {k: v.view(2, 4, -1) for k, v in batch.items()}
    ours = bertforge.AutoModelForMultipleChoice.from_pretrained(out / "model").eval()
    with torch.no_grad():
        expected = reference(**batch).logits
        assert (expected - ours(**batch).logits).abs().max() <= 1e-5
    choose = bertforge.pipeline("multiple-choice", model=out / "model")
    for row, options, logits in zip(rows, choices, expected):
        assert choose(row["sent1"], options)["scores"] == pytest.approx(logits.softmax(-1).tolist(), abs=1e-5)
