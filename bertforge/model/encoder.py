"""The encoder skeleton, assembled from the parts an `EncoderSpec` names: embeddings → blocks → optional final
norm (and BERT's pooler). Module and parameter names are `transformers`' BERT names (`encoder.layer.0.attention.
self.query.weight`, ...): the internal names every family's checkpoint adapter translates to and from.

Shapes: B = batch, S = sequence length, T = tokens of an unpadded or packed batch, H = hidden size, E = embedding
width, I = feed-forward inner width. Rows are [B, S, ·] or [T, ·], whichever the layout (`attention`) has.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import Tensor, nn

from ..core.linear import linear
from ..core.ops import activation_fn, dropout
from .attention import PLAIN, Layout, Scores
from .parts import ROTARIES, BiasTable, Dense, Embedding, RelativeTerms, norm
from .spec import EncoderSpec


class BertEmbeddings(nn.Module):
    """Word (+ position) (+ token type) embeddings (→ LayerNorm) → dropout, of width E (H, or ALBERT's smaller E,
    projected to H by the encoder; DeBERTa's is projected here, before the norm). Positions are counted from 0,
    from pad_token_id + 1 with padding kept at pad_token_id (RoBERTa), or not embedded at all (rotary and relative
    positions live in attention)."""

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        e = spec.embedding_dim
        self.word_embeddings = Embedding(spec.vocab_size, e, padding_idx=spec.pad_token_id)
        positions = spec.position_kind
        self.position_embeddings = Embedding(spec.max_positions, e) if positions.table else None
        self.token_type_embeddings = Embedding(spec.type_vocab_size, e) if spec.type_vocab_size else None
        projection = spec.projection_kind
        project_here = e != spec.hidden_size and projection.in_embeddings
        self.embed_proj = Dense(e, spec.hidden_size, bias=projection.bias) if project_here else None  # DeBERTa's E → H
        self.LayerNorm = norm(spec, spec.hidden_size if project_here else e) if spec.embedding_norm else None
        self.dropout = spec.hidden_dropout
        self.pad_token_id = spec.pad_token_id or 0
        self.positions_after_padding = positions.after_padding
        self.zero_padding = spec.zero_padding_embeddings

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None, position_ids: Tensor | None,
                attention_mask: Tensor | None = None) -> Tensor:
        """input_ids [B, S] (positions counted as the spec says unless given), or packed [T] with `position_ids`
        [T] → [..., E]. Token types are ignored where there are none (DistilBERT); `attention_mask` zeroes the
        padding's embeddings where the spec says so (DeBERTa)."""
        x = self.word_embeddings(input_ids)  # [B, S, E] or [T, E]
        if self.position_embeddings is not None:
            x = x + self._positions(input_ids, position_ids)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                x = x + self.token_type_embeddings.weight[0]
            else:
                x = x + self.token_type_embeddings(token_type_ids)
        if self.embed_proj is not None:
            x = self.embed_proj(x)  # [..., H]
        if self.LayerNorm is not None:
            x = self.LayerNorm(x)
        if self.zero_padding and attention_mask is not None:
            x = x * attention_mask.unsqueeze(-1).to(x.dtype)
        return dropout(x, self.dropout, self.training)

    def _positions(self, input_ids: Tensor, position_ids: Tensor | None) -> Tensor:
        table = self.position_embeddings
        assert table is not None
        limit = table.weight.shape[0]
        if position_ids is None and self.positions_after_padding:
            position_ids = padded_position_ids(input_ids, self.pad_token_id)  # [B, S]
            if input_ids.shape[-1] + self.pad_token_id >= limit:
                raise ValueError(
                    f"sequence length {input_ids.shape[-1]} exceeds max_position_embeddings={limit} less the "
                    f"{self.pad_token_id + 1} positions before the first token"
                )
        if position_ids is None:
            seq_len = input_ids.shape[-1]
            if seq_len > limit:
                raise ValueError(f"sequence length {seq_len} exceeds max_position_embeddings={limit}")
            return table.weight[:seq_len]  # broadcast over the batch
        return table(position_ids)

    @torch.no_grad()
    def load_from(self, other: "BertEmbeddings", offset: int = 0) -> None:
        """Copy `other`'s tables into these: the words, the norm, and position rows offset .. offset + P (other's
        first rows skipped: RoBERTa's padding offset) with `other`'s token type 0 folded in where this has no
        token types (a DistilBERT student of a BERT teacher computes what its teacher does on one segment)."""
        self.word_embeddings.weight.copy_(other.word_embeddings.weight)
        if self.position_embeddings is not None and other.position_embeddings is not None:
            rows = other.position_embeddings.weight[offset : offset + self.position_embeddings.weight.shape[0]]
            if self.token_type_embeddings is None and other.token_type_embeddings is not None:
                rows = rows + other.token_type_embeddings.weight[0]
            self.position_embeddings.weight.copy_(rows)
        if self.token_type_embeddings is not None and other.token_type_embeddings is not None:
            self.token_type_embeddings.weight.copy_(other.token_type_embeddings.weight)
        if self.LayerNorm is not None and other.LayerNorm is not None:
            self.LayerNorm.load_state_dict(other.LayerNorm.state_dict())


def padded_position_ids(input_ids: Tensor, pad_token_id: int) -> Tensor:
    """RoBERTa's positions: pad_token_id + 1, + 2, ... over the real tokens; padding tokens get pad_token_id."""
    real = (input_ids != pad_token_id).long()
    return torch.cumsum(real, dim=-1) * real + pad_token_id


class BertSelfAttention(nn.Module):
    """Query, key and value projections (kept apart for checkpoint names, run as one fused matmul)."""

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        h, bias = spec.hidden_size, spec.attention_bias
        kv = spec.kv_heads * spec.head_dim  # H, or less with grouped-query attention
        self.query = Dense(h, h, bias)
        self.key = Dense(h, kv, bias)
        self.value = Dense(h, kv, bias)

    def forward(self, x: Tensor) -> Tensor:
        """[..., H] → [..., H + 2·kv·hd]: query, key, value side by side, from one matrix multiply. The weights are stacked
        on every call (a copy of 3H × H, small beside the multiply; a cache would go stale: fused AdamW updates
        parameters in place without bumping their version counters)."""
        parts = (self.query, self.key, self.value)
        if any(type(p) is not Dense for p in parts):  # a projection computing more than x Wᵀ + b (low-rank adapters)
            return torch.cat([p(x) for p in parts], dim=-1)
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])  # [H + 2·kv·hd, H]
        biases = [self.query.bias, self.key.bias, self.value.bias]
        return linear(x, weight, torch.cat(biases) if biases[0] is not None else None)  # type: ignore[arg-type]


class BertResidualOutput(nn.Module):
    """The end of both sublayers (`attention.output` and `output`): post-LN LN(residual + dropout(dense(x))), or
    pre-LN residual + dropout(dense(x)) (the norm then sits at the sublayer's entry)."""

    def __init__(self, spec: EncoderSpec, n_in: int, bias: bool, p: float | None) -> None:
        """`p`: the dropout on the sublayer's output (None: the spec's hidden dropout)."""
        super().__init__()
        self.dense = Dense(n_in, spec.hidden_size, bias, role="out")
        self.LayerNorm = norm(spec) if spec.placement.exit else None
        self.dropout = spec.hidden_dropout if p is None else p

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        if self.training or torch.is_grad_enabled():
            out = dropout(self.dense(x), self.dropout, self.training) + residual
        else:
            out = self.dense(x, residual=residual)  # inference: the add fused into the matmul (oneDNN)
        return self.LayerNorm(out) if self.LayerNorm is not None else out


class BertAttention(nn.Module):
    """(norm →) query/key/value → attention in the layout → output projection + residual (→ norm)."""

    def __init__(self, spec: EncoderSpec, index: int, backend: str = "sdpa") -> None:
        super().__init__()
        pre = spec.placement.entry and (index > 0 or spec.first_attention_norm)
        self.norm = norm(spec) if pre else None
        self.self = BertSelfAttention(spec)
        self.relative = RelativeTerms(spec) if spec.relative is not None else None
        self.output = BertResidualOutput(spec, spec.hidden_size, spec.attention_bias, spec.attention_output_dropout)
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.kv_heads
        self.attn_dropout = spec.attention_dropout
        self.backend = backend
        terms = len(spec.relative.terms) if spec.relative is not None else 0
        self.scale = 1 / math.sqrt(spec.head_dim * (1 + terms)) if terms else None  # DeBERTa: √(d · (1 + terms))

    def forward(self, x: Tensor, layout: Layout, output_attentions: bool = False, scores: Scores = PLAIN,
                relative_table: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """x: rows in `layout` → the same rows, and the attention probabilities [B, nh, S, S] when asked for.
        `scores`: the block's rotary positions and window; `relative_table`: the encoder's relative embeddings."""
        explicit = self.backend == "eager" or output_attentions
        h = self.norm(x) if self.norm is not None else x
        if self.relative is not None and relative_table is not None:
            terms = self.relative.scorer(relative_table, self.self.query, self.self.key, self.scale)  # type: ignore[arg-type]
            scores = replace(scores, terms=terms, scale=self.scale)  # the block's rotary, window and bias kept
        ctx, probs = layout.attend(self.self(h), self.num_heads, self.attn_dropout, self.training, explicit, scores,
                                   self.num_kv_heads)
        return self.output(ctx, x), probs


class BertIntermediate(nn.Module):
    """(norm →) the feed-forward layer's first half, dense: act(x W1) [..., I] (the activation fused into the
    matmul)."""

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        self.norm = norm(spec) if spec.placement.entry else None
        self.dense = Dense(spec.hidden_size, self.width(spec), spec.mlp_bias, act=self.fused_act(spec))
        self.dropout = spec.ffn_inner_dropout

    def width(self, spec: EncoderSpec) -> int:
        return spec.intermediate_size

    def fused_act(self, spec: EncoderSpec) -> str | None:
        return spec.activation

    def forward(self, x: Tensor) -> Tensor:
        return self.dense(self.norm(x) if self.norm is not None else x)  # [..., I]


class GatedIntermediate(BertIntermediate):
    """(norm →) a gated feed-forward's first half: act(a) · g [..., I] with (a, g) the two halves of x W1
    [..., 2I] (GeGLU, SwiGLU: the activation is the spec's), then the inner dropout."""

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__(spec)
        self.gate_act = activation_fn(spec.activation)

    def width(self, spec: EncoderSpec) -> int:
        return 2 * spec.intermediate_size

    def fused_act(self, spec: EncoderSpec) -> str | None:
        return None

    def forward(self, x: Tensor) -> Tensor:
        a, g = super().forward(x).chunk(2, dim=-1)  # [..., I] each
        return dropout(self.gate_act(a) * g, self.dropout, self.training)  # [..., I]


#: The feed-forward kinds by the spec's `ffn` (`spec.FFNName`): the block's first half; the second is `output`.
FEED_FORWARDS: dict[str, type[BertIntermediate]] = {"dense": BertIntermediate, "gated": GatedIntermediate}


class BertLayer(nn.Module):
    """A block: attention sublayer, then feed-forward sublayer, each with its residual and norm (post or pre)."""

    def __init__(self, spec: EncoderSpec, index: int = 0, backend: str = "sdpa") -> None:
        super().__init__()
        self.attention = BertAttention(spec, index, backend)
        self.intermediate = FEED_FORWARDS[spec.ffn](spec)
        self.output = BertResidualOutput(spec, spec.intermediate_size, spec.ffn_out_bias, spec.ffn_output_dropout)

    def forward(self, x: Tensor, layout: Layout, output_attentions: bool = False, scores: Scores = PLAIN,
                relative_table: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        x, probs = self.attention(x, layout, output_attentions, scores, relative_table)  # [B, S, H] or [T, H]
        return self.output(self.intermediate(x), x), probs

    def dense_parts(self) -> dict[str, nn.Module]:
        """The block's matrix multiplies by role (what int8 quantisation swaps): "attention_in" (the fused
        query/key/value projection; not with relative score terms, which project the relative table with it),
        "attention_out", "ffn_in" and "ffn_out"."""
        parts = {"attention_in": self.attention.self, "attention_out": self.attention.output.dense,
                 "ffn_in": self.intermediate.dense, "ffn_out": self.output.dense}
        if self.attention.relative is not None:  # its projections also project the relative table
            del parts["attention_in"]
        return parts

    def projections(self) -> dict[str, Dense]:
        """The block's dense layers one by one, by role (what low-rank adapters attach to): "query", "key",
        "value", "attention_out", "ffn_in" and "ffn_out"."""
        q = self.attention.self
        return {"query": q.query, "key": q.key, "value": q.value, "attention_out": self.attention.output.dense,
                "ffn_in": self.intermediate.dense, "ffn_out": self.output.dense}

    def replace_part(self, role: str, module: nn.Module) -> None:
        """Put `module` where `dense_parts()[role]` is."""
        owner, name = {"attention_in": (self.attention, "self"), "attention_out": (self.attention.output, "dense"),
                       "ffn_in": (self.intermediate, "dense"), "ffn_out": (self.output, "dense")}[role]
        setattr(owner, name, module)


class BertEncoder(nn.Module):
    """The blocks, in order, each with its spec's attention (rotary θ, window); ALBERT's parts: embeddings
    narrower than H are projected to H first, and with `layer_groups` the L blocks share the weights of that
    many layers. DeBERTa's relative table (with its LayerNorm) is shared by every block. Pre-LN encoders end
    in a final norm."""

    def __init__(self, spec: EncoderSpec, backend: str = "sdpa") -> None:
        super().__init__()
        e, h = spec.embedding_dim, spec.hidden_size
        projection = spec.projection_kind
        self.embedding_projection = Dense(e, h, projection.bias) if e != h and not projection.in_embeddings else None
        self.schedule = spec.schedule  # the layer each block runs
        self.layer = nn.ModuleList(BertLayer(spec, i, backend) for i in range(max(self.schedule) + 1))
        rotary = ROTARIES[spec.rotary]
        rotaries = {t: rotary(t, spec.head_dim) for t in {spec.layer(i).rope_theta for i in range(spec.num_layers)}
                    if t is not None}
        self.scores = [Scores(rotaries.get(spec.layer(i).rope_theta), spec.layer(i).window)  # type: ignore[arg-type]
                       for i in range(spec.num_layers)]
        rel = spec.relative
        self.rel_embeddings = Embedding(2 * rel.span, h) if rel is not None else None
        self.LayerNorm = norm(spec) if rel is not None and rel.norm else None  # of the relative table
        bias = spec.relative_bias
        self.relative_attention_bias = BiasTable(bias, spec.num_heads) if bias is not None else None  # MPNet's
        self.final_norm = norm(spec) if spec.final_norm else None
        self.gradient_checkpointing = False

    def blocks(self) -> Iterator[BertLayer]:
        """Each layer once (ALBERT's shared layers are one layer)."""
        return iter(self.layer)  # type: ignore[arg-type]

    def shared_parts(self) -> list[nn.Module]:
        """The parts every block reads, beside the embeddings (at depth 0 for layer-wise learning rates): ALBERT's
        E → H projection, DeBERTa's relative table and its norm, MPNet's bias table."""
        parts = (self.embedding_projection, self.rel_embeddings, self.LayerNorm, self.relative_attention_bias)
        return [part for part in parts if part is not None]

    def relative_table(self) -> Tensor | None:
        if self.rel_embeddings is None:
            return None
        table = self.rel_embeddings.weight  # [2·span, H]
        return self.LayerNorm(table) if self.LayerNorm is not None else table

    def forward(
        self, x: Tensor, layout: Layout, output_attentions: bool = False, output_hidden_states: bool = False,
        depth: int | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...] | None, tuple[Tensor, ...] | None]:
        """`depth`: run only the first `depth` blocks (0: the projected embeddings), None: all of them (and the
        final norm, which `hidden_states` leave out, as in `transformers`)."""
        if self.embedding_projection is not None:
            x = self.embedding_projection(x)  # [..., E] -> [..., H]
        hidden: tuple[Tensor, ...] | None = (x,) if output_hidden_states else None
        attentions: tuple[Tensor, ...] | None = () if output_attentions else None
        table = self.relative_table()
        bias = self.relative_attention_bias.lengths() if self.relative_attention_bias is not None else None
        for block, index in enumerate(self.schedule[:depth]):
            layer, scores = self.layer[index], self.scores[block]
            if bias is not None:
                scores = replace(scores, bias=bias)
            if self.gradient_checkpointing and self.training and not output_attentions:
                x, probs = torch.utils.checkpoint.checkpoint(layer, x, layout, False, scores, table,
                                                             use_reentrant=False)
            else:
                x, probs = layer(x, layout, output_attentions, scores, table)
            if hidden is not None:
                hidden = hidden + (x,)
            if attentions is not None:
                attentions = attentions + (probs,)
        if self.final_norm is not None and depth is None:
            x = self.final_norm(x)
        return x, hidden, attentions


class BertPooler(nn.Module):
    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        self.dense = Dense(spec.hidden_size, spec.hidden_size, act="tanh", role="head")

    def forward(self, first: Tensor) -> Tensor:
        """tanh(dense(each sequence's first ([CLS]) hidden state [B, H])) → [B, H]."""
        return self.dense(first)


__all__ = ["BertAttention", "BertEmbeddings", "BertEncoder", "BertIntermediate", "BertLayer", "BertPooler",
           "FEED_FORWARDS", "GatedIntermediate",
           "BertResidualOutput", "BertSelfAttention", "padded_position_ids"]
