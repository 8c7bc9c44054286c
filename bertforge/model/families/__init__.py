"""The BERT family: one module per member (`bert`, `roberta`, `distilbert`, `albert`, `modernbert`, `deberta`, `mpnet`,
`nomic_bert`, `gte`, `electra`), each a `Family` value
(`family.py`) holding what the member changes — its parts of the encoder (`Family.spec`), its `config.json`
spelling, its presets, its checkpoint adapter — and `FAMILIES`, the registry `model_type` is looked up in.
Adding a member is a module here, its line in `FAMILIES`, its tokenizer kind and its tests."""

from __future__ import annotations

from ...core.errors import BertforgeError
from .albert import ALBERT
from .bert import BERT
from .deberta import DEBERTA_V2
from .distilbert import DISTILBERT
from .electra import ELECTRA
from .family import INTERNAL_PREFIX, Family, Recipe
from .gte import GTE
from .modernbert import MODERNBERT
from .mpnet import MPNET
from .nomic_bert import NOMIC_BERT
from .roberta import ROBERTA, XLM_ROBERTA

FAMILIES: dict[str, Family] = {f.model_type: f for f in (BERT, ROBERTA, XLM_ROBERTA, DISTILBERT, ALBERT, MODERNBERT,
                                                                  DEBERTA_V2, MPNET, NOMIC_BERT, GTE,
                                                                  ELECTRA)}

#: other names a preset may give a family (`--config deberta-v3-base`, `--config nomicbert-tiny`)
ALIASES: dict[str, Family] = {"deberta-v3": DEBERTA_V2, "nomicbert": NOMIC_BERT, "nomic-bert": NOMIC_BERT}


def family(model_type: str | None, source: str = "config") -> Family:
    """The `Family` of a config's `model_type` (None: BERT), or an error naming the supported ones."""
    if model_type is None:
        return BERT
    try:
        return FAMILIES[model_type]
    except (KeyError, TypeError):
        raise BertforgeError(
            f"{source}: model_type {model_type!r} is not supported; supported: {', '.join(FAMILIES)}"
        ) from None


__all__ = ["ALIASES", "ALBERT", "BERT", "DEBERTA_V2", "DISTILBERT", "ELECTRA", "FAMILIES", "Family", "GTE", "INTERNAL_PREFIX", "MODERNBERT",
           "MPNET", "NOMIC_BERT", "ROBERTA", "Recipe", "XLM_ROBERTA",
           "family"]
