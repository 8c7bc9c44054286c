"""Train sentence embeddings on real question → paragraph pairs and report retrieval before and after.

The pairs are the questions of the partial SQuAD 2.0 dev file in /work/shared/data (5 articles, 1,407 questions,
173 paragraphs), each paired with its paragraph; answerable and unanswerable questions alike are about their
paragraph. The file is split by article: the first four train, the last one (Victoria (Australia)) is the held-out
dev set, so no dev paragraph is seen in training. Retrieval on dev: each distinct question ranks every dev
paragraph (MRR@10, NDCG@10, recall@k), as `bertforge train-embeddings` reports it in `eval.json`.

    python bench/train_embeddings_squad.py --model path/to/all-MiniLM-L6-v2 --work /tmp/emb
    python bench/train_embeddings_squad.py --model DIR --batch-size 128 --mini-batch-size 32 --epochs 1

Prints the metrics before and after training and the wall time, and writes WORK/results.json. Short runs only:
on the shared 2-core machine one epoch of all-MiniLM-L6-v2 at 128 tokens takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SQUAD = Path("/work/shared/data/tasks/squad/dev-v2.0-first5articles.json")


def write_pairs(squad: Path, work: Path) -> tuple[Path, Path]:
    """train.tsv (the first four articles) and dev.tsv (the last), `question<TAB>paragraph` with a header."""
    articles = json.loads(squad.read_text(encoding="utf-8"))["data"]

    def rows(selected: list[dict]) -> str:
        lines = ["query\tpassage"]
        for article in selected:
            for paragraph in article["paragraphs"]:
                context = " ".join(paragraph["context"].split())  # no tab or line end inside a TSV field
                lines += [f"{' '.join(qa['question'].split())}\t{context}" for qa in paragraph["qas"]
                          if qa["question"].strip()]
        return "\n".join(lines) + "\n"

    work.mkdir(parents=True, exist_ok=True)
    (work / "train.tsv").write_text(rows(articles[:-1]), encoding="utf-8")
    (work / "dev.tsv").write_text(rows(articles[-1:]), encoding="utf-8")
    return work / "train.tsv", work / "dev.tsv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="starting model directory")
    parser.add_argument("--work", default="/tmp/bertforge_embeddings_bench", help="where the pairs and the run go")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--mini-batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()

    from bertforge.embeddings_train import train_embeddings

    work = Path(args.work)
    train, dev = write_pairs(SQUAD, work)
    started = time.perf_counter()
    summary = train_embeddings(model=args.model, train=str(train), dev=str(dev), out=str(work / "model"),
                               overwrite=True, epochs=args.epochs, batch_size=args.batch_size,
                               mini_batch_size=args.mini_batch_size, lr=args.lr, max_length=args.max_length,
                               eval_batch_size=32)
    seconds = time.perf_counter() - started
    before, after = summary["before"], summary["best"]["metrics"]
    print(f"{'metric':<10} {'before':>8} {'after':>8}")
    for name in before:
        print(f"{name:<10} {before[name]:8.4f} {after[name]:8.4f}")
    print(f"{summary['train_steps']} steps, {seconds:.0f} s in all (training {summary['train_seconds']:.0f} s)")
    result = {"model": args.model, "settings": vars(args), "before": before, "after": after,
              "steps": summary["train_steps"], "seconds": round(seconds, 1)}
    (work / "results.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
