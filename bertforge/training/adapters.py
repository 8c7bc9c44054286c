"""Training low-rank adapters instead of the full weights: the settings every trainer offers (`LoraOptions`, mixed
into `FinetuneConfig` and `EmbeddingsConfig`, so `finetune`, `glue` and `train-embeddings` share one spelling of
`--lora-rank`, `--lora-alpha`, `--lora-dropout`, `--lora-targets` and `--merge`), attaching them before the
optimizer is made (it then holds state for the adapters and the head only), and writing the result: PEFT's
adapter directory, or with `--merge` a plain checkpoint with the adapters folded in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from ..core.errors import BertforgeError
from ..core.options import option
from ..model.lora import DEFAULT_TARGETS, ROLES, LoraSettings, add_adapters, has_adapters, merge_adapters

LORA_HELP = ("train low-rank adapters (LoRA) of rank R on the encoder's dense layers instead of its weights; the "
             "task head trains whole; the model is saved as a PEFT adapter directory (see --merge)")


@dataclass(kw_only=True, frozen=True)
class LoraOptions:
    """The adapter settings of a training run (each field is also its command-line option)."""

    lora_rank: int | None = option(None, LORA_HELP, metavar="R")
    lora_alpha: float = option(16.0, "with --lora-rank: the adapters' scale is ALPHA / R", metavar="ALPHA")
    lora_dropout: float = option(0.0, "with --lora-rank: dropout on the adapters' input", metavar="P")
    lora_targets: list[str] = option(help=f"with --lora-rank: the dense layers adapted in every block, of "
                                     f"{', '.join(ROLES)} (default: {' '.join(DEFAULT_TARGETS)})", metavar="ROLE",
                                     default_factory=lambda: list(DEFAULT_TARGETS))
    merge: bool = option(False, "with --lora-rank: save the adapters merged into the weights (a plain checkpoint) "
                         "instead of a PEFT adapter directory")

    def lora(self) -> LoraSettings | None:
        """The adapters to train, or None (the full weights train); a `BertforgeError` naming a bad setting."""
        if self.lora_rank is None:
            if self.merge:
                raise BertforgeError("merge is for adapters: give lora_rank (--lora-rank R) too")
            return None
        targets = self.lora_targets
        if isinstance(targets, str) or not isinstance(targets, (list, tuple)):
            raise BertforgeError(f"lora targets must be a list of {', '.join(ROLES)}; got {targets!r}")
        if not isinstance(self.merge, bool):
            raise BertforgeError(f"merge must be true or false, got {self.merge!r}")
        return LoraSettings(rank=self.lora_rank, alpha=self.lora_alpha, dropout=self.lora_dropout,
                            targets=tuple(targets))


#: the options' names, for a command that passes them on (glue, to each task's fine-tuning)
LORA_OPTIONS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "merge")


def attach(model: nn.Module, settings: Any) -> None:
    """Adapters on `model` as the run's `settings` (a `LoraOptions`) say, in place; nothing without them. A model
    loaded from an adapter directory has its adapters already: those train on."""
    lora = settings.lora()
    if lora is not None and not has_adapters(model):  # a resumed run's trainer attaches them once
        add_adapters(model, lora)


def save_trained(model: nn.Module, path: Any, settings: Any, base: str, card: Any = None) -> None:
    """Write the trained `model` to `path`: a plain checkpoint (`card` its model card), or with adapters PEFT's
    directory whose base is `base`, or with `merge` the adapters folded into a plain checkpoint."""
    from ..model.lora import adapted_config, is_adapter_dir, save_adapter

    if has_adapters(model):
        if not settings.merge:  # a run that started from an adapter directory continued its adapters: their base
            save_adapter(model, path, base=str(adapted_config(base)[0]) if is_adapter_dir(base) else base)
            return
        merge_adapters(model)
    model.save_pretrained(path, card)  # type: ignore[operator]


__all__ = ["LORA_HELP", "LORA_OPTIONS", "LoraOptions", "attach", "save_trained"]
