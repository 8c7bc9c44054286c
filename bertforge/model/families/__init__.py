"""The BERT family: one module per member (`bert`, `roberta`, `distilbert`, `albert`, `modernbert`, `deberta`, `mpnet`,
`nomic_bert`, `gte`, `eurobert`, `jina_embeddings_v3`, `electra`), each a `Family` value
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
from .eurobert import EUROBERT
from .family import INTERNAL_PREFIX, Family, Ladder, Recipe
from .gte import GTE
from .jina_embeddings_v3 import JINA_EMBEDDINGS_V3
from .modernbert import MODERNBERT
from .mpnet import MPNET
from .nomic_bert import NOMIC_BERT
from .roberta import ROBERTA, XLM_ROBERTA

FAMILIES: dict[str, Family] = {f.model_type: f for f in (BERT, ROBERTA, XLM_ROBERTA, DISTILBERT, ALBERT, MODERNBERT,
                                                                  DEBERTA_V2, MPNET, NOMIC_BERT, GTE,
                                                                  EUROBERT, JINA_EMBEDDINGS_V3, ELECTRA)}

#: other names a preset may give a family (`--config deberta-v3-base`, `--config nomicbert-tiny`)
ALIASES: dict[str, Family] = {"deberta-v3": DEBERTA_V2, "nomicbert": NOMIC_BERT, "nomic-bert": NOMIC_BERT,
                              "jina-v3": JINA_EMBEDDINGS_V3}

#: the published series with shapes of their own (`--config ettin-17m`): name -> (its family, the ladder)
LADDERS: dict[str, tuple[Family, Ladder]] = {ladder.name: (f, ladder) for f in FAMILIES.values() for ladder in f.ladders}


def recipe(preset: str | None, member: Family) -> Recipe:
    """The pretraining recipe of a `--config` preset of `member`: its ladder's (`ettin-17m`), else the family's."""
    ladder = LADDERS.get((preset or "").rpartition("-")[0])
    return ladder[1].recipe if ladder is not None and ladder[1].recipe is not None else member.recipe


def tokenizer_kind(preset: str | None, member: Family) -> str:
    """The tokenizer kind a `--config` preset of `member` pretrains with: its ladder's (`mmbert-small`), else the
    family's."""
    ladder = LADDERS.get((preset or "").rpartition("-")[0])
    return ladder[1].tokenizer if ladder is not None and ladder[1].tokenizer else member.tokenizer_kind


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


__all__ = ["ALBERT", "ALIASES", "BERT", "DEBERTA_V2", "DISTILBERT", "ELECTRA", "EUROBERT", "FAMILIES", "Family", "GTE",
           "INTERNAL_PREFIX", "JINA_EMBEDDINGS_V3", "LADDERS", "Ladder", "MODERNBERT", "MPNET", "NOMIC_BERT", "ROBERTA",
           "Recipe", "XLM_ROBERTA", "family", "recipe", "tokenizer_kind"]
