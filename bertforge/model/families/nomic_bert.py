"""NomicBERT (Nussbaum et al., 2024; `model_type: nomic_bert`, nomic-embed-text-v1 / v1.5): BERT's post-LN blocks
with rotary positions (NeoX layout, θ from `rope_parameters`, 1,000 by default) instead of a position table, a
SwiGLU feed-forward (`act(gate) · up`, then down), no biases in attention or feed-forward (the norms keep theirs),
BERT's token types, pooler, MLM head (its transform with the config's activation) and classifiers.

Its files (nomic-embed's, and what `transformers` writes) fuse query, key and value (`attn.Wqkv`) and keep the
feed-forward's up (`mlp.fc11`) and gate (`mlp.fc12`) apart; the adapter splits the first and joins the second into
the encoder's one gated `intermediate.dense` (gate first), and back when saving. The layout `transformers` holds
in memory (`self_attn.q_proj`, `mlp.gate_proj`, ..., which GTE shares) is read too.

Its tokenizer is BERT's WordPiece; its sentence-transformers directories carry the prompts (`search_query: `,
`search_document: `) that `bertforge.pipelines` reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import Tensor

from ...core.errors import BertforgeError
from ..spec import EncoderSpec, HeadSpec, LayerAttention
from .family import INTERNAL_LAYER, Family, Recipe, join, split

if TYPE_CHECKING:
    from ..config import BertConfig

DEFAULT_THETA = 1000.0  # `transformers.NomicBertConfig`'s
_LAYER = "bert.layers.{n}."
#: the layer layout `transformers` 5.x holds in memory for its rotary encoders (NomicBERT, GTE), as files may have
#: it: (file, internal) key prefixes, read only (the checkpoints' own layouts are what is written)
NATIVE_LAYER_KEYS: tuple[tuple[str, str], ...] = (
    (_LAYER + "self_attn.q_proj.", INTERNAL_LAYER + "attention.self.query."),
    (_LAYER + "self_attn.k_proj.", INTERNAL_LAYER + "attention.self.key."),
    (_LAYER + "self_attn.v_proj.", INTERNAL_LAYER + "attention.self.value."),
    (_LAYER + "self_attn.o_proj.", INTERNAL_LAYER + "attention.output.dense."),
    (_LAYER + "post_attention_layernorm.", INTERNAL_LAYER + "attention.output.LayerNorm."),
    (_LAYER + "mlp.gate_up.", INTERNAL_LAYER + "intermediate.dense."),  # gate_proj and up_proj, joined
    (_LAYER + "mlp.down_proj.", INTERNAL_LAYER + "output.dense."),
    (_LAYER + "post_mlp_layernorm.", INTERNAL_LAYER + "output.LayerNorm."),
)
_QKV = ("attn.Wq", "attn.Wk", "attn.Wv")  # the pieces of nomic-embed's fused `attn.Wqkv`, as the key table names them
_NOMIC = "bert.encoder.layers.{n}."  # nomic-embed's own layout, which `transformers` writes
KEYS: tuple[tuple[str, str], ...] = (
    ("bert.emb_ln.", "bert.embeddings.LayerNorm."),
    (_NOMIC + "attn.Wq.", INTERNAL_LAYER + "attention.self.query."),  # of attn.Wqkv
    (_NOMIC + "attn.Wk.", INTERNAL_LAYER + "attention.self.key."),
    (_NOMIC + "attn.Wv.", INTERNAL_LAYER + "attention.self.value."),
    (_NOMIC + "attn.out_proj.", INTERNAL_LAYER + "attention.output.dense."),
    (_NOMIC + "norm1.", INTERNAL_LAYER + "attention.output.LayerNorm."),
    (_NOMIC + "mlp.fc1.", INTERNAL_LAYER + "intermediate.dense."),  # fc12 (the gate) and fc11 (up), joined
    (_NOMIC + "mlp.fc2.", INTERNAL_LAYER + "output.dense."),
    (_NOMIC + "norm2.", INTERNAL_LAYER + "output.LayerNorm."),
    ("cls.predictions.transform.layer_norm.", "cls.predictions.transform.LayerNorm."),
    *NATIVE_LAYER_KEYS,
)


def join_native(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The in-memory layout's separate `mlp.gate_proj` / `mlp.up_proj` as the encoder's one gated layer."""
    return join(state, ("gate_proj", "up_proj"), "gate_up")


def split_native(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of `join_native`: the in-memory layout's `mlp.gate_proj` and `mlp.up_proj`."""
    return split(state, "mlp.gate_up", ("mlp.gate_proj", "mlp.up_proj"))


def unfuse(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """nomic-embed's `attn.Wqkv` split into query, key and value; its `mlp.fc12` (the gate) and `fc11` (up) joined
    into the encoder's gated layer (gate first); the same for the in-memory layout's separate projections."""
    return join_native(join(split(state, "attn.Wqkv", _QKV), ("mlp.fc12", "mlp.fc11"), "mlp.fc1"))


def fuse(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of `unfuse`, into nomic-embed's layout (what `transformers` writes and reads)."""
    return split(join(state, _QKV, "attn.Wqkv"), "mlp.fc1", ("mlp.fc12", "mlp.fc11"))


def rope_theta(config: BertConfig, default: float) -> float:
    """The rotary θ: 5.x's `rope_parameters` (only the default rotary kind), an older `rope_theta`, or `default`."""
    params = config.extra.get("rope_parameters") or {}
    scaling = config.extra.get("rope_scaling") or {}
    for source, entry in (("rope_parameters", params), ("rope_scaling", scaling)):
        kind = entry.get("rope_type", entry.get("type", "default")) if isinstance(entry, dict) else entry
        if kind != "default":
            raise BertforgeError(f"config field {source!r}: rope_type {kind!r} is not supported (only 'default')")
    theta = params.get("rope_theta", config.extra.get("rope_theta", default))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise BertforgeError(f"config field 'rope_theta' must be a positive number, got {theta!r}")
    return float(theta)


def check_head_dim(config: BertConfig) -> None:
    head_dim = config.extra.get("head_dim")
    if head_dim is not None and head_dim != config.hidden_size // config.num_attention_heads:
        raise BertforgeError(f"config field 'head_dim' {head_dim!r} is not hidden_size / num_attention_heads "
                             f"({config.hidden_size // config.num_attention_heads}); bertforge supports only that")


def rotary_spec(config: BertConfig, theta: float, *, attention_bias: bool, mlp_bias: bool, mlp_out_bias: bool,
                ffn_inner_dropout: float, mlm_act: str) -> EncoderSpec:
    """The post-LN rotary encoder with a gated feed-forward that NomicBERT and GTE share."""
    check_head_dim(config)
    return EncoderSpec(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads, intermediate_size=config.intermediate_size,
        activation=config.hidden_act, max_positions=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size, pad_token_id=config.pad_token_id, positions="none",
        norm_eps=config.layer_norm_eps, ffn="gated", attention_bias=attention_bias, mlp_bias=mlp_bias,
        mlp_out_bias=mlp_out_bias, layers=tuple(LayerAttention(rope_theta=theta) for _ in range(config.num_hidden_layers)),
        hidden_dropout=config.hidden_dropout_prob, attention_dropout=config.attention_probs_dropout_prob,
        ffn_inner_dropout=ffn_inner_dropout, pooler=False, init_std=config.initializer_range,
        heads=HeadSpec(mlm_act=mlm_act),
    )


def nomic_spec(family: Family, config: BertConfig) -> EncoderSpec:
    return rotary_spec(config, rope_theta(config, DEFAULT_THETA), attention_bias=False, mlp_bias=False,
                       mlp_out_bias=False, ffn_inner_dropout=0.0, mlm_act=config.hidden_act)


def rope_config(default: float) -> Callable[[dict[str, Any], "BertConfig"], dict[str, Any]]:
    """A `Family.write_config` that writes the rotary θ (the config's, else `default`) in 5.x's `rope_parameters`."""
    def write_config(out: dict[str, Any], config: BertConfig) -> dict[str, Any]:
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": rope_theta(config, default)}
        out.pop("rope_theta", None)
        return out

    return write_config


write_config = rope_config(DEFAULT_THETA)


NOMIC_BERT = Family(
    model_type="nomic_bert",
    name="NomicBERT",
    multiple_choice=False,  # transformers has no ForMultipleChoice class for it
    class_prefix="NomicBert",
    prefix="nomic_bert",
    body=("embeddings", "emb_ln", "encoder", "layers", "pooler"),
    sentence_head=None,
    defaults=dict(  # `transformers.NomicBertConfig`'s
        vocab_size=30528, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        hidden_act="silu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=2048,
        type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12, pad_token_id=0,
    ),
    unused=("embedding_size", "num_hidden_groups"),
    written={"tie_word_embeddings": True},
    keys=KEYS,
    unfuse=unfuse,
    fuse=fuse,
    memory_keys=NATIVE_LAYER_KEYS,
    memory_fuse=split_native,
    read_spec=nomic_spec,
    write_config=write_config,
    # nomic-embed-text-v1.5's: SwiGLU, no dropout, 2,048 positions
    preset=dict(hidden_act="silu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                max_position_embeddings=2048, type_vocab_size=2),
    recipe=Recipe(mlm_probability=0.3),  # nomic-bert-2048's masking rate
    tokenizer="bert",
)

__all__ = ["DEFAULT_THETA", "NATIVE_LAYER_KEYS", "NOMIC_BERT", "fuse", "join_native", "nomic_spec", "rope_theta", "split_native",
           "rope_config", "rotary_spec", "unfuse", "write_config"]
