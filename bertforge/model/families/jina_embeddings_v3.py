"""jina-embeddings-v3 (Sturua et al., 2024; `model_type: jina_embeddings_v3`, jinaai/jina-embeddings-v3-hf) as
`transformers`' `JinaEmbeddingsV3*` classes define it: XLM-RoBERTa's post-LN encoder with rotary positions
(NeoX layout, θ from `rope_parameters`, 20,000 by default) instead of a position table, so positions start at 0
whatever the padding id; its token types (one), pooler, first-token sequence head and MLM head are XLM-R's.

Its files (jina-embeddings-v3's own layout, which `transformers` writes) fuse query, key and value
(`encoder.layers.N.mixer.Wqkv`) and name the norms `emb_ln`, `norm1`, `norm2`, under XLM-R's `roberta.` prefix; the
adapter splits the projections for the encoder and joins them back. The layout `transformers` holds in memory
(`layers.N.self_attn.q_proj`, `post_attention_layernorm`, ...) is read too. Its tokenizer is XLM-R's
SentencePiece-style Unigram."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from torch import Tensor

from ..spec import EncoderSpec, LayerAttention
from .family import INTERNAL_LAYER, BertParts, Family, Recipe, bert_spec, join, split
from .nomic_bert import NATIVE_LAYER_KEYS, check_head_dim, rope_config, rope_theta

if TYPE_CHECKING:
    from ..config import BertConfig

DEFAULT_THETA = 20_000.0  # `transformers.JinaEmbeddingsV3Config`'s
_LAYER = "bert.layers.{n}."  # the in-memory layout's
_JINA = "bert.encoder.layers.{n}."  # its own
_QKV = ("mixer.Wq", "mixer.Wk", "mixer.Wv")  # the pieces of its fused `mixer.Wqkv`, as the key table names them


def unfuse(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Its `mixer.Wqkv` split into query, key and value."""
    return split(state, "mixer.Wqkv", _QKV)


def fuse(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of `unfuse`, into its own layout (what `transformers` writes and reads)."""
    return join(state, _QKV, "mixer.Wqkv")


def jina_spec(family: Family, config: BertConfig) -> EncoderSpec:
    check_head_dim(config)
    theta = rope_theta(config, DEFAULT_THETA)
    return replace(bert_spec(family, config),
                   layers=tuple(LayerAttention(rope_theta=theta) for _ in range(config.num_hidden_layers)))


JINA_EMBEDDINGS_V3 = Family(
    model_type="jina_embeddings_v3",
    name="jina-embeddings-v3",
    multiple_choice=False,  # transformers has no ForMultipleChoice class for it
    class_prefix="JinaEmbeddingsV3",
    prefix="roberta",
    body=("embeddings", "emb_ln", "encoder", "layers", "pooler"),
    parts=BertParts(positions="none", sequence_head="first-token", mlm_act="gelu"),
    sentence_head=None,
    defaults=dict(  # `transformers.JinaEmbeddingsV3Config`'s (jina-embeddings-v3's sizes)
        vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
        hidden_act="gelu", max_position_embeddings=8194, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
    ),
    unused=("embedding_size", "num_hidden_groups"),
    written={"tie_word_embeddings": True},
    keys=(
        ("bert.emb_ln.", "bert.embeddings.LayerNorm."),
        (_JINA + "mixer.Wq.", INTERNAL_LAYER + "attention.self.query."),  # of mixer.Wqkv
        (_JINA + "mixer.Wk.", INTERNAL_LAYER + "attention.self.key."),
        (_JINA + "mixer.Wv.", INTERNAL_LAYER + "attention.self.value."),
        (_JINA + "mixer.out_proj.", INTERNAL_LAYER + "attention.output.dense."),
        (_JINA + "norm1.", INTERNAL_LAYER + "attention.output.LayerNorm."),
        (_JINA + "mlp.fc1.", INTERNAL_LAYER + "intermediate.dense."),
        (_JINA + "mlp.fc2.", INTERNAL_LAYER + "output.dense."),
        (_JINA + "norm2.", INTERNAL_LAYER + "output.LayerNorm."),
        *NATIVE_LAYER_KEYS[:5],  # self_attn.q_proj, k_proj, v_proj, o_proj; post_attention_layernorm
        (_LAYER + "mlp.fc1.", INTERNAL_LAYER + "intermediate.dense."),
        (_LAYER + "mlp.fc2.", INTERNAL_LAYER + "output.dense."),
        NATIVE_LAYER_KEYS[7],  # post_mlp_layernorm
        ("lm_head.dense.", "cls.predictions.transform.dense."),
        ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
        ("lm_head.bias", "cls.predictions.bias"),
    ),
    dropped=(r"^lm_head\.decoder\.(weight|bias)$",),
    # the names of `transformers`' modules (what PEFT targets): the in-memory layout, nothing fused
    memory_keys=(*NATIVE_LAYER_KEYS[:5], (_LAYER + "mlp.fc1.", INTERNAL_LAYER + "intermediate.dense."),
                 (_LAYER + "mlp.fc2.", INTERNAL_LAYER + "output.dense."), NATIVE_LAYER_KEYS[7]),
    unfuse=unfuse,
    fuse=fuse,
    read_spec=jina_spec,
    write_config=rope_config(DEFAULT_THETA),
    # jina-embeddings-v3's: one token type, eps 1e-5, 8,194 positions, XLM-R's padding id
    preset=dict(type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, max_position_embeddings=8194),
    recipe=Recipe(adam_beta2=0.98),  # XLM-R's (its base model was pretrained as XLM-R)
    tokenizer="xlm-roberta",
)

__all__ = ["JINA_EMBEDDINGS_V3", "fuse", "jina_spec", "unfuse"]
