"""Replaced-token detection (ELECTRA's and DeBERTa-v3's pretraining) as an objective of the one `Pretrainer`.

The model is `model.rtd.ReplacedTokenDetection`: a generator (MLM on 15 % of the tokens, every one of them
[MASK]: `PretrainArgs.mask_replacement`) whose samples fill the masked positions, and a discriminator that labels
every real token original or replaced, sharing embeddings as the family's recipe says (`model.rtd.SHARINGS`:
DeBERTa-v3's GDES, ELECTRA's tied tables), the generator shaped by it too (`model.rtd.generator_config`: DeBERTa-v3's
half as deep, ELECTRA's a quarter as wide). The step's objective is

    mean generator MLM loss (per masked token) + λ · mean replaced-token BCE (per real token)

(λ `--rtd-weight`, 50 by default), both terms through the one `TrainStep.accumulate`, so one backward pass trains
both networks and one optimizer (over both parameter sets) steps them; the checkpoints hold the one module's state
(both networks, both networks' optimizer states). The run exports the discriminator, its shared tables in it (GDES:
E_G + E_Δ folded into its word table), as OUT/model (DeBERTa-v3: `DebertaV2Model`, or any task; ELECTRA:
`ElectraForPreTraining`) and the generator as OUT/generator (`DebertaV2ForMaskedLM`, `ElectraForMaskedLM`);
OUT/best's generator is OUT/best-generator.

`--init-from DIR` continues a discriminator: with the generator saved beside it (`generator_dir`), or, for a
discriminator alone, a new generator given the discriminator's shared tables (GDES: E_Δ = 0).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model.checkpoint import load_pretrained
from ..core.constants import IGNORE_INDEX
from ..core.errors import BertforgeError
from ..model import BertForMaskedLM
from ..model.config import BertConfig
from ..model.families import FAMILIES
from ..model.rtd import BertForReplacedTokenDetection, ReplacedTokenDetection, generator_config
from .data import model_inputs
from .objectives import Batch, MaskedLMObjective, ObjectiveKind, mlm_stats, network_dir
from ..training.step import TrainStep, labelled_count

if TYPE_CHECKING:
    from ..core.system import Runtime
    from ..model.families import Family

log = logging.getLogger("bertforge")

#: held-out sums: MLM loss sum, MLM correct, MLM targets, NSP correct, NSP count (none here), then RTD loss sum,
#: RTD correct, RTD labelled tokens, true positives, false positives, false negatives (replaced = positive)
EVAL_FIELDS = 11


def generator_dir(model_dir: Path | str) -> Path:
    """Where the generator of the discriminator in `model_dir` is saved (`network_dir`): OUT/model's in
    OUT/generator, OUT/best's in OUT/best-generator."""
    return network_dir(Path(model_dir), "generator")


def memory_config(config: BertConfig, generator_layers: int | None) -> BertConfig:
    """A config as large as the pair (for the memory check): the discriminator's with the generator's layers added
    (the shared word table counted once; E_Δ is one more table, small beside the blocks)."""
    extra = generator_config(config, generator_layers).num_hidden_layers
    return dataclasses.replace(config, num_hidden_layers=config.num_hidden_layers + extra)


def initial_rtd_model(config: BertConfig, args: Any, resuming: bool, is_main: bool) -> ReplacedTokenDetection:
    """The pair a run starts from: new (seeded by --seed), or --init-from's discriminator with its generator when
    one is saved beside it, else with a new generator of --generator-layers."""
    torch.manual_seed(args.seed)  # the same weights on every rank
    if args.init_from is None or resuming:
        return ReplacedTokenDetection.build(config, args.generator_layers)
    discriminator = load_pretrained(BertForReplacedTokenDetection, args.init_from, quiet=not is_main)
    beside = generator_dir(args.init_from)
    generator = None
    if (beside / "config.json").is_file():
        generator = load_pretrained(BertForMaskedLM, beside, quiet=not is_main)
        layers = generator.config.num_hidden_layers
        if args.generator_layers not in (None, layers):
            raise BertforgeError(f"--generator-layers {args.generator_layers} contradicts the generator in {beside} "
                                 f"({layers} layers), which --init-from continues; leave it out")
    elif is_main:
        log.info("--init-from %s: no generator in %s; a new one starts from the discriminator's embeddings",
                 args.init_from, beside)
    return ReplacedTokenDetection.around(discriminator, generator, args.generator_layers)


class ReplacedTokenObjective(MaskedLMObjective):
    """The generator's MLM loss and λ times the discriminator's replaced-token loss (`weight`: λ)."""

    def __init__(self, weight: float) -> None:
        super().__init__(None)
        self.weight = weight

    def networks(self, model: torch.nn.Module) -> dict[str, torch.nn.Module]:
        """The discriminator (OUT/model) and the generator (OUT/generator)."""
        return {"": model.discriminator, "generator": model.generator}  # type: ignore[dict-item]

    def counts(self, batch: Batch) -> dict[str, int]:
        """MLM: the masked tokens; RTD: every real (non-padding) token."""
        return {"mlm": labelled_count(batch["labels"]), "rtd": int(batch["attention_mask"].sum())}

    def forward_backward(self, model: torch.nn.Module, stepper: TrainStep, batch: Batch,
                         weights: dict[str, float]) -> dict[str, Tensor]:
        with stepper.autocast():
            out = model(**model_inputs(batch))
        loss = stepper.accumulate({"mlm": out.mlm_loss, "rtd": out.rtd_loss * self.weight}, weights)
        stats = mlm_stats(loss, out.mlm_loss, out.prediction_logits, batch, weights)
        with torch.no_grad():
            labels = out.rtd_labels
            real = labels != IGNORE_INDEX
            stats["rtd_loss"] = out.rtd_loss.detach() * weights["rtd"]
            stats["rtd_correct"] = ((out.rtd_logits > 0).long() == labels)[real].sum()
            stats["rtd_replaced"] = labels[real].sum()
            stats["rtd_count"] = real.sum()
        return stats

    def statistics(self, totals: dict[str, Tensor]) -> tuple[dict[str, float], dict[str, float]]:  # type: ignore[override]
        """MLM's, and the discriminator's accuracy and the share of real tokens replaced (its all-original
        baseline is 1 - that share)."""
        first, rest = MaskedLMObjective.statistics(totals)
        count = max(1, totals["rtd_count"].item())
        rest["rtd_accuracy"] = totals["rtd_correct"].item() / count
        rest["rtd_replaced"] = totals["rtd_replaced"].item() / count
        return first, rest

    def exports(self, model: torch.nn.Module, weights: dict[str, Tensor], config: Any) -> dict[str, torch.nn.Module]:
        """The discriminator (E_G + E_Δ folded in) as "" and the generator as "generator"."""
        return model.exports(weights)  # type: ignore[operator]

    @staticmethod
    def eval_sums(out: Any, batch: Batch) -> Tensor:
        """`EVAL_FIELDS` sums of one held-out batch, in float64."""
        mlm = MaskedLMObjective.eval_sums(out, batch)
        labels = out.rtd_labels
        real = labels != IGNORE_INDEX
        logits, target = out.rtd_logits.float()[real], labels[real]
        guess = (logits > 0).long()
        rtd = [F.binary_cross_entropy_with_logits(logits, target.float(), reduction="sum").item(),
               (guess == target).sum().item(), target.numel(), ((guess == 1) & (target == 1)).sum().item(),
               ((guess == 1) & (target == 0)).sum().item(), ((guess == 0) & (target == 1)).sum().item()]
        return torch.cat([mlm, torch.tensor(rtd, dtype=torch.float64)])

    def eval_results(self, sums: Tensor) -> dict[str, float]:  # type: ignore[override]
        """eval_loss (the step's objective: generator MLM loss + λ · RTD loss), eval_mlm_loss, eval_perplexity and
        eval_mlm_accuracy (the generator's), eval_rtd_loss, eval_rtd_accuracy, eval_rtd_all_original (the accuracy
        of calling every token original) and eval_rtd_f1 (replaced tokens the positive class)."""
        result = MaskedLMObjective.eval_results(sums)
        loss, correct, count, tp, fp, fn = sums[5:].tolist()
        count = max(1.0, count)
        result["eval_mlm_loss"] = result["eval_loss"]
        result["eval_rtd_loss"] = loss / count
        result["eval_loss"] = result["eval_mlm_loss"] + self.weight * result["eval_rtd_loss"]
        result["eval_rtd_accuracy"] = correct / count
        result["eval_rtd_all_original"] = 1.0 - (tp + fn) / count
        result["eval_rtd_f1"] = 2 * tp / max(1.0, 2 * tp + fp + fn)
        return result


def replaced_token_detection(config: BertConfig, args: Any, resuming: bool,
                             rt: Runtime) -> tuple[torch.nn.Module, ReplacedTokenObjective]:
    """The generator and discriminator in one module (`initial_rtd_model`) and their two losses, λ `--rtd-weight`."""
    return initial_rtd_model(config, args, resuming, rt.is_main), ReplacedTokenObjective(args.rtd_weight)


def pair_memory_config(config: BertConfig, args: Any) -> BertConfig:
    """`memory_config` of the run's generator (`--generator-layers`)."""
    return memory_config(config, args.generator_layers)


def family_refusal(family: Family) -> str | None:
    """Replaced-token detection is pretrained by the families that declare it (`Family.objectives`: DeBERTa's,
    ELECTRA's)."""
    if "rtd" in family.objectives:
        return None
    owners = [f"{f.name}'s (--config {f.model_type}-SIZE)" for f in FAMILIES.values() if "rtd" in f.objectives]
    return f"replaced-token detection is {' and '.join(owners)}, not {family.name}'s"


def check_generator(config: BertConfig, args: Any) -> None:
    """Refuse a generator deeper than the model (`generator_config`), before OUT changes."""
    generator_config(config, args.generator_layers)


#: replaced-token detection: MLM rows (stream-packed) with every masked token [MASK], for the generator to fill
RTD = ObjectiveKind("rtd", replaced_token_detection, memory_config=pair_memory_config, mask_replacement=(1.0, 0.0),
                    settings=("generator_layers",), refusal=family_refusal, check=check_generator)


__all__ = ["EVAL_FIELDS", "RTD", "ReplacedTokenObjective", "generator_dir", "initial_rtd_model", "memory_config"]
