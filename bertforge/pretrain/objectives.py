"""What a pretraining run learns, as a component of the one `Pretrainer`, and the entries of the objective
registry (`pretrain.registry.OBJECTIVES`) that `--objective` names.

`Objective` is the plug-in interface. An objective runs one micro-batch through the model and hands its loss terms
to `TrainStep.accumulate` (`forward_backward`), says what each term is averaged over (`counts`), turns a step's
summed statistics into its metrics (`statistics`), reads the vocabulary logits of the masked positions for the demo
(`masked_logits`), sums a held-out batch's evaluation (`eval_sums`) and turns those sums into metrics
(`eval_results`); `networks` and `exports` give the models a run trains and saves. The trainer never reads a model
output's fields by name: a new objective brings its own.

`ObjectiveKind` is a registry entry: what `--objective NAME` is, declared as data — the model and `Objective` it
builds (`build`), the config as large as that model (`memory_config`, for the memory check), what it needs from the
data (`sentence` pairs, whether rows may be packed by document, the replacement of masked tokens), the settings
only it reads, and what it refuses of a family. The `Pretrainer`, `build` and `PretrainArgs` ask the entry the
settings name; none of them compares objective names.

`MaskedLMObjective` is MLM alone, MLM + next-sentence prediction and MLM + sentence-order prediction (the entries
`MLM`, `NSP`, `SOP` below). Replaced-token detection (DeBERTa-v3) is `pretrain.rtd`'s `ReplacedTokenObjective`
and entry `RTD`; distillation's is `pretrain.distill`'s `Distillation` and entry `DISTILLATION`.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.constants import IGNORE_INDEX
from ..model import BertForPreTraining
from .build import initial_model
from .data import model_inputs
from ..training.step import TrainStep, labelled_count

if TYPE_CHECKING:
    from ..core.system import Runtime
    from ..model.config import BertConfig
    from ..model.families import Family

Batch = dict[str, Tensor]
#: the names `--objective` takes besides "auto" (`registry.OBJECTIVES`' keys)
ObjectiveName = Literal["mlm", "nsp", "sop", "rtd"]
#: of the masked tokens, the shares that become [MASK] and a random token (BERT's 80 % and 10 %)
BERT_REPLACEMENT = (0.8, 0.1)


class Objective(abc.ABC):
    """The plug-in interface of a pretraining objective (see the module's docstring)."""

    def networks(self, model: torch.nn.Module) -> dict[str, torch.nn.Module]:
        """The networks this objective trains, by the name their export directory gets ("": OUT/model itself)."""
        return {"": model}

    @abc.abstractmethod
    def counts(self, batch: Batch) -> dict[str, int]:
        """What each loss term of the step is normalised by (`TrainStep`): its targets in `batch`."""

    @abc.abstractmethod
    def forward_backward(self, model: torch.nn.Module, stepper: TrainStep, batch: Batch,
                         weights: dict[str, float]) -> dict[str, Tensor]:
        """One micro-batch (on the device) forward and backward through `stepper.accumulate` with the step's
        `weights`; its statistics, summed over the step's micro-batches for `statistics` (with "loss" and "tokens")."""

    @abc.abstractmethod
    def statistics(self, totals: dict[str, Tensor]) -> tuple[dict[str, float], dict[str, float]]:
        """A step's metrics from its summed statistics: (those metrics.jsonl puts first, those after the learning
        rate)."""

    @abc.abstractmethod
    def masked_logits(self, out: Any) -> Tensor:
        """The vocabulary logits of a forward without labels: [B, S, V] (the demo's predictions)."""

    @abc.abstractmethod
    def eval_sums(self, out: Any, batch: Batch) -> Tensor:
        """One held-out batch's sums, in float64 (summed over batches and ranks)."""

    @abc.abstractmethod
    def eval_results(self, sums: Tensor) -> dict[str, float]:
        """The held-out metrics from the summed `eval_sums`; "eval_loss" is the one early stopping and OUT/best
        follow."""

    def exports(self, model: torch.nn.Module, weights: dict[str, Tensor], config: Any) -> dict[str, torch.nn.Module]:
        """The models a run saves from the full state dict of its `model` (the network of `config`), by the name of
        their directory ("": OUT/model itself). Built on the meta device: no initialisation, which would draw from
        the training RNG."""
        with torch.device("meta"):
            export = type(model)(config)
        export.load_state_dict(weights, assign=True)
        return {"": export}


#: what an entry builds for a run: (its model config, its settings, resuming, the runtime) -> (model, objective)
Builder = Callable[["BertConfig", Any, bool, "Runtime"], tuple[torch.nn.Module, Objective]]


def same_config(config: BertConfig, args: Any) -> BertConfig:
    """The memory check's config of an objective whose model is one network of the run's config."""
    return config


def any_family(family: Family) -> str | None:
    """No family refuses the objective."""
    return None


@dataclass(frozen=True)
class ObjectiveKind:
    """One objective a run can pretrain with: what it builds, what it needs from the data, the settings only it
    reads, and which families it refuses (a registry entry: `registry.OBJECTIVES`)."""

    name: str  # as `--objective` names it (an entry outside the table: as messages name it)
    build: Builder  # its model and its `Objective`, built together (distillation's teacher serves both)
    memory_config: Callable[[BertConfig, Any], BertConfig] = same_config  # a config as large as what it trains
    sentence: Literal["nsp", "sop"] | None = None  # the data's sentence pairs (`InstanceStream`); None: MLM rows
    packs_documents: bool = False  # its rows may hold whole documents attending within themselves (--packing)
    mask_replacement: tuple[float, float] = BERT_REPLACEMENT  # of the masked tokens: [MASK], a random token
    settings: tuple[str, ...] = ()  # `PretrainArgs` fields only it reads (None by default, refused elsewhere)
    refusal: Callable[[Family], str | None] = any_family  # why a family cannot pretrain with it; None: it can
    check: Callable[[BertConfig, Any], None] | None = None  # refuses its settings against the model, before OUT changes

    @property
    def next_sentence(self) -> bool:
        """Whether its pairs draw a random next segment from another document (so the corpus needs two)."""
        return self.sentence == "nsp"


class MaskedLMObjective(Objective):
    """MLM (`sentence` None) or MLM with a sentence head ("nsp" or "sop": both read the model's
    `seq_relationship_logits` and log as `nsp_*`), on one network."""

    def __init__(self, sentence: str | None = None) -> None:
        self.sentence = sentence

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


def masked_lm(config: BertConfig, args: Any, resuming: bool, rt: Runtime) -> tuple[torch.nn.Module, Objective]:
    """The family's pretraining model (MLM and its sentence head, or MLM alone: `build.initial_model`) and MLM with
    the sentence head the settings resolved (NSP, SOP) or none."""
    model = initial_model(config, args, resuming, rt.is_main)
    if args.sentence_objective is None and isinstance(model, BertForPreTraining):
        # MLM alone with a family that has a sentence head: the pooler and that head get no gradient, so freeze
        # them (DDP wants a gradient for every trainable weight); they are still saved, so the model keeps the
        # BertForPreTraining layout.
        for module in model.sentence_head_parts():
            module.requires_grad_(False)
    return model, MaskedLMObjective(args.sentence_objective)


def sentence_head_refusal(family: Family) -> str | None:
    """A sentence objective needs a family with a sentence head."""
    if family.sentence_head is None:
        return f"{family.name} is pretrained with MLM only (it has no sentence head)"
    return None


def next_sentence_refusal(family: Family) -> str | None:
    """NSP needs a sentence head that learns NSP (ALBERT's learns sentence order; SOP runs on BERT's NSP head)."""
    if family.sentence_head == "SOP":
        return f"{family.name}'s sentence head learns sentence order (--objective sop)"
    return sentence_head_refusal(family)


#: MLM alone (RoBERTa's full-sentence rows, or ModernBERT's documents), MLM + next-sentence prediction (BERT's),
#: MLM + sentence-order prediction (ALBERT's)
MLM = ObjectiveKind("mlm", masked_lm, packs_documents=True)
NSP = ObjectiveKind("nsp", masked_lm, sentence="nsp", refusal=next_sentence_refusal)
SOP = ObjectiveKind("sop", masked_lm, sentence="sop", refusal=sentence_head_refusal)


def network_dir(target: Path, name: str) -> Path:
    """Where the network an objective names `name` (`Objective.networks`) is exported beside `target`: "" in
    `target` itself; another in OUT/NAME for OUT/model, in OUT/best-NAME for OUT/best."""
    if not name:
        return target
    return target.with_name(name if target.name == "model" else f"{target.name}-{name}")


def pretraining_counts(batch: Batch) -> dict[str, int]:
    """What the step's loss is normalised by (see `MaskedLMObjective.counts`)."""
    return MaskedLMObjective().counts(batch)
