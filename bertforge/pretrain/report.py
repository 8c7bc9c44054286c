"""What a pretraining run tells its user: the one-line summary of its MLM loss and accuracy, the PNG of its
curves, and the demo's [MASK] predictions for the probe sentences of the demo world."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..data.demo_world import PROBES
from .objectives import MaskedLMObjective
from ..training.log import Panel, plot_curves, read_rows

log = logging.getLogger("bertforge")


def metrics_summary(path: Path, vocab_size: int) -> str | None:
    """One line: the MLM loss and accuracy of the first and the last logged step, against ln(V) (the loss of a
    uniform guess), so that a user sees at once how far training went. None without two logged rows."""
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError):
        return None
    rows = [r for r in rows if isinstance(r, dict) and isinstance(r.get("mlm_loss"), (int, float))]
    if len(rows) < 2:
        return None
    first, last = rows[0], rows[-1]
    text = (f"MLM loss {first['mlm_loss']:.2f} (step {first['step']}) -> {last['mlm_loss']:.2f} (step {last['step']}); "
            f"ln(vocab) = {math.log(vocab_size):.2f} is a uniform guess")
    if isinstance(first.get("mlm_accuracy"), (int, float)) and isinstance(last.get("mlm_accuracy"), (int, float)):
        text += f"; MLM accuracy {first['mlm_accuracy']:.1%} -> {last['mlm_accuracy']:.1%}"
    return text


PRETRAIN_PANELS = (
    Panel("training loss", ("loss", "mlm_loss", "nsp_loss")),
    Panel("training accuracy", ("mlm_accuracy", "nsp_accuracy"), ylim=(0, 1)),
    Panel("learning rate", ("lr",)),
)
EVAL_PANELS = (  # with held-out evaluation: its MLM loss beside the training one, and its accuracies
    Panel("MLM loss", ("mlm_loss", "eval_loss"), marker="."),
    Panel("held-out accuracy", ("eval_mlm_accuracy", "eval_nsp_accuracy"), kind="eval", marker="o", ylim=(0, 1)),
)


def plot_metrics(metrics_file: Path, png: Path) -> None:
    """Losses, accuracies and learning rate against step (and the held-out evaluation's, when there is one), one
    PNG."""
    rows = read_rows(metrics_file)
    if rows:
        evaluated = any(r.get("type") == "eval" for r in rows)
        plot_curves(rows, png, PRETRAIN_PANELS + (EVAL_PANELS if evaluated else ()))


@torch.no_grad()
def show_predictions(model: torch.nn.Module, tokenizer, title: str, device: torch.device, k: int = 3,
                     emit: bool = True, logits: Callable[[Any], torch.Tensor] = MaskedLMObjective.masked_logits) -> int:
    """Print the top-k fillers of the [MASK] in each probe sentence (`demo_world.PROBES`), marking the top guess
    that is the word the demo corpus puts there, and return how many are (`emit=False`: run the forwards, print
    nothing). `logits(out)`: the vocabulary logits of the model's output (the run's objective reads them)."""
    was_training = model.training
    model.eval()
    lines, right = [], 0
    for text, answer in PROBES:
        enc = tokenizer(text.replace("[MASK]", tokenizer.mask_token), return_tensors="pt")
        ids = enc["input_ids"].to(device)
        out = model(input_ids=ids, token_type_ids=enc["token_type_ids"].to(device))
        pos = int((ids[0] == tokenizer.mask_token_id).nonzero()[0, 0])
        top = logits(out)[0, pos].float().softmax(-1).topk(k)
        top_ids = top.indices.tolist()
        # a model may have more rows than its tokenizer has tokens (ids past the vocabulary read as None)
        # as text, not as the vocabulary's pieces (byte-level BPE's "Ġdog" is " dog")
        words = [tokenizer.decode([i], skip_special_tokens=False).strip() or f"[{i}]"
                 if i < tokenizer.vocab_size else f"[{i}]" for i in top_ids]
        hit = words[0].lower() == answer.lower()
        right += hit
        guesses = ", ".join(f"{w} ({p:.2f})" for w, p in zip(words, top.values.tolist()))
        lines.append(f"  {'+' if hit else ' '} {text:<40} ->  {guesses}")
    if emit:
        log.info("\n".join([f"[MASK] predictions {title} (+: the word the demo corpus puts there; "
                             f"{right} of {len(PROBES)}):", *lines]))
    model.train(was_training)
    return right
