"""The architecture of an encoder as data: which parts it is assembled from.

Every member of the family is the same skeleton — embeddings → blocks (attention, feed-forward) → optional final
norm → a head — and differs only in the choices below. A family module (`bertforge.families`) reads its
`config.json` into an `EncoderSpec`; `bertforge.model.encoder` assembles the parts the spec names. A spec no
family uses (pre-LN + rotary + a gated feed-forward + a window, say) builds and runs just the same.

Shapes: H = hidden size, E = embedding width, I = feed-forward inner width, L = layers (blocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from ..core.errors import BertforgeError

# Each kind of part is a Literal here and a registry beside the part's code, keyed by the same names (a test checks
# that the two agree): the encoder looks a kind up and never compares it.
PositionName = Literal["absolute", "after-padding", "none"]
ProjectionName = Literal["after-norm", "before-norm"]
PlacementName = Literal["post", "pre"]
NormName = Literal["layernorm", "rmsnorm"]  # `parts.NORMS`
FFNName = Literal["dense", "gated"]  # `encoder.FEED_FORWARDS`
RotaryName = Literal["neox", "interleaved"]  # `parts.ROTARIES`
InitName = Literal["normal", "scaled-truncated"]  # `parts.INIT_RULES`
POSITION_KINDS: tuple[str, ...] = get_args(PositionName)
PROJECTIONS: tuple[str, ...] = get_args(ProjectionName)
NORM_PLACEMENTS: tuple[str, ...] = get_args(PlacementName)
NORM_KINDS: tuple[str, ...] = get_args(NormName)
FFN_KINDS: tuple[str, ...] = get_args(FFNName)
ROTARY_KINDS: tuple[str, ...] = get_args(RotaryName)
INIT_NAMES: tuple[str, ...] = get_args(InitName)
BIASED_NORMS = frozenset({"layernorm"})  # the norm kinds that may have a bias
SCORE_TERMS = ("c2p", "p2c")


@dataclass(frozen=True)
class PositionKind:
    """What a `positions` name means at the input."""

    table: bool  # a learned position table added to the word embeddings
    after_padding: bool  # ids counted from pad_token_id + 1, padding keeping pad_token_id (RoBERTa, MPNet)


POSITIONS: dict[str, PositionKind] = {"absolute": PositionKind(True, False), "after-padding": PositionKind(True, True),
                                      "none": PositionKind(False, False)}  # "none": rotary or relative positions


@dataclass(frozen=True)
class Placement:
    """Where a norm placement puts each sublayer's norm."""

    entry: bool  # pre-LN: x + f(norm(x))
    exit: bool  # post-LN: norm(x + f(x))


PLACEMENTS: dict[str, Placement] = {"post": Placement(entry=False, exit=True), "pre": Placement(entry=True, exit=False)}


@dataclass(frozen=True)
class Projection:
    """Where embeddings narrower than H (E < H) are projected to H."""

    in_embeddings: bool  # before the embeddings' norm, without a bias (DeBERTa); else the encoder's first step (ALBERT)
    bias: bool


PROJECTION_KINDS: dict[str, Projection] = {"after-norm": Projection(in_embeddings=False, bias=True),
                                           "before-norm": Projection(in_embeddings=True, bias=False)}


@dataclass(frozen=True)
class LayerAttention:
    """What one block's attention adds to softmax(q kᵀ / √d) v over every key of its sequence."""

    window: int | None = None  # sliding window: query i attends key j only where |i - j| <= window // 2
    rope_theta: float | None = None  # rotary positions (the spec's `rotary` layout) with this base; None: none


@dataclass(frozen=True)
class RelativeAttention:
    """DeBERTa's disentangled relative-position score terms, from one table shared by every block.

    Relative distance r = i - j, kept as it is while |r| < buckets / 2 and log-bucketed beyond, up to
    `max_distance`; `terms`: content→position (c2p: the query against the key's relative embedding) and
    position→content (p2c: the key against the query's). `share_key`: the block's own query and key projections
    (their biases included) project the relative embeddings; otherwise separate position projections do."""

    buckets: int = 256  # position_buckets; 0: distances clipped to ±max_distance, no log buckets
    max_distance: int = 512  # max_relative_positions
    terms: tuple[str, ...] = ("c2p", "p2c")
    share_key: bool = True
    norm: bool = True  # the table goes through the encoder's LayerNorm before use (norm_rel_ebd)

    @property
    def span(self) -> int:
        """Distances -span .. span - 1 index the table's 2 · span rows."""
        return self.buckets if self.buckets > 0 else self.max_distance


@dataclass(frozen=True)
class RelativeBias:
    """A learned bias on every block's attention scores, one number per head and bucket of the relative distance
    (MPNet's, after T5's): r = i - j, the two directions in halves of `buckets`; |r| below a quarter of `buckets`
    each its own bucket, longer distances log-bucketed up to `max_distance`. One [table, nh] table shared by every
    block, added to the scaled q kᵀ."""

    buckets: int = 32  # the distance buckets the formula uses (MPNet: always 32, whatever its table's size)
    max_distance: int = 128
    table: int = 32  # rows of the table (relative_attention_num_buckets)


SequenceHeadName = Literal["pooler", "first-token", "transform"]
SEQUENCE_HEADS: tuple[str, ...] = get_args(SequenceHeadName)
#: The multiple-choice head: "sequence", the sequence head with one label (BERT, ALBERT, DistilBERT, DeBERTa,
#: ModernBERT); "pooler", dropout → linear on the pooled first token where the sequence head reads token 0 itself
#: (RoBERTa, MPNet); "summary", token 0 → dense → act → dropout → linear (ELECTRA's SequenceSummary).
ChoiceHeadName = Literal["sequence", "pooler", "summary"]
CHOICE_HEADS: tuple[str, ...] = get_args(ChoiceHeadName)
POOLINGS = ("cls", "mean", "late")  # "late": the classifier on every token, its logits averaged (EuroBERT)


@dataclass(frozen=True)
class SequenceHead:
    """What a sequence-head name means for the classifier on a whole sequence."""

    pooler: bool  # reads the base model's pooler (BERT, ALBERT): the base model keeps one
    first_token: bool  # the classifier is the first-token MLP (`heads.FirstTokenHead`: RoBERTa, DistilBERT, DeBERTa)
    transform: bool  # the sequences pooled by `HeadSpec.pooling`, then a transform before the classifier (ModernBERT)


SEQUENCE_KINDS: dict[str, SequenceHead] = {
    "pooler": SequenceHead(pooler=True, first_token=False, transform=False),
    "first-token": SequenceHead(pooler=False, first_token=True, transform=False),
    "transform": SequenceHead(pooler=False, first_token=False, transform=True)}


@dataclass(frozen=True)
class HeadSpec:
    """The shape of the task heads on the encoder.

    MLM: transform (dense → `mlm_act` → norm) → decoder tied to the word embeddings (+ a bias). Sequence head:
    "pooler": dropout → linear on the pooled first token (BERT, ALBERT); "first-token": (dropout →) dense →
    `sequence_act` → dropout → out_proj on token 0 (RoBERTa, DistilBERT); "transform": the sequences pooled by
    `pooling` ("cls": token 0, "mean": the mean of the real tokens) → a transform like the MLM head's → dropout →
    classifier (ModernBERT), which token classification and QA then also run before theirs (`token_transform`);
    with `transform_norm` False that transform is dense → act alone, and pooling "late" runs it and the classifier
    on every token and averages the logits over the real ones (EuroBERT). `mlm_transform` False: the decoder reads
    the final hidden states directly; `tied_decoder` False: the decoder has a weight of its own (EuroBERT's
    `lm_head`)."""

    mlm_act: str = "gelu"
    transform_bias: bool = True  # the transforms' dense layers
    decoder_bias: bool = True
    mlm_transform: bool = True
    tied_decoder: bool = True
    transform_norm: bool = True
    sequence: SequenceHeadName = "pooler"
    sequence_act: str = "tanh"
    dropout_before_dense: bool = True  # "first-token": RoBERTa drops out token 0 before the dense layer
    first_dropout: float | None = None  # that dropout's rate; None: the classifier's (DeBERTa: its pooler_dropout)
    pooling: str = "cls"
    token_transform: bool = False
    rtd_context: bool = True  # the replaced-token head: LayerNorm(h_i + h_0) first (DeBERTa's); False: ELECTRA's
    choice: ChoiceHeadName = "sequence"  # the multiple-choice head (`CHOICE_HEADS`)

    @property
    def sequence_kind(self) -> SequenceHead:
        return SEQUENCE_KINDS[self.sequence]

    def __post_init__(self) -> None:
        if self.sequence not in SEQUENCE_HEADS:
            raise BertforgeError(f"encoder spec: sequence head {self.sequence!r} is not one of {', '.join(SEQUENCE_HEADS)}")
        if self.choice not in CHOICE_HEADS:
            raise BertforgeError(f"encoder spec: multiple-choice head {self.choice!r} is not one of {', '.join(CHOICE_HEADS)}")
        if self.pooling not in POOLINGS:
            raise BertforgeError(f"encoder spec: pooling {self.pooling!r} is not one of {', '.join(POOLINGS)}")


@dataclass(frozen=True)
class EncoderSpec:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    activation: str  # of the feed-forward layer (the gate's, for a gated one)
    max_positions: int  # the position table's rows (the longest sequence for rotary and relative positions)
    embedding_size: int | None = None  # E < H: embeddings projected to H (ALBERT, DeBERTa)
    projection: ProjectionName = "after-norm"  # E → H: after the embeddings' norm, with a bias (ALBERT); "before-norm": DeBERTa's
    type_vocab_size: int = 2  # 0: no token-type embeddings
    pad_token_id: int | None = 0
    positions: PositionName = "absolute"  # learned table counted from 0, from pad_token_id + 1 (RoBERTa), or none
    embedding_norm: bool = True  # a LayerNorm on the summed embeddings
    zero_padding_embeddings: bool = False  # embeddings multiplied by the attention mask (DeBERTa)
    norm: PlacementName = "post"  # post-LN: x = LN(x + f(x)); pre-LN: x = x + f(LN(x))
    norm_kind: NormName = "layernorm"  # every norm's kind: LayerNorm (with or without a bias) or RMSNorm
    first_attention_norm: bool = True  # pre-LN: whether block 0's attention has a norm (ModernBERT: none)
    final_norm: bool = False  # a LayerNorm after the last block (pre-LN encoders)
    norm_bias: bool = True
    norm_eps: float = 1e-12
    ffn: FFNName = "dense"  # dense: act(x W1) W2; gated: (act(a) · g) W2 with (a, g) = x W1 split in halves
    attention_bias: bool = True  # biases of the query/key/value and attention output projections
    num_kv_heads: int | None = None  # grouped-query attention: fewer key/value heads, each shared; None: num_heads
    mlp_bias: bool = True  # biases of the feed-forward layers
    mlp_out_bias: bool | None = None  # the feed-forward output's bias apart from its input's (GTE); None: mlp_bias
    layers: tuple[LayerAttention, ...] = ()  # one per block; () = every block global, no rotary
    rotary: RotaryName = "neox"  # rotary pairs: the two halves of a head (GPT-NeoX, Llama) or neighbours (RoFormer, GPT-J)
    relative: RelativeAttention | None = None
    relative_bias: RelativeBias | None = None
    layer_groups: int | None = None  # the L blocks share this many layers' weights (ALBERT); None: no sharing
    hidden_dropout: float = 0.1  # on the embeddings and, unless set apart below, on both sublayers' outputs
    attention_dropout: float = 0.1  # on the attention probabilities
    attention_output_dropout: float | None = None  # on the attention sublayer's output; None: hidden_dropout
    ffn_output_dropout: float | None = None  # on the feed-forward sublayer's output; None: hidden_dropout
    ffn_inner_dropout: float = 0.0  # inside a gated feed-forward, before its output projection (ModernBERT)
    pooler: bool = True
    init: InitName = "normal"  # normal: N(0, σ²) everywhere; scaled-truncated: ±2σ cutoff, outputs σ / √(2L)
    init_std: float = 0.02
    heads: HeadSpec = HeadSpec()

    def __post_init__(self) -> None:
        for name, value, choices in (("positions", self.positions, POSITION_KINDS), ("norm", self.norm, NORM_PLACEMENTS),
                                     ("projection", self.projection, PROJECTIONS), ("norm_kind", self.norm_kind, NORM_KINDS),
                                     ("ffn", self.ffn, FFN_KINDS), ("rotary", self.rotary, ROTARY_KINDS),
                                     ("init", self.init, INIT_NAMES)):
            if value not in choices:
                raise BertforgeError(f"encoder spec: {name} {value!r} is not one of {', '.join(choices)}")
        if self.norm_bias and self.norm_kind not in BIASED_NORMS:
            raise BertforgeError(f"encoder spec: a {self.norm_kind} norm has no bias; set norm_bias False")
        if self.layers and len(self.layers) != self.num_layers:
            raise BertforgeError(f"encoder spec: {len(self.layers)} layer attentions for {self.num_layers} layers")
        for i, layer in enumerate(self.layers):
            if layer.window is not None and layer.window < 1:
                raise BertforgeError(f"encoder spec: layer {i}'s window must be at least 1, got {layer.window}")
            if layer.rope_theta is not None and layer.rope_theta <= 0:
                raise BertforgeError(f"encoder spec: layer {i}'s rope_theta must be positive, got {layer.rope_theta}")
            if layer.rope_theta is not None and self.head_dim % 2:
                raise BertforgeError(f"encoder spec: rotary positions need an even head size, got {self.head_dim}")
        if self.relative is not None:
            unknown = sorted(set(self.relative.terms) - set(SCORE_TERMS))
            if unknown or not self.relative.terms:
                raise BertforgeError(f"encoder spec: relative terms {list(self.relative.terms)}; choose from "
                                     f"{', '.join(SCORE_TERMS)}")
            if self.relative.span < 1:
                raise BertforgeError("encoder spec: relative attention needs position_buckets or max_relative_positions")
        if self.num_kv_heads is not None and (self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads):
            raise BertforgeError(f"encoder spec: {self.num_heads} heads cannot share {self.num_kv_heads} key/value "
                                 "heads (it must divide the heads)")
        if self.kv_heads != self.num_heads and self.relative is not None:
            raise BertforgeError("encoder spec: relative score terms project the table with every head's key: "
                                 "not with fewer key/value heads")
        bias = self.relative_bias
        if bias is not None and (bias.buckets < 4 or bias.buckets % 4 or bias.max_distance <= bias.buckets // 4
                                 or bias.table < bias.buckets):
            raise BertforgeError(f"encoder spec: relative bias of {bias.buckets} buckets (a multiple of 4), distances up "
                                 f"to {bias.max_distance} (beyond a quarter of the buckets) and a table of "
                                 f"{bias.table} rows (at least the buckets) does not hold")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_heads(self) -> int:
        """The key/value heads (the query heads' number unless grouped-query attention has fewer)."""
        return self.num_kv_heads or self.num_heads

    @property
    def position_kind(self) -> PositionKind:
        return POSITIONS[self.positions]

    @property
    def position_offset(self) -> int:
        """The first position id of a sequence (RoBERTa's and MPNet's start after the padding id; else 0)."""
        return (self.pad_token_id or 0) + 1 if self.position_kind.after_padding else 0

    @property
    def placement(self) -> Placement:
        return PLACEMENTS[self.norm]

    @property
    def projection_kind(self) -> Projection:
        return PROJECTION_KINDS[self.projection]

    @property
    def ffn_out_bias(self) -> bool:
        return self.mlp_bias if self.mlp_out_bias is None else self.mlp_out_bias

    @property
    def embedding_dim(self) -> int:
        return self.embedding_size or self.hidden_size

    def layer(self, i: int) -> LayerAttention:
        """Block i's attention kind."""
        return self.layers[i] if self.layers else LayerAttention()

    @property
    def schedule(self) -> list[int]:
        """The layer (weights) each block runs: block i runs layer i · G // L with G layer groups (ALBERT)."""
        groups = self.layer_groups or self.num_layers
        return [i * groups // self.num_layers for i in range(self.num_layers)]


__all__ = ["EncoderSpec", "FFN_KINDS", "HeadSpec", "INIT_NAMES", "LayerAttention", "NORM_KINDS", "PLACEMENTS",
           "POSITIONS", "PROJECTION_KINDS", "Placement", "PositionKind", "Projection", "ROTARY_KINDS", "POOLINGS", "SEQUENCE_HEADS", "NORM_PLACEMENTS", "POSITION_KINDS",
           "RelativeAttention", "RelativeBias", "SCORE_TERMS", "SEQUENCE_KINDS", "SequenceHead"]
