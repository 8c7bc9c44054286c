"""A reranker trained on the STS Benchmark: `bertforge finetune --task rerank` against sentence-transformers'
`CrossEncoderTrainer`, the same recipe on the same data, scored on data the training never saw.

The recipe is sentence-transformers' cross-encoder STS example: the pairs of `tasks/stsb/train.csv` (shared data),
their scores divided by 5 as labels in [0, 1], binary cross-entropy on the one logit (`--loss bce` /
`BinaryCrossEntropyLoss`), batch 16, lr 2e-5, 10 % warm-up, linear decay, `--epochs` passes; both from the same
checkpoint (default all-MiniLM-L6-v2 of the test extra) with a new one-logit head. Each side then scores the pairs
of `tasks/stsb/dev.csv` (the sigmoid of the logit, CrossEncoder's `predict`), and the Spearman and Pearson
correlations with the gold scores are printed — what sentence-transformers' `CrossEncoderCorrelationEvaluator`
reports. Each side runs in a fresh Python process (wall time: training and scoring, model loading included), the
two alternating `--repeats` times with different seeds. A measurement script: it prints numbers and never asserts.

    .venv/bin/python bench/rerank_stsb.py                       # 1 epoch, all-MiniLM-L6-v2
    .venv/bin/python bench/rerank_stsb.py --epochs 2 --repeats 2 --model DIR
"""

from __future__ import annotations

import json
import tempfile
import time

from stsb import DATA, RECIPE, arguments, compare, read_pairs, report


def run_bertforge(model: str, train: list, dev: list, epochs: int, seed: int, out: str) -> list[float]:
    from bertforge.finetune import finetune, predict

    rows = [{"query": a, "document": b, "label": s} for a, b, s in train]
    dev_rows = [{"query": a, "document": b, "label": s} for a, b, s in dev[:200]]  # the run's own dev: a sample
    finetune(task="rerank", model=model, train=rows, dev=dev_rows, out=out, loss="bce", epochs=epochs, seed=seed,
             progress=False, **RECIPE)
    records = predict("rerank", f"{out}/model", [{"query": a, "document": b} for a, b, _ in dev], progress=False)
    return [r["ranking"][0]["score"] for r in records]


def run_sentence_transformers(model: str, train: list, dev: list, epochs: int, seed: int, out: str) -> list[float]:
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    ce = CrossEncoder(model, num_labels=1)
    data = Dataset.from_dict({"sentence1": [a for a, _, _ in train], "sentence2": [b for _, b, _ in train],
                              "score": [s for _, _, s in train]})
    args = CrossEncoderTrainingArguments(output_dir=out, num_train_epochs=epochs, per_device_train_batch_size=16,
                                         learning_rate=RECIPE["lr"], warmup_ratio=RECIPE["warmup_ratio"], seed=seed,
                                         save_strategy="no", report_to="none", logging_steps=1000,
                                         disable_tqdm=True)
    CrossEncoderTrainer(model=ce, args=args, train_dataset=data, loss=BinaryCrossEntropyLoss(ce)).train()
    return [float(s) for s in ce.predict([(a, b) for a, b, _ in dev], show_progress_bar=False)]


def child(side: str, model: str, epochs: int, seed: int, limit: int | None) -> None:
    import torch
    from scipy.stats import pearsonr, spearmanr

    torch.set_num_threads(torch.get_num_threads())
    train, dev = read_pairs(DATA / "train.csv", limit), read_pairs(DATA / "dev.csv", None)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        run = run_bertforge if side == "bertforge" else run_sentence_transformers
        scores = run(model, train, dev, epochs, seed, out)
    gold = [s for _, _, s in dev]
    print(json.dumps({"side": side, "seconds": time.perf_counter() - started,
                      "spearman": float(spearmanr(scores, gold)[0]), "pearson": float(pearsonr(scores, gold)[0])}))


def main() -> None:
    args = arguments(__doc__.split("\n\n")[0], ("bertforge", "sentence-transformers"))
    if args.child:
        child(args.child, args.model, args.epochs, args.seed, args.limit)
        return
    results = compare(__file__, ("bertforge", "sentence-transformers"), args)
    report(f"STS Benchmark reranker, {args.epochs} epoch(s) on {args.limit or 5749} train pairs, scored on the 1,500 "
           f"dev pairs; medians of {args.repeats} run(s)", results)


if __name__ == "__main__":
    main()
