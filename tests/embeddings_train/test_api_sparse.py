"""Tests of `bertforge.embeddings_train.api` for sparse encoders (`--sparse splade`) and prompts (`--prompts`): a
short SPLADE run on the toy task, written as a sentence-transformers SparseEncoder that sentence-transformers loads
with the same vectors; margin-MSE distillation on scored triplets; prompts saved and applied; bad input refused.

Everything runs on the tiny random BERT with its MLM head (2 layers, 32 wide) and the toy task's files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import bertforge
from bertforge.cli import main
from tests.embeddings_train.embeddings_train_helpers import B, DEV_TEMPLATES, PERMUTATION, N, beir_folder, pairs, write_tsv

st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers: pip install -e '.[test]'")

PROMPTS = ["query=some ", "document=one "]  # words of the toy vocabulary




@pytest.fixture(scope="module")
def beir(tmp_path_factory) -> Path:
    return beir_folder(tmp_path_factory.mktemp("beir") / "toy")


@pytest.fixture(scope="module")
def splade(tiny_mlm, toy, beir, tmp_path_factory) -> Path:
    """A short SPLADE run through the command line: in-batch negatives, both regularizers, prompts, a BEIR dev set."""
    out = tmp_path_factory.mktemp("runs") / "splade"
    assert main(["train-embeddings", "--model", str(tiny_mlm), "--train", str(toy[0]), "--dev", str(beir),
                 "--out", str(out), "--sparse", "splade", "--query-regularizer", "1e-3", "--document-regularizer",
                 "5e-4", "--prompts", *PROMPTS, "--epochs", "4", "--batch-size", "16", "--lr", "2e-3",
                 "--max-length", "16", "--log-every", "1", "--device", "cpu", "--no-progress"]) == 0
    return out


def rows(out: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["type"] == kind]


def test_splade_training_lowers_the_loss_and_reports_the_non_zero_counts(splade):
    train = rows(splade, "train")
    assert len(train) == 16 and train[-1]["base_loss"] < train[0]["base_loss"] - 0.05, train
    for row in train:
        assert 0 < row["query_nonzero"] <= 47 and 0 < row["document_nonzero"] <= 47  # the toy vocabulary: 47
        assert row["loss"] == pytest.approx(row["base_loss"] + row["query_regularizer_loss"]
                                            + row["document_regularizer_loss"], rel=1e-5)
    # the regularizers' weights rise quadratically over the first third of the 16 steps (5), then stay
    assert [r["query_regularizer_weight"] for r in train[:6]] == pytest.approx(
        [1e-3 * (s / 5) ** 2 for s in range(5)] + [1e-3])
    assert train[-1]["document_regularizer_weight"] == 5e-4
    summary = json.loads((splade / "eval.json").read_text())
    assert summary["main_metric"] == "ndcg@10" and {"query_nonzero", "document_nonzero"} <= set(summary["before"])
    assert all("query_nonzero" in r for r in rows(splade, "eval"))


def test_sentence_transformers_loads_the_sparse_encoder_with_the_same_vectors(splade):
    modules = json.loads((splade / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["MLMTransformer", "SpladePooling"]
    st_config = json.loads((splade / "config_sentence_transformers.json").read_text())
    assert st_config["model_type"] == "SparseEncoder" and st_config["prompts"] == {"query": "some ", "document": "one "}
    model = st.SparseEncoder(str(splade), device="cpu")
    assert model.max_seq_length == 16
    texts = [a for a, _ in pairs(DEV_TEMPLATES)] + ["the a3 and b4 is here now with some one", "see"]
    reference = model.encode(texts, batch_size=5, convert_to_tensor=True).to_dense().numpy()
    ours = bertforge.pipeline("sparse", model=splade)(texts)
    assert ours.shape == reference.shape and np.abs(reference - ours).max() <= 1e-5
    assert (ours == 0).any() and ((ours != 0) == (reference != 0)).all()
    queries = model.encode_query(texts, convert_to_tensor=True).to_dense().numpy()  # with the "query" prompt
    assert np.abs(queries - bertforge.pipeline("sparse", model=splade, prompt_name="query")(texts)).max() <= 1e-5
    documents = model.encode_document(texts, convert_to_tensor=True).to_dense().numpy()
    assert np.abs(documents - bertforge.pipeline("sparse", model=splade, prompt_name="document")(texts)).max() <= 1e-5
    assert np.abs(documents - queries).max() > 0  # the prompts differ


def test_evaluate_scores_the_sparse_encoder_as_its_dev_evaluation(splade, beir, capsys):
    """`bertforge evaluate --task retrieval` on the SparseEncoder (sparse by its modules, the query prompt on the
    queries and the document prompt on the corpus) gives eval.json's best numbers, as --dev computed them."""
    summary = json.loads((splade / "eval.json").read_text())
    capsys.readouterr()
    assert main(["evaluate", "--task", "retrieval", "--model", str(splade), "--input", str(beir),
                 "--no-progress"]) == 0
    ours = json.loads(capsys.readouterr().out)
    for name, value in summary["best"]["metrics"].items():
        if not name.endswith("_nonzero"):
            assert abs(ours[name] - value) < 1e-6, name


def test_serve_answers_embed_sparse_for_the_sparse_encoder(splade):
    from starlette.testclient import TestClient

    from bertforge.serve.app import create_app
    from bertforge.serve.config import ServeConfig

    texts = ["the a1 is here", "see b2"]
    with TestClient(create_app(ServeConfig(model=str(splade), num_threads=1))) as client:
        answer = client.post("/embed_sparse", json={"inputs": texts}).json()
    expected = bertforge.pipeline("sparse", model=splade)(texts)
    for entries, row in zip(answer, expected):
        assert [e["index"] for e in entries] == np.flatnonzero(row).tolist()
        assert np.abs(np.array([e["value"] for e in entries]) - row[row != 0]).max() <= 1e-5


def test_margin_mse_distils_a_teachers_margins(tiny_mlm, tmp_path):
    """Scored triplets (query, positive, negative, margin): --loss auto is margin-mse; the margins are learnt (a
    lexical task: the query holds its positive's word)."""
    triplets = [(f"the {B[PERMUTATION[i]]} is here", f"{B[PERMUTATION[i]]} there",
                 f"{B[PERMUTATION[(i + 1) % N]]} there", 2.0) for i in range(N)]
    train = write_tsv(tmp_path / "margins.tsv", triplets, "query\tpositive\tnegative\tscore")
    out = tmp_path / "distilled"
    assert main(["train-embeddings", "--model", str(tiny_mlm), "--train", str(train), "--out", str(out),
                 "--sparse", "splade", "--epochs", "12", "--batch-size", "16", "--lr", "1e-2", "--warmup-ratio", "0",
                 "--log-every", "1", "--device", "cpu", "--no-progress"]) == 0
    summary = json.loads((out / "eval.json").read_text())
    assert summary["shape"] == "scored-triplets" and summary["loss"] == "margin-mse"
    train_rows = rows(out, "train")
    assert len(train_rows) == 12 and train_rows[-1]["base_loss"] < train_rows[0]["base_loss"] * 0.8, train_rows


@pytest.mark.parametrize("args, message", [
    (["--sparse", "splade"], "--sparse splade: {tiny} has no MLM head (cls.predictions.*"),
    (["--loss", "margin-mse"], "--loss margin-mse needs scored triplets (query, positive, negative and the teacher's"),
    (["--prompts", "passage=p: "], "--prompts 'passage' names no column of {train} (its columns are anchor, positive)"
                                   " and is not query (the first column) or document (the others)"),
    (["--sparse", "splade", "--pooling", "cls"], "--pooling applies to dense embeddings, not --sparse splade"),
])
def test_bad_sparse_and_prompt_settings_are_one_line(tiny, toy, tmp_path, capsys, args, message):
    out = tmp_path / "out"
    rc = main(["train-embeddings", "--model", str(tiny), "--train", str(toy[0]), "--out", str(out), "--no-progress",
               *args])
    err = capsys.readouterr().err
    assert rc == 2 and message.format(tiny=tiny, train=toy[0]) in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_dense_training_with_prompts_saves_them_for_sentence_transformers(tiny, toy, tmp_path):
    """Prompts named after the file's columns: each column's texts get its prompt in training; the model keeps
    them and sentence-transformers' "query" / "document" (the first and second column's); encode_query agrees."""
    out = tmp_path / "prompted"
    assert main(["train-embeddings", "--model", str(tiny), "--train", str(toy[0]), "--out", str(out), "--prompts",
                 "anchor=some ", "positive=one ", "--epochs", "1", "--batch-size", "16", "--max-length", "16",
                 "--scale", "10", "--device", "cpu", "--no-progress"]) == 0
    prompts = json.loads((out / "config_sentence_transformers.json").read_text())["prompts"]
    assert prompts == {"anchor": "some ", "positive": "one ", "query": "some ", "document": "one "}
    model = st.SentenceTransformer(str(out), device="cpu")
    texts = ["the a1 is here", "see b2"]
    reference = model.encode_query(texts)
    assert np.abs(reference - bertforge.pipeline("embed", model=out, prompt_name="query")(texts)).max() <= 1e-5
    assert np.abs(reference - bertforge.pipeline("embed", model=out, prompt="some ")(texts)).max() <= 1e-5


@pytest.mark.parametrize("family, extra", [("roberta", {"pad_token_id": 1}), ("deberta-v2", {}), ("electra", {})])
def test_splade_trains_other_families_masked_lm_checkpoints(family, extra, toy, tmp_path):
    """The MLM heads of other families (RoBERTa's lm_head, DeBERTa-v2's, ELECTRA's generator head) through the same
    packed encoder and SPLADE pooling; sentence-transformers (transformers' *ForMaskedLM of the family) loads each
    output with the same vectors."""
    import torch

    from bertforge import BertForMaskedLM
    from tests.embeddings_train.embeddings_train_helpers import VOCAB
    from tests.helpers import tiny_config, write_uncased_tokenizer

    model_dir = write_uncased_tokenizer(tmp_path / family, VOCAB)
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True,
                                                                 "tokenizer_class": "BertTokenizer"}))
    torch.manual_seed(0)
    BertForMaskedLM(tiny_config(vocab_size=len(VOCAB), model_type=family, **extra)).save_pretrained(model_dir)
    out = tmp_path / "out"
    assert main(["train-embeddings", "--model", str(model_dir), "--train", str(toy[0]), "--out", str(out), "--sparse",
                 "splade", "--epochs", "1", "--batch-size", "32", "--max-length", "16", "--device", "cpu",
                 "--no-progress"]) == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    texts = ["the a1 is here", "see b2 now with some"]
    reference = st.SparseEncoder(str(out), device="cpu").encode(texts, convert_to_tensor=True).to_dense().numpy()
    assert np.abs(reference - bertforge.pipeline("sparse", model=out)(texts)).max() <= 1e-5


def test_a_sparse_encoder_as_model_trains_on_as_one(splade, toy, tmp_path):
    """No --sparse: a SparseEncoder directory (its SpladePooling) goes on as SPLADE, its prompts and max_seq_length
    kept; sentence-transformers loads the result with the same vectors."""
    out = tmp_path / "again"
    assert main(["train-embeddings", "--model", str(splade), "--train", str(toy[0]), "--out", str(out), "--epochs",
                 "1", "--batch-size", "32", "--device", "cpu", "--no-progress"]) == 0
    st_config = json.loads((out / "config_sentence_transformers.json").read_text())
    assert st_config["model_type"] == "SparseEncoder" and st_config["prompts"] == {"query": "some ", "document": "one "}
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 16
    texts = ["the a1 is here", "see b2"]
    reference = st.SparseEncoder(str(out), device="cpu").encode_query(texts, convert_to_tensor=True).to_dense().numpy()
    assert np.abs(reference - bertforge.pipeline("sparse", model=out, prompt_name="query")(texts)).max() <= 1e-5


@pytest.mark.usefixtures("one_thread")  # bit for bit: one intra-op thread, as test_api_resume.py
def test_a_splade_run_stopped_and_resumed_ends_as_the_run_never_stopped(tiny_mlm, toy, tmp_path, monkeypatch):
    """The regularizers' schedule comes from the step the checkpoint holds: weights, metrics rows and eval.json of
    a resumed SPLADE run are those of one never stopped."""
    from bertforge.embeddings_train import train_embeddings
    from tests.helpers import same_run, stopped_after

    settings = dict(model=str(tiny_mlm), train=str(toy[0]), dev=str(toy[1]), sparse="splade", epochs=2,
                    batch_size=16, lr=1e-3, eval_every=3, log_every=1, save_every=2, seed=5, max_length=16,
                    query_regularizer=1e-2, document_regularizer=1e-2, device="cpu", progress=False)
    train_embeddings(out=str(tmp_path / "reference"), **settings)
    stopped_after(monkeypatch, 3, lambda: train_embeddings(out=str(tmp_path / "run"), **settings))
    monkeypatch.undo()
    train_embeddings(out=str(tmp_path / "run"), resume=True, **settings)
    same_run(tmp_path / "reference", tmp_path / "run", "model.safetensors")


def test_evaluate_sts_on_a_sparse_encoder_is_sentence_transformers_sparse_evaluator(splade, tmp_path, capsys):
    """`evaluate --task sts` on a SparseEncoder: its SPLADE vectors, Spearman and Pearson of the cosine and of the
    dot product, as `SparseEmbeddingSimilarityEvaluator` (within 1e-6)."""
    import random

    from sentence_transformers.sparse_encoder.evaluation import SparseEmbeddingSimilarityEvaluator

    rng = random.Random(3)
    rows = [(a, b, round(rng.uniform(0, 5), 2)) for a, b in pairs(DEV_TEMPLATES)]
    sts = write_tsv(tmp_path / "sts.tsv", rows, "sentence1\tsentence2\tscore")
    capsys.readouterr()
    assert main(["evaluate", "--task", "sts", "--model", str(splade), "--input", str(sts), "--no-progress"]) == 0
    ours = json.loads(capsys.readouterr().out)
    evaluator = SparseEmbeddingSimilarityEvaluator([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                                                   similarity_fn_names=["cosine", "dot"])
    reference = evaluator(st.SparseEncoder(str(splade), device="cpu"))
    assert set(ours) == {"spearman", "pearson", "spearman_dot", "pearson_dot"}
    for name, theirs in [("spearman", "spearman_cosine"), ("pearson", "pearson_cosine"), ("spearman_dot", "spearman_dot"),
                         ("pearson_dot", "pearson_dot")]:
        assert abs(ours[name] - reference[theirs]) < 1e-6, name
