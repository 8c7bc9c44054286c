"""Helpers of the evaluation tests: small synthetic evaluation sets written to tmp dirs (scored pairs, a BEIR
folder, reranking rows), and a tiny random cross-encoder with MiniLM's tokenizer."""

from __future__ import annotations

import csv
import json
import random
import shutil
from pathlib import Path

import pytest
import torch

TOPICS = {
    "sea": "lobster crab tide reef fish coral shell wave harbour boat".split(),
    "space": "planet orbit rocket star comet moon galaxy telescope launch crater".split(),
    "food": "bread cheese soup oven spice garlic honey pepper flour butter".split(),
    "music": "guitar drum melody choir violin chord rhythm piano concert song".split(),
    "sport": "goal match runner race team coach ball score league stadium".split(),
}
FILLER = "the a of and with near about over under very".split()


def sentence(rng: random.Random, topic: str, n: int = 8) -> str:
    words = [rng.choice(TOPICS[topic]) if rng.random() < 0.6 else rng.choice(FILLER) for _ in range(n)]
    return " ".join(words).capitalize() + "."


def write_sts(path: Path, n: int = 40, seed: int = 0, header: bool = True) -> tuple[list[str], list[str], list[float]]:
    """Scored pairs: same-topic pairs score high, others low, with noise; CSV with or without a header."""
    rng = random.Random(seed)
    first, second, scores = [], [], []
    topics = list(TOPICS)
    for _ in range(n):
        a, b = rng.choice(topics), rng.choice(topics)
        first.append(sentence(rng, a, rng.randint(4, 12)))
        second.append(sentence(rng, b, rng.randint(4, 12)))
        scores.append(round((4.0 if a == b else 1.0) + rng.uniform(-1, 1), 2))
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        if header:
            writer.writerow(["sentence1", "sentence2", "score"])
        writer.writerows(zip(first, second, scores))
    return first, second, scores


def write_beir(folder: Path, documents: int = 150, queries: int = 24, seed: int = 0) -> Path:
    """A BEIR folder: documents about five topics, queries each relevant to a few documents of their topic (a
    relevant id absent from the corpus and a judged-irrelevant row included, as real qrels have)."""
    rng = random.Random(seed)
    topics = list(TOPICS)
    folder.mkdir(parents=True, exist_ok=True)
    docs = []
    for i in range(documents):
        topic = topics[i % len(topics)]
        docs.append({"_id": f"d{i}", "title": rng.choice(["", topic.title()]), "text": sentence(rng, topic, rng.randint(5, 30)),
                     "topic": topic})
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    rows = ["query-id\tcorpus-id\tscore"]
    qs = []
    for q in range(queries):
        topic = topics[q % len(topics)]
        qs.append({"_id": f"q{q}", "text": sentence(rng, topic, 5)})
        same = [d["_id"] for d in docs if d["topic"] == topic]
        for doc in rng.sample(same, rng.randint(1, 4)):
            rows.append(f"q{q}\t{doc}\t1")
        rows.append(f"q{q}\t{rng.choice(same)}\t0")  # judged, not relevant
    rows.append("q0\tmissing-doc\t1")
    qs.append({"_id": "unjudged", "text": "a query without judgements"})
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs), encoding="utf-8")
    (folder / "qrels").mkdir(exist_ok=True)
    (folder / "qrels" / "test.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


def beir_for_st(folder: Path) -> tuple[dict[str, str], dict[str, str], dict[str, set[str]]]:
    """The same folder as sentence-transformers' evaluator takes it: queries, corpus (title and text joined by a
    space, as BEIR's retrievers do) and relevant documents (score above 0)."""
    corpus = {}
    for line in (folder / "corpus.jsonl").read_text().splitlines():
        d = json.loads(line)
        corpus[d["_id"]] = f"{d['title']} {d['text']}".strip()
    queries = {json.loads(line)["_id"]: json.loads(line)["text"] for line in (folder / "queries.jsonl").read_text().splitlines()}
    relevant: dict[str, set[str]] = {}
    for line in (folder / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        q, d, s = line.split("\t")
        if int(s) > 0:
            relevant.setdefault(q, set()).add(d)
    return queries, corpus, relevant


def write_rerank_rows(path: Path, queries: int = 12, seed: int = 0) -> list[dict]:
    """JSONL rows (query, positive list, negative list); two rows share a query (merged by the reader)."""
    rng = random.Random(seed)
    topics = list(TOPICS)
    rows = []
    for q in range(queries):
        topic = topics[q % len(topics)]
        others = [t for t in topics if t != topic]
        rows.append({"query": sentence(rng, topic, 5),
                     "positive": [sentence(rng, topic) for _ in range(rng.randint(1, 3))],
                     "negative": [sentence(rng, rng.choice(others)) for _ in range(rng.randint(3, 8))]})
    rows.append({"query": rows[0]["query"], "positive": [], "negative": [sentence(rng, "space")]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return rows


def cross_encoder_dir(root: Path, tokenizer_dir: Path) -> Path:
    """A tiny random transformers BertForSequenceClassification (one label) with MiniLM's tokenizer."""
    transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[test]'")
    torch.manual_seed(1)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=512, num_labels=1,
                                     initializer_range=0.5)  # spread scores: an order not set by rounding
    out = root / "cross_encoder"
    transformers.BertForSequenceClassification(config).eval().save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out / name)
    return out
