"""Inference on packed (unpadded) batches: every real token of a batch in one [T, H] matrix, no padding anywhere.

Shapes: T = real tokens in a batch (sum of its sequence lengths), H = hidden size, nh = heads, hd = head size,
n = sequences in a length group, L = their common length.

The dense layers (QKV, attention output, feed-forward: nearly all of BERT's FLOPs) run on [T, H] rows, so no FLOP is
spent on padding. Attention needs whole sequences: a batch's sequences are sorted by length, and each run of equal
length is one dense [n, nh, L, hd] SDPA call without a mask. The weights are read from a `BertModel` once (fused
QKV concatenated once, not per call); the model itself is not changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import BertModel, activation


@dataclass
class _Layer:
    """One encoder block's inference weights."""

    qkv_weight: Tensor  # [3H, H]
    qkv_bias: Tensor  # [3H]
    out_weight: Tensor  # [H, H]
    out_bias: Tensor  # [H]
    ln1: tuple[Tensor, Tensor]  # LayerNorm weight, bias [H]
    ffn_in_weight: Tensor  # [I, H]
    ffn_in_bias: Tensor  # [I]
    ffn_out_weight: Tensor  # [H, I]
    ffn_out_bias: Tensor  # [H]
    ln2: tuple[Tensor, Tensor]


@dataclass
class PackedBatch:
    """Sequences laid end to end. `lengths` must be non-increasing so equal lengths form runs."""

    input_ids: Tensor  # [T] int64
    token_type_ids: Tensor | None  # [T] int64, None = all segment 0
    position_ids: Tensor  # [T] int64, 0..len-1 within each sequence
    lengths: list[int]  # tokens per sequence, sum = T

    @property
    def starts(self) -> list[int]:
        """Offset of each sequence's first token in the packed rows."""
        out, at = [], 0
        for n in self.lengths:
            out.append(at)
            at += n
        return out


def pack(ids: list[list[int]], type_ids: list[list[int]] | None = None) -> PackedBatch:
    """Pack token-id lists (already sorted by non-increasing length) into one PackedBatch."""
    lengths = [len(x) for x in ids]
    flat = [t for seq in ids for t in seq]
    positions = [p for n in lengths for p in range(n)]
    types = torch.tensor([t for seq in type_ids for t in seq], dtype=torch.long) if type_ids is not None else None
    return PackedBatch(torch.tensor(flat, dtype=torch.long), types, torch.tensor(positions, dtype=torch.long), lengths)


def length_groups(lengths: list[int]) -> list[tuple[int, int, int]]:
    """Runs of equal length as (first row, number of sequences, length)."""
    groups: list[tuple[int, int, int]] = []
    row = 0
    for n in lengths:
        if groups and groups[-1][2] == n:
            start, count, _ = groups[-1]
            groups[-1] = (start, count + 1, n)
        else:
            groups.append((row, 1, n))
        row += n
    return groups


class PackedEncoder:
    """A `BertModel`'s encoder for inference on `PackedBatch`es; returns the last hidden states [T, H]."""

    def __init__(self, bert: BertModel) -> None:
        cfg = bert.config
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.layer_norm_eps
        self.act = cfg.hidden_act
        emb = bert.embeddings
        self.word = emb.word_embeddings.weight.detach()
        self.position = emb.position_embeddings.weight.detach()
        self.token_type = emb.token_type_embeddings.weight.detach()
        self.emb_ln = (emb.LayerNorm.weight.detach(), emb.LayerNorm.bias.detach())
        self.layers: list[_Layer] = []
        for layer in bert.encoder.layer:
            sa = layer.attention.self
            self.layers.append(
                _Layer(
                    qkv_weight=torch.cat([sa.query.weight, sa.key.weight, sa.value.weight]).detach().contiguous(),
                    qkv_bias=torch.cat([sa.query.bias, sa.key.bias, sa.value.bias]).detach().contiguous(),
                    out_weight=layer.attention.output.dense.weight.detach(),
                    out_bias=layer.attention.output.dense.bias.detach(),
                    ln1=(layer.attention.output.LayerNorm.weight.detach(), layer.attention.output.LayerNorm.bias.detach()),
                    ffn_in_weight=layer.intermediate.dense.weight.detach(),
                    ffn_in_bias=layer.intermediate.dense.bias.detach(),
                    ffn_out_weight=layer.output.dense.weight.detach(),
                    ffn_out_bias=layer.output.dense.bias.detach(),
                    ln2=(layer.output.LayerNorm.weight.detach(), layer.output.LayerNorm.bias.detach()),
                )
            )

    def embed(self, batch: PackedBatch) -> Tensor:
        x = F.embedding(batch.input_ids, self.word) + F.embedding(batch.position_ids, self.position)  # [T, H]
        if batch.token_type_ids is None:
            x = x + self.token_type[0]
        else:
            x = x + F.embedding(batch.token_type_ids, self.token_type)
        return F.layer_norm(x, x.shape[-1:], *self.emb_ln, self.eps)

    def attention(self, qkv: Tensor, groups: list[tuple[int, int, int]]) -> Tensor:
        """qkv [T, 3H] → context [T, H], attending only within each sequence."""
        nh, hd = self.num_heads, self.head_dim
        outs = []
        for start, n, L in groups:
            q, k, v = qkv[start : start + n * L].view(n, L, 3, nh, hd).permute(2, 0, 3, 1, 4)  # 3 x [n, nh, L, hd]
            ctx = F.scaled_dot_product_attention(q, k, v)  # [n, nh, L, hd]
            outs.append(ctx.transpose(1, 2).reshape(n * L, nh * hd))  # [n*L, H]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def layer(self, x: Tensor, w: _Layer, groups: list[tuple[int, int, int]]) -> Tensor:
        ctx = self.attention(F.linear(x, w.qkv_weight, w.qkv_bias), groups)  # [T, H]
        x = F.layer_norm(F.linear(ctx, w.out_weight, w.out_bias) + x, x.shape[-1:], *w.ln1, self.eps)
        h = activation(self.act, F.linear(x, w.ffn_in_weight, w.ffn_in_bias))  # [T, I]
        return F.layer_norm(F.linear(h, w.ffn_out_weight, w.ffn_out_bias) + x, x.shape[-1:], *w.ln2, self.eps)

    def __call__(self, batch: PackedBatch) -> Tensor:
        groups = length_groups(batch.lengths)
        x = self.embed(batch)
        for w in self.layers:
            x = self.layer(x, w, groups)
        return x  # [T, H]
