"""What a pretraining run learns, as a component of the one `Pretrainer`: MLM alone, MLM + next-sentence
prediction, MLM + sentence-order prediction; distillation's objective (`distill.Distillation`) is another.

An `Objective` runs one micro-batch through the model and hands its loss terms to `TrainStep.accumulate`
(`forward_backward`), says what each term is averaged over (`counts`), turns a step's summed statistics into its
metrics (`statistics`), reads the vocabulary logits of the masked positions for the demo (`masked_logits`), and sums
a held-out batch's evaluation (`eval_sums`). The trainer never reads a model output's fields by name: a new objective
brings its own.

Replaced-token detection (DeBERTa-v3) is another (`pretrain.rtd.ReplacedTokenObjective`): its model is a generator
and a discriminator in one module (`model.rtd.ReplacedTokenDetection`), its `forward_backward` hands both loss terms
to the one `accumulate`, and `exports` gives the models the run saves, by directory (`networks()` names them): the
discriminator as OUT/model, the generator as OUT/generator. The loop, the checkpoints and `TrainStep` are the same.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.constants import IGNORE_INDEX
from .data import model_inputs
from ..training.step import TrainStep, labelled_count

Batch = dict[str, Tensor]


class Objective:
    """MLM (`sentence` None) or MLM with a sentence head ("nsp" or "sop": both read the model's
    `seq_relationship_logits` and log as `nsp_*`)."""

    def __init__(self, sentence: str | None = None) -> None:
        self.sentence = sentence

    def networks(self, model: torch.nn.Module) -> dict[str, torch.nn.Module]:
        """The networks this objective trains, by the name their export directory gets ("": OUT/model itself)."""
        return {"": model}

    def counts(self, batch: Batch) -> dict[str, int]:
        """What the step's loss is normalised by: labelled (masked) tokens for MLM, labelled sequences for NSP."""
        counts = {"mlm": labelled_count(batch["labels"])}
        if "next_sentence_label" in batch:
            counts["nsp"] = labelled_count(batch["next_sentence_label"])
        return counts

    def forward_backward(self, model: torch.nn.Module, stepper: TrainStep, batch: Batch,
                         weights: dict[str, float]) -> dict[str, Tensor]:
        """One micro-batch (on the device) forward and backward (through `TrainStep.accumulate`, with the step's
        weights: MLM by labelled tokens, NSP by sequences); its statistics, losses as shares of the step's loss."""
        with stepper.autocast():
            out = model(**model_inputs(batch))
        loss = stepper.accumulate({"mlm": out.mlm_loss, "nsp": out.nsp_loss}, weights)
        stats = mlm_stats(loss, out.mlm_loss, out.prediction_logits, batch, weights)
        if out.nsp_loss is not None:
            with torch.no_grad():
                stats["nsp_loss"] = out.nsp_loss.detach() * weights["nsp"]
                stats["nsp_correct"] = (out.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]).sum()
                stats["nsp_count"] = torch.tensor(batch["next_sentence_label"].numel(), device=loss.device)
        return stats

    @staticmethod
    def statistics(totals: dict[str, Tensor]) -> tuple[dict[str, float], dict[str, float]]:
        """A step's metrics from its micro-batches' summed statistics: (the MLM ones, which metrics.jsonl puts first;
        the others, after the learning rate: the sentence head's accuracy and every other loss term)."""
        first = {"mlm_loss": totals["mlm_loss"].item(),
                 "mlm_accuracy": totals["mlm_correct"].item() / max(1, totals["mlm_count"].item())}
        rest = {}
        if "nsp_loss" in totals:
            rest["nsp_accuracy"] = totals["nsp_correct"].item() / max(1, totals["nsp_count"].item())
        rest.update({k: v.item() for k, v in totals.items() if k.endswith("_loss") and k not in first})  # nsp, ...
        return first, rest

    @staticmethod
    def masked_logits(out: Any) -> Tensor:
        """The vocabulary logits of a forward without labels: [B, S, V]."""
        return out.prediction_logits

    def exports(self, model: torch.nn.Module, weights: dict[str, Tensor], config: Any) -> dict[str, torch.nn.Module]:
        """The models a run saves from the full state dict of its `model` (the network of `config`), by the name of
        their directory ("": OUT/model itself). Built on the meta device: no initialisation, which would draw from
        the training RNG."""
        with torch.device("meta"):
            export = type(model)(config)
        export.load_state_dict(weights, assign=True)
        return {"": export}

    @staticmethod
    def eval_results(sums: Tensor) -> dict[str, float]:
        """The held-out metrics from the summed `eval_sums` of every batch: eval_loss (the mean MLM loss per masked
        token), eval_perplexity, eval_mlm_accuracy (and eval_nsp_accuracy)."""
        loss = sums[0].item() / max(1.0, sums[2].item())
        result = {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0)),
                  "eval_mlm_accuracy": sums[1].item() / max(1.0, sums[2].item())}
        if sums[4] > 0:
            result["eval_nsp_accuracy"] = sums[3].item() / sums[4].item()
        return result

    @staticmethod
    def eval_sums(out: Any, batch: Batch) -> Tensor:
        """(MLM loss sum, MLM correct, MLM targets, NSP correct, NSP count) of one held-out batch, in float64. The
        model's prediction logits are those of the labelled positions only (sparse MLM), in the order of the labels."""
        labels = batch["labels"]
        target = labels[labels != IGNORE_INDEX]
        logits = out.prediction_logits.float()
        sums = [F.cross_entropy(logits, target, reduction="sum").item(), (logits.argmax(-1) == target).sum().item(),
                target.numel(), 0.0, 0.0]
        if "next_sentence_label" in batch:
            nsp = batch["next_sentence_label"].reshape(-1)
            labelled = nsp != IGNORE_INDEX
            sums[3] = (out.seq_relationship_logits.argmax(-1)[labelled] == nsp[labelled]).sum().item()
            sums[4] = labelled.sum().item()
        return torch.tensor(sums, dtype=torch.float64)


@torch.no_grad()
def mlm_stats(loss: Tensor, mlm_loss: Tensor, logits: Tensor, batch: Batch, weights: dict[str, float]) -> dict[str, Tensor]:
    """A micro-batch's statistics every MLM objective logs: its share of the step's loss and of the MLM loss, MLM
    hits among the labelled tokens (`logits`: their rows only), real tokens."""
    labels = batch["labels"]
    target = labels[labels != IGNORE_INDEX]
    return {
        "loss": loss,
        "mlm_loss": mlm_loss.detach() * weights["mlm"],
        "mlm_correct": (logits.argmax(-1) == target).sum(),
        "mlm_count": torch.tensor(target.numel(), device=loss.device),
        "tokens": batch["attention_mask"].sum(),
    }


def network_dir(target: Path, name: str) -> Path:
    """Where the network an objective names `name` (`Objective.networks`) is exported beside `target`: "" in
    `target` itself; another in OUT/NAME for OUT/model, in OUT/best-NAME for OUT/best."""
    if not name:
        return target
    return target.with_name(name if target.name == "model" else f"{target.name}-{name}")


def pretraining_counts(batch: Batch) -> dict[str, int]:
    """What the step's loss is normalised by (see `Objective.counts`)."""
    return Objective().counts(batch)
