"""The best model per CPU-hour: bertforge's pretraining recipe against `transformers`' Trainer, same model size,
same data, same wall time (or twice it for transformers), scored on the same held-out text with the same masks,
then fine-tuned on the same SST-2 subset. Method, data and choices: bench/README.md.

    .venv/bin/python bench/pretrain_quality.py --minutes 60                     # transformers gets 120 minutes
    .venv/bin/python bench/pretrain_quality.py --minutes 2 --config tiny --batch-size 16 --work /tmp/pq   # smoke run

Writes WORK/results.json, WORK/results.md (the tables) and WORK/curves.png (held-out MLM loss and accuracy against
wall minutes). Needs the `bench` extra (transformers, accelerate) and /work/shared/data (or $BERTFORGE_DATA).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(os.environ.get("BERTFORGE_DATA", "/work/shared/data"))
GUTENBERG = DATA / "corpora" / "gutenberg"
# Held out by whole documents (whole books), fixed: one book of each of three authors the training text also has
# (Austen, Chesterton, Shakespeare), so the held-out text is in the training distribution but never trained on.
HELD_OUT = ("austen-persuasion.txt", "chesterton-brown.txt", "shakespeare-macbeth.txt")
SST2 = DATA / "tasks" / "sst2"

# bertforge's side: the recipe proposed as the best model per CPU-hour (docs/guides/pretraining.md; reasons
# in bench/README.md). Not yet measured at 60 minutes on an idle machine.
RECIPE = dict(config="mini", max_length=128, batch_size=32, lr=5e-4, warmup_steps=300, decay="wsd", decay_ratio=0.2,
              objective="mlm", weight_decay=0.01)
# fine-tuning both final models: the same settings for both
FINETUNE = dict(epochs=1, batch_size=32, lr=1e-4, warmup_ratio=0.1, max_length=64, seed=42)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, required=True, help="bertforge's training wall time")
    p.add_argument("--reference-minutes", type=float, default=None, help="transformers' (default 2 x --minutes)")
    p.add_argument("--checkpoint-minutes", type=float, default=None,
                   help="both sides checkpoint at every multiple of this (default --minutes / 6)")
    p.add_argument("--work", type=Path, default=Path("runs/pretrain_quality"), help="working directory")
    p.add_argument("--config", default=RECIPE["config"], help="model size (a bertforge preset), both sides")
    p.add_argument("--max-length", type=int, default=RECIPE["max_length"])
    p.add_argument("--batch-size", type=int, default=RECIPE["batch_size"])
    p.add_argument("--lr", type=float, default=RECIPE["lr"], help="bertforge's peak learning rate")
    p.add_argument("--warmup-steps", type=int, default=RECIPE["warmup_steps"], help="bertforge's warmup")
    p.add_argument("--vocab-size", type=int, default=16000, help="the shared WordPiece vocabulary")
    p.add_argument("--eval-instances", type=int, default=2000, help="held-out sequences (fixed masks)")
    p.add_argument("--sst2-rows", type=int, default=4000, help="SST-2 training rows for fine-tuning")
    p.add_argument("--sides", default="bertforge,transformers", help="which sides to train (scoring takes all found)")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="use this saved vocabulary (an earlier sitting's) instead of training one in WORK/tokenizer")
    p.add_argument("--previous", type=Path, default=None,
                   help="results.json of an earlier sitting on the same vocabulary and held-out masks: its scored "
                        "checkpoints and SST-2 scores of the sides not trained now are kept")
    a = p.parse_args()
    for name in ("minutes", "reference_minutes", "checkpoint_minutes"):
        if getattr(a, name) is not None and not 0 < getattr(a, name) < float("inf"):
            p.error(f"--{name.replace('_', '-')} must be a positive number of minutes")
    unknown = set(filter(None, a.sides.split(","))) - {"bertforge", "transformers"}
    if unknown:
        p.error(f"--sides: unknown side(s) {', '.join(sorted(unknown))}; choose from bertforge, transformers")
    a.reference_minutes = a.reference_minutes or 2 * a.minutes
    a.checkpoint_minutes = a.checkpoint_minutes or a.minutes / 6
    return a


def corpus_files() -> tuple[list[str], list[str]]:
    """(training files, held-out files): the Gutenberg books less HELD_OUT, with Tiny Shakespeare; HELD_OUT."""
    if not GUTENBERG.is_dir():
        raise SystemExit(f"{GUTENBERG} not found: set BERTFORGE_DATA to the shared data directory")
    train = sorted(str(p) for p in GUTENBERG.glob("*.txt") if p.name not in HELD_OUT)
    return train + [str(DATA / "corpora" / "tinyshakespeare.txt")], [str(GUTENBERG / name) for name in HELD_OUT]


def run_args(a: argparse.Namespace, **settings):
    """`PretrainArgs` of the data side of the run (sequence length, MLM alone), for the tokenizer and the data."""
    from bertforge.pretrain.args import PretrainArgs

    base = dict(max_length=a.max_length, batch_size=a.batch_size, objective="mlm", nsp=False, vocab_size=a.vocab_size,
                progress=False, demo=False)
    return PretrainArgs(**{**base, **settings})


def shared_tokenizer(a: argparse.Namespace, train: list[str]) -> Path:
    """One WordPiece vocabulary trained by bertforge on the training files, saved once in WORK/tokenizer and used by
    both sides (transformers reads the same files with BertTokenizerFast); the two must agree on a sample."""
    from transformers import BertTokenizerFast

    from bertforge.pretrain.data import train_run_tokenizer
    from bertforge.tokenizer import Tokenizer

    path = a.tokenizer or a.work / "tokenizer"
    if a.tokenizer is not None and not (path / "tokenizer.json").is_file():
        raise SystemExit(f"--tokenizer {path}: no tokenizer.json there (a saved vocabulary's directory is expected)")
    if a.tokenizer is None and (not (path / "tokenizer.json").is_file()
                                or Tokenizer.from_pretrained(path).vocab_size != a.vocab_size):
        train_run_tokenizer(run_args(a), train).save_pretrained(path)
    ours, theirs = Tokenizer.from_pretrained(path), BertTokenizerFast.from_pretrained(path)
    sample = Path(train[0]).read_text(encoding="latin-1").splitlines()[:200]
    if ours(sample)["input_ids"] != theirs(sample)["input_ids"]:
        raise SystemExit(f"{path}: bertforge and BertTokenizerFast tokenize differently")
    return path


def train_bertforge(a: argparse.Namespace, train: list[str], tokenizer: Path) -> Path:
    """`bertforge pretrain` (the command, in its own process) with the recipe, for --minutes of training time."""
    out = a.work / "bertforge"
    cmd = [sys.executable, "-m", "bertforge", "pretrain", "--corpus", *train, "--tokenizer", str(tokenizer),
           "--out", str(out), "--overwrite", "--device", "cpu", "--config", a.config, "--max-length", str(a.max_length),
           "--batch-size", str(a.batch_size), "--lr", str(a.lr), "--warmup-steps", str(a.warmup_steps),
           "--decay", RECIPE["decay"], "--decay-ratio", str(RECIPE["decay_ratio"]), "--objective", RECIPE["objective"],
           "--weight-decay", str(RECIPE["weight_decay"]), "--max-minutes", str(a.minutes),
           "--save-every-minutes", str(a.checkpoint_minutes), "--save-every", str(10**9), "--keep-checkpoints", "1000",
           "--log-every", "20"]
    print("bertforge:", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)
    return out


def training_sequences(a: argparse.Namespace, train: list[str], tokenizer: Path) -> list[dict[str, list[int]]]:
    """One epoch of the sequences bertforge trains on (its own data pipeline: MLM-only full-sentence packing of
    --max-length tokens), unmasked, for transformers' collator to mask."""
    from bertforge.pretrain.data import pretraining_stream
    from bertforge.tokenizer import Tokenizer

    stream = pretraining_stream(run_args(a), train, Tokenizer.from_pretrained(tokenizer), 0, 1, a.batch_size,
                                max_epochs=1)
    try:
        return [{"input_ids": list(i.input_ids)} for i in stream.next_instances(10**9)]
    finally:
        stream.close()


def hf_model(a: argparse.Namespace, tokenizer: Path):
    """transformers' BertForMaskedLM of the size bertforge trains (bertforge's preset, written as config.json)."""
    from transformers import BertConfig as HFConfig, BertForMaskedLM

    from bertforge import BertConfig
    from bertforge.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(tokenizer)
    config = BertConfig.preset(a.config, vocab_size=tok.vocab_size, pad_token_id=tok.pad_token_id)
    config.save_pretrained(a.work / "model_config")
    return BertForMaskedLM(HFConfig.from_pretrained(a.work / "model_config"))


def wall_clock_callback(minutes: float, every_minutes: float | None, times: list[dict]):
    """A TrainerCallback: checkpoints at every multiple of `every_minutes` of training time and at the end, training
    stopped after `minutes`; (step, seconds) of each checkpoint appended to `times`."""
    from transformers import TrainerCallback

    class WallClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.start, self.marks = time.perf_counter(), 0

        def on_step_end(self, args, state, control, **kwargs):
            elapsed = time.perf_counter() - self.start
            if every_minutes is not None and elapsed >= (self.marks + 1) * 60 * every_minutes:
                self.marks = int(elapsed // (60 * every_minutes))
                control.should_save = True
            if elapsed >= 60 * minutes:
                control.should_training_stop = control.should_save = True
            if state.global_step >= state.max_steps:
                control.should_save = True
            if control.should_save:
                times.append({"step": state.global_step, "seconds": elapsed})
            return control

    return WallClock()


def hf_trainer(a: argparse.Namespace, out: Path, tokenizer: Path, data: list, max_steps: int, callbacks: list):
    """transformers' Trainer as its documentation sets it up for MLM: DataCollatorForLanguageModeling (0.15),
    TrainingArguments' defaults (AdamW, lr 5e-5, linear decay, no warmup, weight decay 0) but for the batch size,
    the length and the wall-clock checkpoints."""
    from transformers import BertTokenizerFast, DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = BertTokenizerFast.from_pretrained(tokenizer)
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=a.batch_size, max_steps=max_steps,
                             save_strategy="no", logging_steps=20, report_to="none", use_cpu=True)
    return Trainer(model=hf_model(a, tokenizer), args=args, train_dataset=data, processing_class=tok,
                   data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=0.15), callbacks=callbacks)


def hf_seconds_per_step(a: argparse.Namespace, tokenizer: Path, data: list, steps: int = 30, untimed: int = 5) -> float:
    """transformers' time per step, from a short untimed run of a throwaway model (the first `untimed` steps not
    timed: they run slower, and with 12 steps of which 2 untimed the estimate came out 2.32 s where the run then
    took 1.92-2.0 s a step, which would have ended its schedule some 20 minutes before its time)."""
    from transformers import TrainerCallback

    marks: list[float] = []

    class Timer(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            marks.append(time.perf_counter())

    hf_trainer(a, a.work / "transformers_calibration", tokenizer, data, steps, [Timer()]).train()
    return (marks[-1] - marks[untimed - 1]) / (len(marks) - untimed)


def train_transformers(a: argparse.Namespace, train: list[str], tokenizer: Path) -> Path:
    """Trainer for --reference-minutes: its linear schedule given the length that fits (timed beforehand), so that
    it decays to 0 at the time limit; stopped there by the callback in any case."""
    out = a.work / "transformers"
    data = training_sequences(a, train, tokenizer)
    per_step = hf_seconds_per_step(a, tokenizer, data)
    max_steps = max(1, int(60 * a.reference_minutes / per_step))
    print(f"transformers: {len(data)} sequences an epoch; {per_step:.2f} s a step, so --max-steps {max_steps} for "
          f"{a.reference_minutes:g} minutes", flush=True)
    times: list[dict] = []
    clock = wall_clock_callback(a.reference_minutes, a.checkpoint_minutes, times)
    hf_trainer(a, out, tokenizer, data, max_steps, [clock]).train()
    (out / "times.json").write_text(json.dumps(times, indent=1) + "\n", encoding="utf-8")
    return out


def checkpoints(work: Path) -> list[dict]:
    """Every saved checkpoint of both sides: side, step, training seconds, directory."""
    found = []
    for path in sorted((work / "bertforge" / "checkpoints").glob("step-*")):
        clock = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))["clock"]
        found.append({"side": "bertforge", "step": int(path.name[5:]), "seconds": clock["seconds"], "dir": path})
    times_file = work / "transformers" / "times.json"
    times = json.loads(times_file.read_text(encoding="utf-8")) if times_file.is_file() else []
    for row in times:
        path = work / "transformers" / f"checkpoint-{row['step']}"
        if path.is_dir():
            found.append({"side": "transformers", "step": row["step"], "seconds": row["seconds"], "dir": path})
    return sorted(found, key=lambda r: (r["side"], r["seconds"]))


def held_out_set(a: argparse.Namespace, held_out: list[str], tokenizer: Path) -> tuple[list[dict], str]:
    """Pretraining's fixed evaluation set of the held-out books (the same sequences and masks for every checkpoint)
    and its fingerprint (a SHA-256 of its tokens and targets), which sittings compare before their numbers are put
    side by side."""
    import hashlib

    from bertforge.pretrain.eval import build_eval_set
    from bertforge.tokenizer import Tokenizer

    settings = run_args(a, eval_corpus=held_out, eval_max_instances=a.eval_instances, batch_size=64)
    batches = build_eval_set(settings, [], Tokenizer.from_pretrained(tokenizer))
    digest = hashlib.sha256()
    for batch in batches:
        digest.update(batch["input_ids"].numpy().tobytes() + batch["labels"].numpy().tobytes())
    return batches, digest.hexdigest()


def score(batches: list[dict], found: list[dict]) -> None:
    """Held-out MLM loss, perplexity and accuracy of every checkpoint on `batches`, both sides loaded by
    bertforge's one loader as a BertForMaskedLM."""
    from tqdm import tqdm

    from bertforge.model.checkpoint import load_pretrained
    from bertforge.model import BertForMaskedLM
    from bertforge.pretrain.eval import HeldOutEvaluation
    from bertforge.core.system import setup_runtime

    evaluation = HeldOutEvaluation(batches, 1, None, setup_runtime("cpu", training=False), contextlib.nullcontext,
                                   False)
    for row in tqdm(found, desc="scoring checkpoints"):
        row.update(evaluation.evaluate(load_pretrained(BertForMaskedLM, row["dir"], quiet=True)))
    for side in ("bertforge", "transformers"):  # the scoring itself, against transformers' own forward
        last = [r for r in found if r["side"] == side][-1:]
        if last:
            check_scoring(last[0]["dir"], batches[0], evaluation)


def check_scoring(directory: Path, batch: dict, evaluation) -> None:
    """The held-out loss of one batch, bertforge's loader and model against `transformers.BertForMaskedLM` loading
    the same checkpoint; stop if they differ (a weight the loader missed would show here)."""
    import torch
    from transformers import BertForMaskedLM as HFMaskedLM

    from bertforge.model.checkpoint import load_pretrained
    from bertforge.model import BertForMaskedLM
    from bertforge.pretrain.eval import HeldOutEvaluation

    model = HFMaskedLM.from_pretrained(directory).eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       token_type_ids=batch["token_type_ids"]).logits
    labels = batch["labels"]
    theirs = torch.nn.functional.cross_entropy(logits[labels != -100], labels[labels != -100]).item()
    one = HeldOutEvaluation([batch], 1, None, evaluation.rt, contextlib.nullcontext, False)
    ours = one.evaluate(load_pretrained(BertForMaskedLM, directory, quiet=True))["eval_loss"]
    if abs(ours - theirs) > 1e-4 * max(1.0, abs(theirs)):
        raise SystemExit(f"{directory}: held-out loss {ours} (bertforge) but {theirs} (transformers) on one batch")
    print(f"scoring checked against transformers on {directory.name}: {ours:.6f} / {theirs:.6f}")


def sst2_files(a: argparse.Namespace) -> tuple[Path, Path]:
    """The first --sst2-rows rows of SST-2's train.tsv and the first 500 of dev.tsv, in WORK (read, not changed)."""
    made = []
    for name, rows in (("train", a.sst2_rows), ("dev", 500)):
        lines = (SST2 / f"{name}.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
        path = a.work / "sst2" / f"{name}-{rows}.tsv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(lines[: rows + 1]), encoding="utf-8")
        made.append(path)
    return made[0], made[1]


def finetune_sst2(a: argparse.Namespace, models: dict[str, Path]) -> dict[str, dict]:
    """Each model fine-tuned with bertforge's finetune on the SST-2 subset (FINETUNE, the same for all) and scored
    on SST-2's test.tsv (GLUE's dev set, 872 sentences)."""
    from bertforge.finetune import evaluate, finetune

    train, dev = sst2_files(a)
    results = {}
    for name, model in models.items():
        out = a.work / "finetune" / name.replace(" ", "_").replace("@", "at")
        started = time.perf_counter()
        finetune(task="classification", model=str(model), train=str(train), dev=str(dev), out=str(out),
                 overwrite=True, device="cpu", progress=True, **FINETUNE)
        test = evaluate("classification", out / "model", SST2 / "test.tsv", device="cpu")
        results[name] = {"model": str(model), "accuracy": test["accuracy"],
                         "seconds": round(time.perf_counter() - started, 1)}
    return results


def previous_sitting(a: argparse.Namespace, sides: set[str]) -> tuple[list[dict], dict[str, dict], dict]:
    """From --previous: the scored checkpoints and SST-2 results of the sides not trained in this sitting, and that
    sitting's record (its fingerprint of the held-out set, settings, load, date)."""
    if a.previous is None:
        return [], {}, {}
    try:
        old = json.loads(a.previous.read_text(encoding="utf-8"))
        rows = [r for r in old["checkpoints"] if r["side"] not in sides]
        sst2 = {name: r for name, r in old["sst2"].items() if name.split(" ")[0] not in sides}
        record = {"eval_fingerprint": old["eval_fingerprint"],
                  **{k: old.get(k) for k in ("settings", "load_average_at_start", "date")}}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError, KeyError) as err:
        raise SystemExit(f"--previous {a.previous}: not an earlier sitting's results.json with an eval_fingerprint "
                         f"({type(err).__name__}: {err})") from None
    return rows, sst2, {"file": str(a.previous), "sides": sorted({r["side"] for r in rows}), **record}


def final_models(found: list[dict], work: Path, minutes: float) -> dict[str, Path]:
    """bertforge's final model; transformers' last checkpoint, and its one nearest bertforge's minutes (of the
    sides in `found`)."""
    models = {}
    if any(r["side"] == "bertforge" for r in found) and (work / "bertforge" / "model" / "config.json").is_file():
        models["bertforge"] = work / "bertforge" / "model"
    theirs = [r for r in found if r["side"] == "transformers"]
    if theirs:
        last = max(theirs, key=lambda r: r["seconds"])
        models[f"transformers @ {last['seconds'] / 60:.1f} min"] = last["dir"]
        earlier = [r for r in theirs if r is not last]
        if earlier:  # the checkpoint nearest bertforge's time (a mark is taken at the first step past it)
            row = min(earlier, key=lambda r: abs(r["seconds"] - 60 * minutes))
            models[f"transformers @ {row['seconds'] / 60:.1f} min"] = row["dir"]
    return models


def plot(found: list[dict], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for side in ("bertforge", "transformers"):
        rows = sorted((r for r in found if r["side"] == side), key=lambda r: r["seconds"])
        if rows:
            minutes = [r["seconds"] / 60 for r in rows]
            axes[0].plot(minutes, [r["eval_loss"] for r in rows], marker="o", label=side)
            axes[1].plot(minutes, [r["eval_mlm_accuracy"] for r in rows], marker="o", label=side)
    for ax, name in zip(axes, ("held-out MLM loss", "held-out MLM accuracy")):
        ax.set_xlabel("training wall time (minutes)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def tables(found: list[dict], sst2: dict[str, dict]) -> str:
    lines = ["| side | step | wall minutes | held-out MLM loss | perplexity | MLM accuracy |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in sorted(found, key=lambda r: (r["side"], r["seconds"])):
        lines.append(f"| {r['side']} | {r['step']} | {r['seconds'] / 60:.1f} | {r['eval_loss']:.3f} | "
                     f"{r['eval_perplexity']:.1f} | {r['eval_mlm_accuracy']:.1%} |")
    lines += ["", "| model fine-tuned on SST-2 | test accuracy (872) |", "| --- | ---: |"]
    lines += [f"| {name} | {r['accuracy']:.3f} |" for name, r in sst2.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    a = parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    train, held_out = corpus_files()
    sides = set(a.sides.split(","))
    kept, kept_sst2, previous = previous_sitting(a, sides)
    tokenizer = shared_tokenizer(a, train)
    batches, fingerprint = held_out_set(a, held_out, tokenizer)
    if previous and previous["eval_fingerprint"] != fingerprint:  # checked before hours of training, not after
        raise SystemExit(f"--previous {a.previous} was scored on other held-out sequences or masks (another "
                         "vocabulary?): pass that sitting's --tokenizer")
    load = os.getloadavg()[0]
    if "bertforge" in sides:
        train_bertforge(a, train, tokenizer)
    if "transformers" in sides:
        train_transformers(a, train, tokenizer)
    kept_sides = {r["side"] for r in kept}
    found = [r for r in checkpoints(a.work) if r["side"] not in kept_sides]
    score(batches, found)
    sst2 = {**kept_sst2, **finetune_sst2(a, final_models(found, a.work, a.minutes))}
    found += kept
    title = (f"{a.config}, {a.batch_size} x {a.max_length} tokens; bertforge {a.minutes:g} min (lr {a.lr:g}, wsd), "
             f"transformers Trainer {a.reference_minutes:g} min (defaults); {os.cpu_count()} CPUs, load {load:.1f}")
    plot(found, a.work / "curves.png", title)
    results = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
               "recipe": RECIPE, "finetune": FINETUNE, "train_files": train, "held_out_files": held_out,
               "load_average_at_start": load, "date": time.strftime("%Y-%m-%d"), "eval_fingerprint": fingerprint,
               "previous_sitting": previous, "checkpoints": [{k: str(v) if k == "dir" else v for k, v in r.items()}
                                                              for r in found], "sst2": sst2}
    (a.work / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (a.work / "results.md").write_text(f"{title}\n\n" + tables(found, sst2), encoding="utf-8")
    print(f"{title}\n\n{tables(found, sst2)}\nin {a.work}: results.json, results.md, curves.png")


if __name__ == "__main__":
    main()
