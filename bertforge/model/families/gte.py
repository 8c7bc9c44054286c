"""GTE's "new" architecture (Zhang et al., 2024; `model_type: gte`, gte-base/large-en-v1.5, mGTE
gte-multilingual-base, snowflake-arctic-embed-m-v2.0) as `transformers`' `Gte*` classes define it: NomicBERT's
layout (`nomic_bert.py`: post-LN, rotary positions, a gated feed-forward) with biases in attention and on the
feed-forward's output (not its gate and up projections), dropout inside the gated feed-forward, θ 160,000 by default,
token types where `type_vocab_size` > 0 (gte-base-en-v1.5 has none), 8,192 positions, and an MLM head whose
transform is GELU and whose decoder holds the output bias. Its files (GTE's own layout, which `transformers`
writes) fuse query, key and value (`attention.qkv_proj`) and the feed-forward's up and gate (`mlp.up_gate_proj`,
up first); the adapter splits and reorders them for the encoder and back. The tokenizer of its English models is BERT's WordPiece
(mGTE's is XLM-R's, read from its files)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from ..spec import EncoderSpec
from .family import INTERNAL_LAYER, Family, Recipe, join, split
from .nomic_bert import NATIVE_LAYER_KEYS, join_native, rope_config, rope_theta, rotary_spec, split_native

if TYPE_CHECKING:
    from ..config import BertConfig

DEFAULT_THETA = 160_000.0  # `transformers.GteConfig`'s
_LAYER = "bert.encoder.layer.{n}."  # GTE's own layout, which `transformers` writes
_QKV = ("attention.Wq", "attention.Wk", "attention.Wv")  # the pieces of its fused `attention.qkv_proj`
KEYS: tuple[tuple[str, str], ...] = (
    (_LAYER + "attention.Wq.", INTERNAL_LAYER + "attention.self.query."),
    (_LAYER + "attention.Wk.", INTERNAL_LAYER + "attention.self.key."),
    (_LAYER + "attention.Wv.", INTERNAL_LAYER + "attention.self.value."),
    (_LAYER + "attention.o_proj.", INTERNAL_LAYER + "attention.output.dense."),
    (_LAYER + "attn_ln.", INTERNAL_LAYER + "attention.output.LayerNorm."),
    (_LAYER + "mlp.gate_up.", INTERNAL_LAYER + "intermediate.dense."),  # its up_gate_proj, halves swapped
    (_LAYER + "mlp.down_proj.", INTERNAL_LAYER + "output.dense."),
    (_LAYER + "mlp_ln.", INTERNAL_LAYER + "output.LayerNorm."),
    ("lm_head.dense.", "cls.predictions.transform.dense."),
    ("lm_head.norm.", "cls.predictions.transform.LayerNorm."),
    ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),  # the in-memory layout's name, read too
    ("lm_head.decoder.bias", "cls.predictions.bias"),
    *NATIVE_LAYER_KEYS,
)


def unfuse(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """GTE's `attention.qkv_proj` split into query, key and value; its `mlp.up_gate_proj` (up first) made the
    encoder's gated layer (gate first); the in-memory layout's separate projections joined the same way."""
    state = split(split(state, "attention.qkv_proj", _QKV), "mlp.up_gate_proj", ("mlp.up", "mlp.gate"))
    return join_native(join(state, ("mlp.gate", "mlp.up"), "mlp.gate_up"))


def fuse(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of `unfuse`, into GTE's layout (what `transformers` writes and reads)."""
    state = split(join(state, _QKV, "attention.qkv_proj"), "mlp.gate_up", ("mlp.gate", "mlp.up"))
    return join(state, ("mlp.up", "mlp.gate"), "mlp.up_gate_proj")


def gte_spec(family: Family, config: BertConfig) -> EncoderSpec:
    return rotary_spec(config, rope_theta(config, DEFAULT_THETA), attention_bias=True, mlp_bias=False,
                       mlp_out_bias=True, ffn_inner_dropout=config.hidden_dropout_prob, mlm_act="gelu")


write_config = rope_config(DEFAULT_THETA)


GTE = Family(
    model_type="gte",
    name="GTE",
    multiple_choice=False,  # transformers has no ForMultipleChoice class for it
    class_prefix="Gte",
    prefix="gte",
    body=("embeddings", "encoder", "layers", "pooler"),
    sentence_head=None,
    defaults=dict(  # `transformers.GteConfig`'s (mGTE's sizes)
        vocab_size=250048, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0, max_position_embeddings=8192,
        type_vocab_size=1, initializer_range=0.02, layer_norm_eps=1e-12, pad_token_id=1,
    ),
    unused=("embedding_size", "num_hidden_groups"),
    written={"tie_word_embeddings": True},
    keys=KEYS,
    dropped=(r"^lm_head\.decoder\.weight$",),  # tied to the word embeddings
    unfuse=unfuse,
    fuse=fuse,
    memory_keys=NATIVE_LAYER_KEYS,
    memory_fuse=split_native,
    read_spec=gte_spec,
    write_config=write_config,
    # gte-base-en-v1.5's shape of embeddings: BERT's vocabulary (pad id 0), no token types, 8,192 positions
    preset=dict(type_vocab_size=0, pad_token_id=0, max_position_embeddings=8192, attention_probs_dropout_prob=0.0),
    recipe=Recipe(mlm_probability=0.3),  # mGTE's masking rate
    tokenizer="bert",
)

__all__ = ["GTE", "fuse", "gte_spec", "unfuse"]
