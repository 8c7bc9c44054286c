"""ModernBERT (Warner et al., 2024): pre-LN blocks without biases (no norm before block 0's attention, a final
norm), rotary positions instead of a position table (θ 160,000 in global layers, 10,000 in local ones), a global
layer every third and a sliding window of 128 tokens elsewhere, a GeGLU feed-forward, a scaled truncated-normal
init, and heads with a transform (dense → GELU → norm) before the decoder or classifier; the sequence head pools
token 0 or the mean. MLM only.

Its files fuse query, key and value (`attn.Wqkv`), which the adapter splits into the encoder's three projections
and joins back. Both `config.json` spellings load: transformers 4.48's (`global_attn_every_n_layers`,
`global_rope_theta`, `local_rope_theta`) and 5.x's (`layer_types`, `rope_parameters`); both are written, so that a
saved model loads in every `transformers` from 4.48 on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from ...core.errors import BertforgeError
from ...core.ops import ACTIVATIONS
from ..spec import EncoderSpec, HeadSpec, LayerAttention
from .family import INTERNAL_LAYER, Family, Ladder, Recipe, join, split

if TYPE_CHECKING:
    from ..config import BertConfig

GLOBAL, LOCAL = "full_attention", "sliding_attention"  # `layer_types` names
#: `transformers.ModernBertConfig`'s defaults for what the encoder's parts read (modernbert-base's)
PART_DEFAULTS: dict[str, Any] = dict(
    global_attn_every_n_layers=3, global_rope_theta=160_000.0, local_rope_theta=10_000.0, local_attention=128,
    norm_bias=False, attention_bias=False, mlp_bias=False, decoder_bias=True, classifier_bias=False,
    classifier_activation="gelu", classifier_pooling="cls", mlp_dropout=0.0,
)
_QKV = ("attn.Wq", "attn.Wk", "attn.Wv")  # the file's fused attn.Wqkv, split in this order
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")  # config.json fields it may carry


def part(config: BertConfig, name: str) -> Any:
    """A ModernBERT setting the config keeps among its extra fields (`config.extra`), or its default."""
    return config.extra.get(name, PART_DEFAULTS.get(name))


def layer_types(config: BertConfig) -> list[str]:
    """Each layer's attention: 5.x's `layer_types`, or 4.48's "global when i % global_attn_every_n_layers == 0"."""
    n = config.num_hidden_layers
    types = config.extra.get("layer_types")
    if types is None:
        every = part(config, "global_attn_every_n_layers")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise BertforgeError(f"config field 'global_attn_every_n_layers' must be a positive integer, got {every!r}")
        return [GLOBAL if i % every == 0 else LOCAL for i in range(n)]
    if not isinstance(types, list) or len(types) != n or not set(types) <= {GLOBAL, LOCAL}:
        raise BertforgeError(f"config field 'layer_types' must list {n} of {GLOBAL!r} / {LOCAL!r}, got {types!r}")
    return types


def rope_thetas(config: BertConfig) -> dict[str, float]:
    """θ of the global and the local layers: 5.x's `rope_parameters`, or 4.48's `global_rope_theta` /
    `local_rope_theta`. Only the default rotary kind is implemented; a scaled one is refused."""
    params = config.extra.get("rope_parameters") or {}
    thetas = {}
    for kind, old_name in ((GLOBAL, "global_rope_theta"), (LOCAL, "local_rope_theta")):
        entry = params.get(kind) or {}
        if entry.get("rope_type", "default") != "default":
            raise BertforgeError(f"config field 'rope_parameters': rope_type {entry['rope_type']!r} of the {kind} "
                                 "layers is not supported (only 'default')")
        theta = entry.get("rope_theta", part(config, old_name))
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
            raise BertforgeError(f"config field {old_name!r} (rope_theta) must be a positive number, got {theta!r}")
        thetas[kind] = float(theta)
    return thetas


def global_theta_keys(config: BertConfig, theta: float) -> dict[str, Any]:
    """config.json keys that give the global layers' rotary θ `theta` (context extension: ModernBERT trains at 1,024
    tokens with θ 10,000, then continues at 8,192 with 160,000), in both spellings; the local layers keep theirs."""
    thetas = {**rope_thetas(config), GLOBAL: float(theta)}
    return {"global_rope_theta": float(theta),
            "rope_parameters": {kind: {"rope_type": "default", "rope_theta": value} for kind, value in thetas.items()}}


def modernbert_spec(family: Family, config: BertConfig) -> EncoderSpec:
    window = part(config, "local_attention")
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise BertforgeError(f"config field 'local_attention' must be an integer of at least 2, got {window!r}")
    act = part(config, "classifier_activation")
    if act not in ACTIVATIONS:
        raise BertforgeError(f"config field 'classifier_activation' is {act!r}; supported: {', '.join(ACTIVATIONS)}")
    pooling = part(config, "classifier_pooling")
    if pooling not in ("cls", "mean"):
        raise BertforgeError(f"config field 'classifier_pooling' must be 'cls' or 'mean', got {pooling!r}")
    thetas = rope_thetas(config)
    layers = tuple(LayerAttention(window=window if kind == LOCAL else None, rope_theta=thetas[kind])
                   for kind in layer_types(config))
    return EncoderSpec(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads, intermediate_size=config.intermediate_size,
        activation=config.hidden_act, max_positions=config.max_position_embeddings, type_vocab_size=0,
        pad_token_id=config.pad_token_id, positions="none", norm="pre", first_attention_norm=False,
        final_norm=True, norm_bias=bool(part(config, "norm_bias")), norm_eps=config.layer_norm_eps, ffn="gated",
        attention_bias=bool(part(config, "attention_bias")), mlp_bias=bool(part(config, "mlp_bias")),
        layers=layers, hidden_dropout=config.hidden_dropout_prob,
        attention_dropout=config.attention_probs_dropout_prob,
        attention_output_dropout=config.attention_probs_dropout_prob, ffn_output_dropout=0.0,
        ffn_inner_dropout=float(part(config, "mlp_dropout")), pooler=False, init="scaled-truncated",
        init_std=config.initializer_range,
        heads=HeadSpec(mlm_act=act, transform_bias=bool(part(config, "classifier_bias")),
                       decoder_bias=bool(part(config, "decoder_bias")), sequence="transform", sequence_act=act,
                       pooling=pooling, token_transform=True),
    )


def unfuse(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """`attn.Wqkv` [3H, H] (and its bias) → `attn.Wq`, `attn.Wk`, `attn.Wv` [H, H] each."""
    return split(state, "attn.Wqkv", _QKV)


def fuse(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of `unfuse`, on the file's names."""
    return join(state, _QKV, "attn.Wqkv")


def write_config(out: dict[str, Any], config: BertConfig) -> dict[str, Any]:
    """config.json in both spellings: 5.x's `layer_types` and `rope_parameters`, and 4.48's
    `global_attn_every_n_layers` and θ pair where the layers follow its every-n-th rule."""
    types, thetas = layer_types(config), rope_thetas(config)
    out["layer_types"] = types
    out["rope_parameters"] = {kind: {"rope_type": "default", "rope_theta": theta} for kind, theta in thetas.items()}
    out["global_rope_theta"], out["local_rope_theta"] = thetas[GLOBAL], thetas[LOCAL]
    def rule(n: int) -> list[str]:
        return [GLOBAL if i % n == 0 else LOCAL for i in range(len(types))]

    given = config.extra.get("global_attn_every_n_layers", PART_DEFAULTS["global_attn_every_n_layers"])
    every = given if types == rule(given) else next((n for n in range(1, len(types) + 1) if types == rule(n)), None)
    if every is not None:
        out["global_attn_every_n_layers"] = every
    else:  # no 4.48 spelling says these layers: 4.48 reads its default rule, 5.x the layer_types
        out.pop("global_attn_every_n_layers", None)
    for name, value in PART_DEFAULTS.items():
        if name != "global_attn_every_n_layers":
            out.setdefault(name, value)
    for name in SPECIAL_IDS:  # unknown (no tokenizer said): None, not transformers' ids of modernbert-base's vocabulary
        out.setdefault(name, None)
    return out


def kept_layer_types(config: BertConfig, layers: list[int]) -> dict[str, Any]:
    """`Family.layer_fields`: a model of some of these layers keeps each one's attention kind (global or local)."""
    types = layer_types(config)
    return {"extra": {**config.extra, "layer_types": [types[i] for i in layers]}}


def _shape(layers: int, hidden: int, heads: int, intermediate: int, **fields: Any) -> dict[str, Any]:
    return dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=intermediate,
                **fields)


#: Ettin (Weller et al., 2025, "Seq vs Seq: an open suite of paired encoders and decoders"; jhu-clsp/ettin-encoder-*):
#: ModernBERT's architecture, tokenizer (50,368 tokens) and recipe (30 % masking, warmup-stable-decay, trained at
#: 1,024 tokens, then extended to long context) at six sizes, 150m and 400m being ModernBERT-base's and -large's shapes.
ETTIN = Ladder(
    name="ettin",
    sizes={size: _shape(*shape, vocab_size=50368, pad_token_id=50283) for size, shape in (
        ("17m", (7, 256, 4, 384)), ("32m", (10, 384, 6, 576)), ("68m", (19, 512, 8, 768)),
        ("150m", (22, 768, 12, 1152)), ("400m", (28, 1024, 16, 2624)), ("1b", (28, 1792, 28, 3840)))},
    source="Weller et al., 2025 (arXiv 2507.11412); the jhu-clsp/ettin-encoder-* config.json files",
)
#: mmBERT (Marone et al., 2025; jhu-clsp/mmBERT-small / -base): ModernBERT's architecture with Gemma 2's 256,000-token
#: vocabulary over 1,833 languages, 8,192 tokens, θ 160,000 in the global and the local layers; its recipe masks 30 %
#: of the tokens at first, lowered to 15 % and 5 % in its later phases (bertforge keeps the first rate).
_MMBERT = dict(vocab_size=256_000, pad_token_id=0,
               extra={"global_rope_theta": 160_000.0, "local_rope_theta": 160_000.0})
MMBERT = Ladder(
    name="mmbert",
    sizes={"small": _shape(22, 384, 6, 1152, **_MMBERT), "base": _shape(22, 768, 12, 1152, **_MMBERT)},
    recipe=Recipe(mlm_probability=0.3, packing="documents", decay="wsd", adam_beta2=0.98),
    tokenizer="mmbert",  # Gemma 2's kind: byte-fallback BPE
    source="Marone et al., 2025 (arXiv 2509.06888); the jhu-clsp/mmBERT-small and -base config.json files",
)

_LAYER = "bert.layers.{n}."
MODERNBERT = Family(
    model_type="modernbert",
    name="ModernBERT",
    class_prefix="ModernBert",
    prefix="model",
    body=("embeddings", "layers", "final_norm"),
    special_ids=SPECIAL_IDS,
    layer_fields=kept_layer_types,
    sentence_head=None,
    config_keys=dict(hidden_activation="hidden_act", norm_eps="layer_norm_eps",
                     embedding_dropout="hidden_dropout_prob", attention_dropout="attention_probs_dropout_prob"),
    defaults=dict(  # `transformers.ModernBertConfig`'s (modernbert-base's sizes)
        vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22, num_attention_heads=12,
        hidden_act="gelu", max_position_embeddings=8192, layer_norm_eps=1e-5, pad_token_id=50283,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0, type_vocab_size=0,
    ),
    unused=("type_vocab_size", "embedding_size", "num_hidden_groups"),
    written={"tie_word_embeddings": True},
    keys=(
        ("bert.embeddings.tok_embeddings.", "bert.embeddings.word_embeddings."),
        ("bert.embeddings.norm.", "bert.embeddings.LayerNorm."),
        (_LAYER + "attn_norm.", INTERNAL_LAYER + "attention.norm."),
        (_LAYER + "attn.Wq.", INTERNAL_LAYER + "attention.self.query."),
        (_LAYER + "attn.Wk.", INTERNAL_LAYER + "attention.self.key."),
        (_LAYER + "attn.Wv.", INTERNAL_LAYER + "attention.self.value."),
        (_LAYER + "attn.Wo.", INTERNAL_LAYER + "attention.output.dense."),
        (_LAYER + "mlp_norm.", INTERNAL_LAYER + "intermediate.norm."),
        (_LAYER + "mlp.Wi.", INTERNAL_LAYER + "intermediate.dense."),
        (_LAYER + "mlp.Wo.", INTERNAL_LAYER + "output.dense."),
        ("bert.final_norm.", "bert.encoder.final_norm."),
        ("head.dense.", "cls.predictions.transform.dense."),  # the MLM head's, or the classifiers' transform
        ("head.norm.", "cls.predictions.transform.LayerNorm."),
        ("head.dense.", "head_transform.dense."),
        ("head.norm.", "head_transform.LayerNorm."),
        ("decoder.bias", "cls.predictions.bias"),
        ("classifier.", "qa_outputs."),  # QA's; the sequence and token classifiers keep `classifier.`
    ),
    dropped=(r"^decoder\.weight$",),  # tied to the word embeddings
    unfuse=unfuse,
    fuse=fuse,
    read_spec=modernbert_spec,
    write_config=write_config,
    global_theta_keys=global_theta_keys,
    sizes={"base": (22, 768, 12, 1152), "large": (28, 1024, 16, 2624)},  # modernbert-base's and -large's
    intermediate_ratio=1.5,  # the smaller sizes' (base's ratio); GeGLU's Wi is twice as wide
    ladders=(ETTIN, MMBERT),
    # ModernBERT's pretraining (Warner et al., 2024): 30 % masking, documents packed and attended within themselves,
    # warmup-stable-decay with a 1 - sqrt decay, AdamW's beta2 0.98
    recipe=Recipe(mlm_probability=0.3, packing="documents", decay="wsd-sqrt", adam_beta2=0.98),
    preset=dict(type_vocab_size=0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0,
                layer_norm_eps=1e-5, max_position_embeddings=8192),
)

__all__ = ["ETTIN", "MMBERT", "MODERNBERT", "fuse", "global_theta_keys", "layer_types", "modernbert_spec", "rope_thetas", "unfuse", "write_config"]
