"""Sentence embeddings trained on the STS Benchmark with CoSENT: `bertforge train-embeddings --loss cosent` against
sentence-transformers' `SentenceTransformerTrainer` with `CoSENTLoss`, the same recipe on the same data, scored on
data the training never saw.

The recipe is sentence-transformers' STS training example: the pairs of `tasks/stsb/train.csv` (shared data), their
scores divided by 5 as labels in [0, 1], CoSENT (scale 20) on the cosine of the two mean-pooled embeddings, batch 16,
lr 2e-5, 10 % warm-up, linear decay, `--epochs` passes; both from the same checkpoint (default all-MiniLM-L6-v2 of
the test extra). Each side then embeds the pairs of `tasks/stsb/dev.csv`, and the Spearman and Pearson correlations
of their cosines with the gold scores are printed: what sentence-transformers' `EmbeddingSimilarityEvaluator`
reports, measured here by the same code for both sides (and for the starting checkpoint, the baseline). Each side
runs in a fresh Python process (wall time: training and scoring, model loading included), the two alternating
`--repeats` times with different seeds. A measurement script: it prints numbers and never asserts.

    .venv/bin/python bench/cosent_stsb.py                       # 1 epoch, all-MiniLM-L6-v2
    .venv/bin/python bench/cosent_stsb.py --epochs 2 --repeats 2 --model DIR
"""

from __future__ import annotations

import json
import tempfile
import time

from stsb import DATA, RECIPE, arguments, compare, launch, read_pairs, report


def cosines(embed, dev: list) -> list[float]:
    """The cosine of each dev pair's two embeddings (`embed(texts)`: an [n, d] array)."""
    import numpy as np

    a, b = embed([x for x, _, _ in dev]), embed([y for _, y, _ in dev])
    a, b = a / np.linalg.norm(a, axis=1, keepdims=True), b / np.linalg.norm(b, axis=1, keepdims=True)
    return [float(v) for v in (a * b).sum(1)]


def run_bertforge(model: str, train: list, dev: list, epochs: int, seed: int, out: str) -> list[float]:
    import bertforge
    from bertforge.embeddings_train.api import train_embeddings

    rows = [{"sentence1": a, "sentence2": b, "score": s} for a, b, s in train]
    train_embeddings(model=model, train=rows, out=out, loss="cosent", epochs=epochs, seed=seed, progress=False,
                     **RECIPE)
    embed = bertforge.pipeline("embed", model=out)
    return cosines(embed, dev)


def run_sentence_transformers(model: str, train: list, dev: list, epochs: int, seed: int, out: str) -> list[float]:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import CoSENTLoss

    st = SentenceTransformer(model, device="cpu")
    data = Dataset.from_dict({"sentence1": [a for a, _, _ in train], "sentence2": [b for _, b, _ in train],
                              "score": [s for _, _, s in train]})
    args = SentenceTransformerTrainingArguments(output_dir=out, num_train_epochs=epochs, per_device_train_batch_size=16,
                                                learning_rate=RECIPE["lr"], warmup_ratio=RECIPE["warmup_ratio"],
                                                seed=seed, save_strategy="no", report_to="none", logging_steps=1000,
                                                disable_tqdm=True)
    SentenceTransformerTrainer(model=st, args=args, train_dataset=data, loss=CoSENTLoss(st)).train()
    return cosines(lambda texts: st.encode(texts, show_progress_bar=False), dev)


def run_baseline(model: str, train: list, dev: list, epochs: int, seed: int, out: str) -> list[float]:
    import bertforge

    return cosines(bertforge.pipeline("embed", model=model), dev)


def child(side: str, model: str, epochs: int, seed: int, limit: int | None) -> None:
    from scipy.stats import pearsonr, spearmanr

    train, dev = read_pairs(DATA / "train.csv", limit), read_pairs(DATA / "dev.csv", None)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        run = {"bertforge": run_bertforge, "sentence-transformers": run_sentence_transformers,
               "untrained": run_baseline}[side]
        scores = run(model, train, dev, epochs, seed, out)
    gold = [s for _, _, s in dev]
    print(json.dumps({"side": side, "seconds": time.perf_counter() - started,
                      "spearman": float(spearmanr(scores, gold)[0]), "pearson": float(pearsonr(scores, gold)[0])}))


def main() -> None:
    args = arguments(__doc__.split("\n\n")[0], ("bertforge", "sentence-transformers", "untrained"))
    if args.child:
        child(args.child, args.model, args.epochs, args.seed, args.limit)
        return
    baseline = launch(__file__, "untrained", 0, args)
    results = compare(__file__, ("bertforge", "sentence-transformers"), args)
    report(f"STS Benchmark bi-encoder, CoSENT, {args.epochs} epoch(s) on {args.limit or 5749} train pairs, scored on "
           f"the 1,500 dev pairs; medians of {args.repeats} run(s)", results, baseline)


if __name__ == "__main__":
    main()
