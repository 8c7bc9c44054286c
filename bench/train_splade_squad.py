"""SPLADE training on real question → paragraph pairs: bertforge (`train-embeddings --sparse splade`) against
sentence-transformers' `SparseEncoderTrainer` (SpladeLoss around SparseMultipleNegativesRankingLoss, its
regularizer-weight scheduler, no-duplicates batches) with the same recipe, from the same masked-LM checkpoint.

The pairs are `bench/train_embeddings_squad.py`'s: the questions of the partial SQuAD 2.0 dev file in
/work/shared/data with their paragraphs, the first four articles to train, the fifth held out. Both outputs are
scored the same way, by bertforge's retrieval evaluator (sentence-transformers' `InformationRetrievalEvaluator`'s
numbers) on the sparse dot product: each distinct held-out question ranks the held-out paragraphs. Printed: the
metrics before and after each, the mean non-zero count of the query and paragraph vectors, the wall time of each
training (noisy on a shared machine).

    python bench/train_splade_squad.py --model DIR                  # a checkpoint with an MLM head
    python bench/train_splade_squad.py --model DIR --epochs 1 --batch-size 32 --max-length 128
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_embeddings_squad import SQUAD, write_pairs  # noqa: E402


def score(model_dir: Path, dev: Path, max_length: int) -> dict[str, float]:
    """Retrieval metrics of a SparseEncoder directory on the held-out pairs, and its vectors' non-zero counts."""
    import torch

    import bertforge
    from bertforge.embeddings_train.data import read_pairs
    from bertforge.embeddings_train.evaluation import retrieval_set
    from bertforge.evaluation import evaluators

    data = retrieval_set(read_pairs(dev))
    sparse = bertforge.pipeline("sparse", model=model_dir, max_length=max_length, progress=False)
    queries, documents = sparse(data.queries), sparse(data.corpus)
    metrics = evaluators.evaluate_retrieval(lambda texts: torch.from_numpy(queries), lambda texts: iter(documents),
                                            data, sparse=True)
    return {**{k: v for k, v in metrics.items() if k not in ("queries", "documents")},
            "query_nonzero": float((queries != 0).sum(1).mean()), "document_nonzero": float((documents != 0).sum(1).mean())}


def train_bertforge(args: argparse.Namespace, train: Path, out: Path) -> float:
    from bertforge.embeddings_train import train_embeddings

    started = time.perf_counter()
    train_embeddings(model=args.model, train=str(train), out=str(out), overwrite=True, sparse="splade",
                     epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, warmup_ratio=args.warmup_ratio,
                     max_length=args.max_length, query_regularizer=args.query_regularizer,
                     document_regularizer=args.document_regularizer, seed=args.seed, progress=False)
    return time.perf_counter() - started


def train_sentence_transformers(args: argparse.Namespace, train: Path, out: Path) -> float:
    import csv

    from datasets import Dataset
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder import SparseEncoderTrainer, SparseEncoderTrainingArguments, losses
    from sentence_transformers.base.sampler import BatchSamplers

    with train.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    dataset = Dataset.from_dict({"query": [r["query"] for r in rows], "passage": [r["passage"] for r in rows]})
    model = SparseEncoder(args.model, device="cpu")
    model.max_seq_length = args.max_length
    loss = losses.SpladeLoss(model, losses.SparseMultipleNegativesRankingLoss(model),
                             document_regularizer_weight=args.document_regularizer,
                             query_regularizer_weight=args.query_regularizer)
    training = SparseEncoderTrainingArguments(
        output_dir=str(out.parent / "st_checkpoints"), num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size, learning_rate=args.lr, warmup_ratio=args.warmup_ratio,
        weight_decay=0.01, max_grad_norm=1.0, batch_sampler=BatchSamplers.NO_DUPLICATES, seed=args.seed,
        save_strategy="no", logging_steps=10, report_to=[], use_cpu=True)
    started = time.perf_counter()
    SparseEncoderTrainer(model=model, args=training, train_dataset=dataset, loss=loss).train()
    seconds = time.perf_counter() - started
    model.save(str(out))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="starting model directory (with an MLM head)")
    parser.add_argument("--work", default="/tmp/bertforge_splade_bench", help="where the pairs and the runs go")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--query-regularizer", type=float, default=5e-5)
    parser.add_argument("--document-regularizer", type=float, default=3e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--sides", default="bertforge,sentence-transformers")
    args = parser.parse_args()

    work = Path(args.work)
    train, dev = write_pairs(SQUAD, work)
    results: dict[str, dict] = {"before": {"metrics": score(Path(args.model), dev, args.max_length)}}
    for side in args.sides.split(","):
        out = work / side
        run = train_bertforge if side == "bertforge" else train_sentence_transformers
        seconds = run(args, train, out)
        results[side] = {"seconds": round(seconds, 1), "metrics": score(out, dev, args.max_length)}
    names = list(results["before"]["metrics"])
    print(f"{'metric':<17}" + "".join(f"{side:>22}" for side in results))
    for name in names:
        print(f"{name:<17}" + "".join(f"{r['metrics'][name]:22.4f}" for r in results.values()))
    print(f"{'training seconds':<17}" + "".join(f"{r.get('seconds', 0):22.1f}" for r in results.values()))
    (work / "results.json").write_text(json.dumps({"settings": vars(args), **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
