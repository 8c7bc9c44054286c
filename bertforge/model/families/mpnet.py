"""MPNet (Song et al., 2020; `model_type: mpnet`, all-mpnet-base-v2 and the multi-qa models): BERT's post-LN
blocks with a learned relative-position bias (`RelativeBias`: 32 distance buckets up to 128 tokens, one table of
`relative_attention_num_buckets` rows shared by every block, added to the scaled scores) beside absolute positions
counted after the padding id as RoBERTa's, no token types, RoBERTa's first-token sequence head and MLM head.
Its tokenizer is WordPiece under `<s> … </s>` with `</s></s>` between a pair (`kinds.MPNET`).

Pretrained with MLM here (MPNet's permuted objective is not implemented)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..spec import EncoderSpec, RelativeBias
from .family import INTERNAL_LAYER, BertParts, Family, Recipe, bert_spec

if TYPE_CHECKING:
    from ..config import BertConfig

#: `transformers.MPNetConfig`'s defaults for what the encoder's parts read
PART_DEFAULTS: dict[str, Any] = dict(relative_attention_num_buckets=32)
#: MPNet computes its buckets with these whatever the table's size (`compute_position_bias`' defaults)
BUCKETS, MAX_DISTANCE = 32, 128


def mpnet_spec(family: Family, config: BertConfig) -> EncoderSpec:
    table = config.extra.get("relative_attention_num_buckets", PART_DEFAULTS["relative_attention_num_buckets"])
    spec = bert_spec(family, config)
    return replace(spec, type_vocab_size=0,
                   relative_bias=RelativeBias(buckets=BUCKETS, max_distance=MAX_DISTANCE, table=table))


def write_config(out: dict[str, Any], config: BertConfig) -> dict[str, Any]:
    for name, value in PART_DEFAULTS.items():
        out.setdefault(name, value)
    return out


_ATTENTION = INTERNAL_LAYER + "attention."
MPNET = Family(
    model_type="mpnet",
    name="MPNet",
    class_prefix="MPNet",
    prefix="mpnet",
    parts=BertParts(positions="after-padding", sequence_head="first-token", mlm_act="gelu", choice_head="pooler"),
    sentence_head=None,
    defaults=dict(  # `transformers.MPNetConfig`'s
        vocab_size=30527, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
        initializer_range=0.02, layer_norm_eps=1e-12, pad_token_id=1, type_vocab_size=0,
    ),
    unused=("type_vocab_size", "embedding_size", "num_hidden_groups", "classifier_dropout"),
    written={"tie_word_embeddings": True},
    keys=(
        (_ATTENTION + "attn.q.", _ATTENTION + "self.query."),
        (_ATTENTION + "attn.k.", _ATTENTION + "self.key."),
        (_ATTENTION + "attn.v.", _ATTENTION + "self.value."),
        (_ATTENTION + "attn.o.", _ATTENTION + "output.dense."),
        (_ATTENTION + "LayerNorm.", _ATTENTION + "output.LayerNorm."),
        ("lm_head.dense.", "cls.predictions.transform.dense."),
        ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
        ("lm_head.bias", "cls.predictions.bias"),
    ),
    dropped=(r"^lm_head\.decoder\.(weight|bias)$",),
    read_spec=mpnet_spec,
    write_config=write_config,
    # all-mpnet-base-v2's: 512 positions after the padding offset (pad id 1), eps 1e-5
    preset=dict(max_position_embeddings=514, type_vocab_size=0, layer_norm_eps=1e-5, pad_token_id=1),
    recipe=Recipe(adam_beta2=0.98),  # MPNet's (RoBERTa's) Adam β2
    tokenizer="mpnet",
)

__all__ = ["MPNET", "mpnet_spec"]
