"""DeBERTa-v2 and -v3 (He et al., 2020, 2021; `model_type: deberta-v2`): BERT's post-LN blocks with disentangled
attention — content→position and position→content score terms from one relative-embedding table (log-bucketed
distances, normalised by the encoder's LayerNorm, projected by each block's own query and key projections with
`share_att_key`) and the scale √(d · (1 + terms)) — no absolute positions at the input unless
`position_biased_input`, embeddings zeroed at padding, an E → H projection before the embeddings' norm where E < H,
LayerNorm ε 1e-7, and the `ContextPooler` sequence head (dropout at `pooler_dropout` → dense → GELU → dropout at `cls_dropout` →
classifier on token 0).

Presets: `deberta-v3-SIZE` (or `deberta-v2-SIZE`, the same), SIZE xsmall (12 x 384), small (6 x 768), base
(12 x 768), large (24 x 1024), or a generic size (tiny for tests). Their pretraining recipe is DeBERTa-v3's
replaced-token detection (`bertforge.model.rtd`), whose head (`mask_predictions.*`) the key table reads and writes.

The MLM head loads under both of its names (`cls.predictions.*` as `transformers` names it, `lm_predictions.lm_head.*`
as Microsoft's checkpoints do) and is saved under the first. Differences from `transformers` beyond 512 tokens:
none (bertforge computes the same buckets for any length; Microsoft's code clamps distances to the table instead).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.errors import BertforgeError
from ..spec import EncoderSpec, HeadSpec, RelativeAttention
from .family import INTERNAL_LAYER, Family, Recipe

if TYPE_CHECKING:
    from ..config import BertConfig

#: `transformers.DebertaV2Config`'s defaults for what the encoder's parts read, and deberta-v3-base's
PART_DEFAULTS: dict[str, Any] = dict(
    relative_attention=False, max_relative_positions=-1, position_buckets=-1, pos_att_type=None,
    share_att_key=True, norm_rel_ebd="none", position_biased_input=True, pooler_hidden_act="gelu",
    pooler_dropout=0.0, conv_kernel_size=0, legacy=True,
)
TERMS = ("c2p", "p2c")


def part(config: BertConfig, name: str) -> Any:
    """A DeBERTa setting the config keeps among its extra fields (`config.extra`), or its default."""
    return config.extra.get(name, PART_DEFAULTS.get(name))


def score_terms(config: BertConfig) -> tuple[str, ...]:
    """`pos_att_type` as a tuple: a list, or the "p2c|c2p" string older configs hold."""
    value = part(config, "pos_att_type") or []
    if isinstance(value, str):
        value = [v.strip() for v in value.lower().split("|") if v.strip()]
    if not isinstance(value, list) or not set(value) <= set(TERMS):
        raise BertforgeError(f"config field 'pos_att_type' must list c2p and/or p2c, got {value!r}")
    return tuple(value)


def relative(config: BertConfig) -> RelativeAttention | None:
    terms = score_terms(config)
    if not part(config, "relative_attention"):
        if terms:
            raise BertforgeError("config: relative_attention is false but pos_att_type lists score terms; "
                                 "bertforge supports that combination only with relative_attention true")
        return None
    if not terms:
        raise BertforgeError("config: relative_attention needs pos_att_type (c2p, p2c or both)")
    max_distance = part(config, "max_relative_positions")
    if not isinstance(max_distance, int) or max_distance < 1:
        max_distance = config.max_position_embeddings
    buckets = part(config, "position_buckets")
    norm = [x.strip() for x in str(part(config, "norm_rel_ebd")).lower().split("|")]
    return RelativeAttention(buckets=buckets if isinstance(buckets, int) and buckets > 0 else 0,
                             max_distance=max_distance, terms=terms, share_key=bool(part(config, "share_att_key")),
                             norm="layer_norm" in norm)


def deberta_spec(family: Family, config: BertConfig) -> EncoderSpec:
    if part(config, "conv_kernel_size"):
        raise BertforgeError(f"config: conv_kernel_size {part(config, 'conv_kernel_size')} (DeBERTa-v2-xlarge's "
                             "convolution after the first layer) is not supported; use a checkpoint without it")
    act = part(config, "pooler_hidden_act")
    return EncoderSpec(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads, intermediate_size=config.intermediate_size,
        activation=config.hidden_act, max_positions=config.max_position_embeddings,
        embedding_size=config.embedding_size, projection="before-norm", type_vocab_size=config.type_vocab_size,
        pad_token_id=config.pad_token_id,
        positions="absolute" if part(config, "position_biased_input") else "none",
        zero_padding_embeddings=True, norm_eps=config.layer_norm_eps, relative=relative(config),
        hidden_dropout=config.hidden_dropout_prob, attention_dropout=config.attention_probs_dropout_prob,
        pooler=False, init_std=config.initializer_range,
        heads=HeadSpec(mlm_act=config.hidden_act, sequence="first-token", sequence_act=act, dropout_before_dense=True,
                       first_dropout=float(part(config, "pooler_dropout") or 0.0)),
    )


def write_config(out: dict[str, Any], config: BertConfig) -> dict[str, Any]:
    """config.json with every part setting explicit, the MLM head under `transformers`' (legacy) names."""
    for name, value in PART_DEFAULTS.items():
        out.setdefault(name, value)
    out["legacy"] = True
    out["pooler_hidden_size"] = config.hidden_size
    if config.embedding_size is None:
        out["embedding_size"] = config.hidden_size
    return out


_ATTENTION = INTERNAL_LAYER + "attention."
DEBERTA_V2 = Family(
    model_type="deberta-v2",
    name="DeBERTa-v2",
    class_prefix="DebertaV2",
    prefix="deberta",
    body=("embeddings", "encoder"),
    sentence_head=None,
    config_keys=dict(cls_dropout="classifier_dropout"),
    defaults=dict(  # `transformers.DebertaV2Config`'s
        vocab_size=128100, hidden_size=1536, num_hidden_layers=24, num_attention_heads=24, intermediate_size=6144,
        hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
        type_vocab_size=0, initializer_range=0.02, layer_norm_eps=1e-7, pad_token_id=0,
    ),
    unused=("num_hidden_groups",),
    written={"tie_word_embeddings": True},
    keys=(
        (_ATTENTION + "self.query_proj.", _ATTENTION + "self.query."),
        (_ATTENTION + "self.key_proj.", _ATTENTION + "self.key."),
        (_ATTENTION + "self.value_proj.", _ATTENTION + "self.value."),
        (_ATTENTION + "self.pos_key_proj.", _ATTENTION + "relative.pos_key_proj."),
        (_ATTENTION + "self.pos_query_proj.", _ATTENTION + "relative.pos_query_proj."),
        ("cls.predictions.", "cls.predictions."),  # saved under transformers' names ...
        ("lm_predictions.lm_head.dense.", "cls.predictions.transform.dense."),  # ... Microsoft's read too
        ("lm_predictions.lm_head.LayerNorm.", "cls.predictions.transform.LayerNorm."),
        ("lm_predictions.lm_head.bias", "cls.predictions.bias"),
        ("pooler.dense.", "classifier.dense."),  # the ContextPooler
        ("classifier.", "classifier.out_proj."),  # the sequence head's; a token classifier keeps `classifier.`
        ("mask_predictions.", "mask_predictions."),  # the RTD head, as Microsoft's checkpoints name it ...
        ("mask_predictions.classifer.", "mask_predictions.classifier."),  # ... and its code spells it
    ),
    read_spec=deberta_spec,
    write_config=write_config,
    # deberta-v3's parts: relative attention from 256 log buckets, both terms, shared keys, no absolute positions
    preset=dict(type_vocab_size=0, layer_norm_eps=1e-7, extra=dict(
        relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=256, max_relative_positions=-1,
        norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False)),
    # deberta-v3's sizes (layers, hidden, heads, intermediate); tiny, mini and medium are the generic ones
    sizes=dict(xsmall=(12, 384, 6, 1536), small=(6, 768, 12, 3072), base=(12, 768, 12, 3072),
               large=(24, 1024, 16, 4096)),
    # DeBERTa-v3's replaced-token detection; --objective mlm pretrains as DeBERTa-v2 did
    recipe=Recipe(objective="rtd"),
    objectives=("rtd",),
)

__all__ = ["DEBERTA_V2", "deberta_spec", "relative", "score_terms", "write_config"]
