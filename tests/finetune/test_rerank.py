"""`finetune --task rerank` (`bertforge.finetune.rerank`): the rows' layouts, mnrl's in-batch candidates and loss
(sentence-transformers' on the same model and pairs), training with every loss, and a trained reranker's output
loading in sentence-transformers' CrossEncoder with bertforge's scores."""

from __future__ import annotations

import json

import pytest
import torch

from bertforge import BertforgeError
from bertforge.finetune import finetune, predict
from bertforge.finetune.config import DataOptions
from bertforge.finetune.rerank import RerankRow, by_query, in_batch_candidates, read_rerank_rows
from bertforge.finetune.rerank_losses import RERANK_LOSSES
from tests.finetune.test_rerank_losses import DOCS, NAMES, OFF_TOPIC, bertforge_logits



def _rows(n: int = 12) -> list[dict]:
    rows = []
    for i in range(n):
        name = NAMES[i % 3]
        others = [DOCS[m] for m in NAMES if m != name]
        rows.append({"query": f"where does {name} live ?", "positive": DOCS[name], "negative": others[i % 2]})
    return rows


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _listwise(rows):
    return [{"query": r["query"], "documents": [r["positive"], r["negative"], OFF_TOPIC], "labels": [1, 0.5, 0]}
            for r in rows]


def test_mnrl_is_sentence_transformers_loss(cross_encoder_dir):
    """Rows (query, positive, hard negative): the in-batch candidates and the loss are
    sentence-transformers' MultipleNegativesRankingLoss's (three rows: every other row's document is a candidate,
    no draw)."""
    from sentence_transformers.cross_encoder import CrossEncoder, losses

    ce = CrossEncoder(str(cross_encoder_dir), num_labels=1)
    ce.model.eval()
    rows = [RerankRow(1, f"where does {n} live ?", [DOCS[n], DOCS[NAMES[(i + 1) % 3]]], [1.0, 0.0])
            for i, n in enumerate(NAMES)]
    chosen = in_batch_candidates(rows, torch.Generator().manual_seed(0))
    assert [len(c) for c in chosen] == [6, 6, 6]  # positive, 4 in-batch, 1 hard negative
    assert all(c[0] == row.documents[0] and c[-1] == row.documents[1] for c, row in zip(chosen, rows))
    for c, row in zip(chosen, rows):
        others = [d for r in rows if r is not row for d in r.documents]
        assert sorted(c[1:-1]) == sorted(others)
    pairs = [(row.query, d) for row, documents in zip(rows, chosen) for d in documents]
    assert float(bertforge_logits(cross_encoder_dir, pairs).std()) > 0.5  # a test the scale and sigmoid matter to
    ours = RERANK_LOSSES["mnrl"].fn(bertforge_logits(cross_encoder_dir, pairs), [6, 6, 6], torch.zeros(18))
    with torch.no_grad():
        theirs = losses.MultipleNegativesRankingLoss(ce)(
            [[r.query for r in rows], [r.documents[0] for r in rows], [r.documents[1] for r in rows]], torch.zeros(3))
    assert abs(float(ours) - float(theirs)) < 1e-5


def test_mnrl_draws_from_the_other_rows_when_the_batch_has_more(tmp_path):
    rows = [RerankRow(1, f"q{i}", [f"p{i}", f"n{i}"], [1.0, 0.0]) for i in range(5)]
    chosen = in_batch_candidates(rows, torch.Generator().manual_seed(1))
    for row, documents in zip(rows, chosen):
        assert len(documents) == 6 and documents[0] == row.documents[0] and documents[-1] == row.documents[1]
        assert not set(documents[1:-1]) & set(row.documents) and len(set(documents[1:-1])) == 4


def test_every_row_layout(tmp_path):
    opts = DataOptions()
    pointwise = tmp_path / "pointwise.csv"
    pointwise.write_text("query,passage,label\nq one,doc a,1\nq one,doc b,0.25\n", encoding="utf-8")
    assert [(r.query, r.documents, r.labels) for r in read_rerank_rows(str(pointwise), opts, True)] == [
        ("q one", ["doc a"], [1.0]), ("q one", ["doc b"], [0.25])]
    listwise = _write(tmp_path / "listwise.jsonl", [{"query": "q", "documents": ["a", "b"], "labels": [0, 1]}])
    assert read_rerank_rows(str(listwise), opts, True)[0].labels == [0.0, 1.0]
    mined = _write(tmp_path / "mined.jsonl", [{"anchor": "q", "positive": "a", "negative_1": "b", "negative_2": "c"}])
    row = read_rerank_rows(str(mined), opts, True)[0]
    assert (row.query, row.documents, row.labels) == ("q", ["a", "b", "c"], [1.0, 0.0, 0.0])
    lists = _write(tmp_path / "lists.jsonl", [{"query": "q", "positives": ["a"], "negatives": ["b", "c"]}])
    assert read_rerank_rows(str(lists), opts, True)[0].labels == [1.0, 0.0, 0.0]
    renamed = _write(tmp_path / "renamed.jsonl", [{"q": "x", "d": "y", "rel": 1}])
    row = read_rerank_rows(str(renamed), DataOptions(text_column="q", text_pair_column="d", label_column="rel"), True)[0]
    assert (row.query, row.documents, row.labels) == ("x", ["y"], [1.0])


@pytest.mark.parametrize("rows, message", [
    ([{"query": "q", "document": "d", "label": 2}], r"bad.jsonl:1: label: a reranker's label is a number in \[0, 1\]"),
    ([{"query": "q", "documents": ["a", "b"], "labels": [1]}], r"bad.jsonl:1: 'labels' must be a list of one number per document \(2\)"),
    ([{"text": "d", "label": 1}], r"bad.jsonl:1: no query column"),
    ([{"query": "q", "document": "", "label": 1}], r"bad.jsonl:1: document: expected a non-empty text"),
])
def test_bad_rows_are_refused_naming_the_line(tmp_path, rows, message):
    with pytest.raises(BertforgeError, match=message):
        read_rerank_rows(str(_write(tmp_path / "bad.jsonl", rows)), DataOptions(), True)


def test_dev_rows_of_a_query_are_gathered_each_document_once():
    rows = [RerankRow(1, "q", ["a", "b"], [1, 0]), RerankRow(2, "r", ["a"], [1]), RerankRow(3, "q", ["b", "c"], [0, 0])]
    assert by_query(rows) == [[(0, 0), (0, 1), (2, 1)], [(1, 0)]]


@pytest.mark.parametrize("loss, layout", [("bce", "pointwise"), ("mse", "pointwise"), ("listnet", "listwise"),
                                          ("lambdaloss", "listwise"), ("mnrl", "mined")])
def test_a_reranker_learns_with_each_loss(loss, layout, tiny_model, tmp_path):
    """Each loss ranks every query's own document first after a short run on a task a bag of words solves (the
    tiny random model starts below that)."""
    rows = _rows(24)
    data = {"mined": rows, "listwise": _listwise(rows),
            "pointwise": [{"query": r["query"], "document": d, "label": v} for r in rows
                          for d, v in ((r["positive"], 1), (r["negative"], 0), (OFF_TOPIC, 0))]}[layout]
    train = _write(tmp_path / "train.jsonl", data)
    dev = _write(tmp_path / "dev.jsonl", _listwise(_rows(3)))
    summary = finetune(task="rerank", model=str(tiny_model), train=str(train), dev=str(dev), out=str(tmp_path / "out"),
                       loss=loss, epochs=8, batch_size=4, lr=1e-3, warmup_ratio=0.0, progress=False)
    assert summary["main_metric"] == "ndcg@10"
    assert summary["metrics"]["mrr@10"] == 1.0, summary["metrics"]


def test_the_reranker_loads_in_sentence_transformers_with_the_same_scores(tiny_model, tmp_path):
    """The written model is sentence-transformers' CrossEncoder (its sigmoid score), `predict --task rerank`
    ranks with the same scores, and so does `pipeline("rerank")`."""
    from sentence_transformers.cross_encoder import CrossEncoder

    import bertforge

    train = _write(tmp_path / "train.jsonl", _rows(12))
    dev = _write(tmp_path / "dev.jsonl", _listwise(_rows(3)))
    finetune(task="rerank", model=str(tiny_model), train=str(train), dev=str(dev), out=str(tmp_path / "out"),
             epochs=1, batch_size=4, progress=False)
    model = tmp_path / "out" / "model"
    settings = json.loads((model / "config_sentence_transformers.json").read_text())
    assert settings["activation_fn"] == "torch.nn.modules.activation.Sigmoid" and settings["model_type"] == "CrossEncoder"
    documents = [DOCS["john"], DOCS["mary"], OFF_TOPIC]
    theirs = CrossEncoder(str(model)).predict([("where does john live ?", d) for d in documents])
    records = predict("rerank", str(model), [{"query": "where does john live ?", "documents": documents}])
    ours = {r["corpus_id"]: r["score"] for r in records[0]["ranking"]}
    assert [r["corpus_id"] for r in records[0]["ranking"]] == sorted(range(3), key=lambda i: -theirs[i])
    assert max(abs(ours[i] - float(theirs[i])) for i in range(3)) < 1e-5
    ranked = bertforge.pipeline("rerank", model=str(model))("where does john live ?", documents)
    assert max(abs(r["score"] - float(theirs[r["corpus_id"]])) for r in ranked) < 1e-5


def test_mnrl_refuses_rows_that_are_not_positive_then_negatives(tiny_model, tmp_path):
    train = _write(tmp_path / "train.jsonl", _listwise(_rows(6)))
    with pytest.raises(BertforgeError, match=r"train.jsonl:1: --loss mnrl takes rows of a query, its positive"):
        finetune(task="rerank", model=str(tiny_model), train=str(train), dev=str(train), out=str(tmp_path / "out"),
                 loss="mnrl", epochs=1, progress=False)
    assert not (tmp_path / "out").exists()


def test_loss_is_a_reranker_option(tiny_model, tmp_path):
    with pytest.raises(BertforgeError, match="--loss chooses a reranker's loss \\(--task rerank\\), not classification's"):
        finetune(task="classification", model=str(tiny_model), train="t.csv", dev="d.csv", out=str(tmp_path / "o"),
                 loss="bce")


def test_labels_all_alike_are_refused(tiny_model, tmp_path):
    train = _write(tmp_path / "train.jsonl", [{"query": "q", "document": f"d {i}", "label": 1} for i in range(4)])
    with pytest.raises(BertforgeError, match="every document has the label 1.0; a reranker learns from"):
        finetune(task="rerank", model=str(tiny_model), train=str(train), dev=str(train), out=str(tmp_path / "out"),
                 epochs=1, progress=False)


def test_the_commands_train_predict_and_evaluate_a_reranker(tiny_model, tmp_path, capsys):
    """`finetune --task rerank --loss listnet`, then `predict --task rerank` (JSONL rankings) and `evaluate --task
    rerank` on (query, positives, negatives) rows: the same scores, so the same metrics as the run's dev file."""
    from bertforge.cli import main

    rows = _rows(6)
    train = _write(tmp_path / "train.jsonl", _listwise(rows))
    dev = _write(tmp_path / "dev.jsonl", [{"query": r["query"], "positives": [r["positive"]], "negatives": [r["negative"]]}
                                          for r in _rows(3)])
    out = tmp_path / "run"
    assert main(["finetune", "--task", "rerank", "--loss", "listnet", "--model", str(tiny_model), "--train", str(train),
                 "--dev", str(dev), "--out", str(out), "--epochs", "1", "--batch-size", "2", "--no-progress"]) == 0
    run = json.loads((out / "eval.json").read_text())
    assert run["main_metric"] == "ndcg@10" and run["metrics"]["queries"] == 3
    predictions = tmp_path / "ranked.jsonl"
    assert main(["predict", "--task", "rerank", "--model", str(out / "model"), "--input", str(dev), "--out",
                 str(predictions), "--no-progress"]) == 0
    ranked = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [r["query"] for r in ranked] == [r["query"] for r in _rows(3)] and all(len(r["ranking"]) == 2 for r in ranked)
    capsys.readouterr()
    assert main(["evaluate", "--task", "rerank", "--model", str(out / "model"), "--input", str(dev), "--no-progress"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    for name in ("ndcg@10", "mrr@10", "map"):
        assert abs(metrics[name] - run["metrics"][name]) < 1e-6


def test_predict_at_bf16_is_close_to_fp32_and_refused_with_int8(tiny_model, tmp_path):
    """`predict --precision bf16` runs the model under bf16 autocast (scores move by rounding only); int8 with it is
    refused in one line."""
    train = _write(tmp_path / "train.jsonl", _rows(6))
    finetune(task="rerank", model=str(tiny_model), train=str(train), dev=str(train), out=str(tmp_path / "out"),
             epochs=1, progress=False)
    rows = [{"query": "where does john live ?", "documents": [DOCS["john"], DOCS["mary"], OFF_TOPIC]}]
    fp32 = predict("rerank", str(tmp_path / "out" / "model"), rows)[0]["ranking"]
    bf16 = predict("rerank", str(tmp_path / "out" / "model"), rows, precision="bf16")[0]["ranking"]
    by_id = {r["corpus_id"]: r["score"] for r in fp32}
    assert max(abs(r["score"] - by_id[r["corpus_id"]]) for r in bf16) < 1e-2 and bf16 != fp32
    with pytest.raises(BertforgeError, match="--precision bf16 is for float models; --quantize int8 runs int8"):
        predict("rerank", str(tmp_path / "out" / "model"), rows, precision="bf16", quantize="int8")


def test_the_memory_estimate_counts_the_pairs_a_batch_makes():
    """`--batch-size` counts pairs for bce / mse, rows for the listwise losses (each row all its documents) and
    for mnrl (its documents and 4 in-batch negatives): the memory check multiplies the batch by that."""
    from types import SimpleNamespace

    from bertforge.finetune.rerank import Rerank

    rows = [RerankRow(1, "q", ["a", "b", "c"], [1, 0, 0]), RerankRow(2, "r", ["a"], [1])]
    widths = {loss: Rerank().sequences_per_example(rows, SimpleNamespace(loss=loss))
              for loss in (None, "bce", "mse", "listnet", "lambdaloss", "mnrl")}
    assert widths == {None: 1, "bce": 1, "mse": 1, "listnet": 3, "lambdaloss": 3, "mnrl": 7}
