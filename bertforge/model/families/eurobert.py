"""EuroBERT (Boizard et al., 2025; `model_type: eurobert`, EuroBERT-210m / 610m / 2.1b, the backbone of
jina-embeddings-v5-text-nano): Llama's block run bidirectionally. Pre-norm blocks with RMSNorm (`rms_norm_eps`) before
attention and before the feed-forward and a final norm, no norm on the embeddings, no position table, no token
types, rotary positions (NeoX layout; θ from `rope_parameters`, 10,000 by default, 250,000 in the published
models), grouped-query attention (`num_key_value_heads` key/value heads shared by the query heads), a SwiGLU
feed-forward, no biases (`attention_bias`, `mlp_bias`) and no dropout but attention's.

Its heads as `transformers` has them: MLM is a plain `lm_head` projection of the final norm's output (no transform;
its own weight unless `tie_word_embeddings`, a bias only with `mlp_bias`); sequence classification is dense → GELU
→ classifier on token 0 (`classifier_pooling` "bos"), on the mean of the real tokens ("mean"), or on every token
with the logits averaged over the real ones ("late", the default); token classification a linear layer alone.

Its files keep the feed-forward's gate (`mlp.gate_proj`) and up (`mlp.up_proj`) projections apart; the adapter
joins them into the encoder's one gated layer (gate first) and splits them back when saving."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.errors import BertforgeError
from ..spec import EncoderSpec, HeadSpec, LayerAttention
from .family import INTERNAL_LAYER, Family, Recipe
from .nomic_bert import NATIVE_LAYER_KEYS, check_head_dim, join_native, rope_config, rope_theta, split_native

if TYPE_CHECKING:
    from ..config import BertConfig

DEFAULT_THETA = 10_000.0  # `transformers.EuroBertConfig`'s (Llama's)
PUBLISHED_THETA = 250_000.0  # EuroBERT-210m's, 610m's and 2.1b's config.json
#: `transformers.EuroBertConfig`'s defaults for what the encoder's parts read
PART_DEFAULTS: dict[str, Any] = dict(attention_bias=False, mlp_bias=False, classifier_pooling="late",
                                     tie_word_embeddings=False)
POOLINGS = {"bos": "cls", "mean": "mean", "late": "late"}  # its `classifier_pooling` -> `HeadSpec.pooling`
SPECIAL_IDS = ("bos_token_id", "eos_token_id")  # config.json's token ids besides pad (None where unknown)


def part(config: BertConfig, name: str) -> Any:
    """A EuroBERT setting the config keeps among its extra fields, or its default."""
    return config.extra.get(name, PART_DEFAULTS.get(name))


def kv_heads(config: BertConfig) -> int | None:
    heads = config.extra.get("num_key_value_heads")
    if heads is None:
        return None
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or config.num_attention_heads % heads:
        raise BertforgeError(f"config field 'num_key_value_heads' must divide num_attention_heads "
                             f"({config.num_attention_heads}), got {heads!r}")
    return heads


def eurobert_spec(family: Family, config: BertConfig) -> EncoderSpec:
    check_head_dim(config)
    pooling = part(config, "classifier_pooling")
    if pooling not in POOLINGS:
        raise BertforgeError(f"config field 'classifier_pooling' must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    if config.extra.get("pretraining_tp", 1) != 1:
        raise BertforgeError(f"config field 'pretraining_tp' {config.extra['pretraining_tp']!r} is not supported (only 1)")
    theta = rope_theta(config, DEFAULT_THETA)
    mlp_bias = bool(part(config, "mlp_bias"))
    return EncoderSpec(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads, intermediate_size=config.intermediate_size,
        activation=config.hidden_act, max_positions=config.max_position_embeddings, type_vocab_size=0,
        pad_token_id=config.pad_token_id, positions="none", embedding_norm=False, norm="pre", norm_kind="rmsnorm",
        final_norm=True, norm_bias=False, norm_eps=config.layer_norm_eps, ffn="gated",
        attention_bias=bool(part(config, "attention_bias")), num_kv_heads=kv_heads(config), mlp_bias=mlp_bias,
        layers=tuple(LayerAttention(rope_theta=theta) for _ in range(config.num_hidden_layers)),
        hidden_dropout=config.hidden_dropout_prob, attention_dropout=config.attention_probs_dropout_prob,
        pooler=False, init_std=config.initializer_range,
        heads=HeadSpec(mlm_transform=False, tied_decoder=bool(part(config, "tie_word_embeddings")),
                       decoder_bias=mlp_bias, sequence="transform", sequence_act="gelu", transform_norm=False,
                       pooling=POOLINGS[pooling]),
    )


_write_rope = rope_config(DEFAULT_THETA)


def write_config(out: dict[str, Any], config: BertConfig) -> dict[str, Any]:
    out = _write_rope(out, config)
    out.setdefault("num_key_value_heads", config.num_attention_heads)
    out.setdefault("head_dim", config.hidden_size // config.num_attention_heads)
    for name, value in PART_DEFAULTS.items():
        out.setdefault(name, value)
    for name in SPECIAL_IDS:  # unknown (no tokenizer said): None, not transformers' ids of EuroBERT's vocabulary
        out.setdefault(name, None)
    return out


#: (layers, hidden, heads, intermediate) of the published models (their config.json)
SIZES = {"210m": (12, 768, 12, 3072), "610m": (26, 1152, 18, 4096), "2.1b": (32, 2304, 18, 6144)}
KV_HEADS = {1152: 6, 2304: 6}  # the 610m's and 2.1b's grouped-query attention, by hidden size


def sized_preset(hidden: int) -> dict[str, Any]:
    """The published models' θ, and their key/value heads where they have fewer than heads."""
    extra: dict[str, Any] = {"rope_parameters": {"rope_type": "default", "rope_theta": PUBLISHED_THETA}}
    if hidden in KV_HEADS:
        extra["num_key_value_heads"] = KV_HEADS[hidden]
    return {"extra": extra}


_LAYER = "bert.layers.{n}."
EUROBERT = Family(
    model_type="eurobert",
    name="EuroBERT",
    multiple_choice=False,  # transformers has no ForMultipleChoice class for it
    class_prefix="EuroBert",
    prefix="model",
    body=("embed_tokens", "layers", "norm"),
    special_ids=SPECIAL_IDS,
    sentence_head=None,
    config_keys=dict(rms_norm_eps="layer_norm_eps", attention_dropout="attention_probs_dropout_prob"),
    defaults=dict(  # `transformers.EuroBertConfig`'s (EuroBERT-210m's sizes)
        vocab_size=128256, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        hidden_act="silu", max_position_embeddings=8192, layer_norm_eps=1e-5, pad_token_id=128001,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, type_vocab_size=0, initializer_range=0.02,
    ),
    unused=("type_vocab_size", "embedding_size", "num_hidden_groups", "hidden_dropout_prob", "classifier_dropout"),
    written={},
    keys=(
        ("bert.embed_tokens.", "bert.embeddings.word_embeddings."),
        (_LAYER + "input_layernorm.", INTERNAL_LAYER + "attention.norm."),
        *NATIVE_LAYER_KEYS[:4],  # self_attn.q_proj, k_proj, v_proj, o_proj
        (_LAYER + "post_attention_layernorm.", INTERNAL_LAYER + "intermediate.norm."),
        *NATIVE_LAYER_KEYS[5:7],  # mlp.gate_up (gate_proj and up_proj, joined), mlp.down_proj
        ("bert.norm.", "bert.encoder.final_norm."),
        ("lm_head.weight", "cls.predictions.decoder"),
        ("lm_head.bias", "cls.predictions.bias"),
        ("dense.", "head_transform.dense."),  # the sequence head's; its classifier and the token one keep `classifier.`
    ),
    unfuse=join_native,  # its separate mlp.gate_proj / mlp.up_proj as the encoder's gated layer (gate first)
    fuse=split_native,  # and back
    read_spec=eurobert_spec,
    write_config=write_config,
    sizes=SIZES,
    sized_preset=sized_preset,
    preset=dict(type_vocab_size=0, hidden_act="silu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                layer_norm_eps=1e-5, max_position_embeddings=8192),
    # EuroBERT's pretraining (Boizard et al., 2025): MLM only at a 50 % masking ratio, documents packed into long
    # rows, a warmup-stable-decay schedule
    recipe=Recipe(mlm_probability=0.5, packing="documents", decay="wsd"),
    tokenizer="eurobert",
)

__all__ = ["EUROBERT", "eurobert_spec", "write_config"]
