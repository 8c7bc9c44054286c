"""Inference on packed (unpadded) batches: every real token of a batch in one [T, H] matrix, no padding anywhere.

Shapes: T = real tokens in a batch (sum of its sequence lengths), H = hidden size, I = feed-forward size,
nh = heads, hd = head size, n = sequences in a length group, L = their common length.

The dense layers (QKV, attention output, feed-forward: nearly all of BERT's FLOPs) run on [T, H] rows, so no FLOP is
spent on padding. Attention needs whole sequences: a batch's sequences are sorted by length, and each run of equal
length is one dense [n, nh, L, hd] SDPA call without a mask; with `max_padding` > 0, consecutive runs share one call,
padded to their longest sequence with the padded keys masked out (`attention_plan`).

The weights are read from a `BertModel` once (the fused QKV matrix is concatenated once, not per call); the model
is not changed. On CPU the projections go through oneDNN's fused linear kernels when PyTorch has them: bias, GELU
and the residual add are applied inside the matrix multiply, and oneDNN's AVX-512 kernels are about twice as fast
as the MKL path `F.linear` takes on AMD CPUs. Anything else (or `backend="aten"`) uses `F.linear`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..linear import onednn_available
from ..model import BertModel, activation


# hidden_act -> oneDNN post-op (name, algorithm) that computes it inside the matrix multiply.
_FUSED_ACTIVATIONS = {
    "gelu": ("gelu", "none"),  # exact (erf) GELU
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "gelu_fast": ("gelu", "tanh"),
    "relu": ("relu", ""),
}
BACKENDS = ("auto", "onednn", "aten")


class InferenceLinear:
    """y = x Wᵀ + b for 2-D x, optionally with the activation or a residual add fused in (oneDNN), else aten."""

    def __init__(self, weight: Tensor, bias: Tensor, onednn: bool) -> None:
        self.weight = weight.detach().contiguous()  # [out, in]
        self.bias = bias.detach().contiguous()  # [out]
        self.onednn = onednn

    def __call__(self, x: Tensor, act: str | None = None) -> Tensor:
        """act(x Wᵀ + b); `act` is a `hidden_act` name or None."""
        if self.onednn:
            if act is None:
                return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
            if act in _FUSED_ACTIVATIONS:
                name, algorithm = _FUSED_ACTIVATIONS[act]
                return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, name, [], algorithm)
        y = F.linear(x, self.weight, self.bias)
        return y if act is None else activation(act, y)

    def add(self, x: Tensor, residual: Tensor) -> Tensor:
        """x Wᵀ + b + residual."""
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.weight, self.bias, "add")
        return torch.addmm(self.bias, x, self.weight.t()).add_(residual)


@dataclass
class _Layer:
    """One encoder block's inference weights."""

    qkv: InferenceLinear  # [3H, H]: query, key, value rows stacked
    out: InferenceLinear  # [H, H]
    ln1: tuple[Tensor, Tensor]  # LayerNorm weight, bias [H]
    ffn_in: InferenceLinear  # [I, H]
    ffn_out: InferenceLinear  # [H, I]
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


#: Default `max_padding` of PackedEncoder: none, so a sequence's result does not depend on the rest of its batch
#: (padded, masked calls agree with separate calls only up to float rounding). The embed pipeline uses 0.5.
MAX_ATTENTION_PADDING = 0.0


@dataclass
class Bucket:
    """Sequences [start row, start + real rows) sharing one attention call, padded to `length` when mask is set."""

    start: int
    count: int  # sequences
    length: int  # the longest (all equal when mask is None)
    real: int  # real rows (tokens)
    mask: Tensor | None = None  # [count, 1, 1, length] bool, True = a real key
    gather: Tensor | None = None  # [count * length] packed row of each padded position (padding: the sequence's first)
    scatter: Tensor | None = None  # [real] padded position of each real row


def attention_plan(lengths: list[int], max_padding: float = MAX_ATTENTION_PADDING) -> list[Bucket]:
    """Attention calls for sequences of non-increasing `lengths` laid end to end.

    Each run of equal length is a dense block needing no mask. Few sequences per run means many small calls, each
    with a fixed cost (a parallel region), so consecutive runs are merged into one call padded to its longest
    sequence while padding stays within `max_padding` of the real positions; padded keys are masked out, so the
    real rows' results are those of separate calls (up to float rounding).
    """
    buckets: list[tuple[int, list[tuple[int, int, int]]]] = []  # (real rows, runs)
    for run in length_groups(lengths):
        if buckets:
            real, runs = buckets[-1]
            count = sum(n for _, n, _ in runs) + run[1]
            total = real + run[1] * run[2]
            if count * runs[0][2] <= (1 + max_padding) * total:
                runs.append(run)
                buckets[-1] = (total, runs)
                continue
        buckets.append((run[1] * run[2], [run]))
    plan = []
    for real, runs in buckets:
        start, _, longest = runs[0]
        count = sum(n for _, n, _ in runs)
        if len(runs) == 1:
            plan.append(Bucket(start, count, longest, real))
            continue
        seq_lengths = torch.tensor([L for _, n, L in runs for _ in range(n)])  # [count]
        positions = torch.arange(longest)  # [longest]
        valid = positions < seq_lengths[:, None]  # [count, longest]
        seq_starts = start + torch.cumsum(seq_lengths, 0) - seq_lengths  # [count] first packed row
        gather = torch.where(valid, seq_starts[:, None] + positions, seq_starts[:, None]).reshape(-1)
        scatter = valid.reshape(-1).nonzero().squeeze(1)  # [real]
        plan.append(Bucket(start, count, longest, real, valid[:, None, None, :], gather, scatter))
    return plan


class PackedEncoder:
    """A `BertModel`'s encoder for inference on `PackedBatch`es; returns the last hidden states [T, H].

    Args:
        bert: the model whose weights to use (read, not copied, except the stacked QKV matrices).
        backend: "onednn" (fused oneDNN kernels), "aten" (`F.linear`) or "auto" (oneDNN on CPU when available).
        max_padding: runs of different lengths share one (padded, masked) attention call while the padded positions
            stay within this fraction of the real ones (0: one call per run of equal length, no padding at all).
    """

    def __init__(self, bert: BertModel, backend: str = "auto", max_padding: float = MAX_ATTENTION_PADDING) -> None:
        self.max_padding = max_padding
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        on_cpu = bert.embeddings.word_embeddings.weight.device.type == "cpu"
        float32 = bert.embeddings.word_embeddings.weight.dtype == torch.float32
        use_onednn = backend != "aten" and on_cpu and float32 and onednn_available()
        if backend == "onednn" and not use_onednn:
            raise ValueError("the oneDNN backend needs float32 weights on CPU and a PyTorch built with oneDNN")
        self.backend = "onednn" if use_onednn else "aten"
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

        def linear(dense: torch.nn.Module) -> InferenceLinear:
            return InferenceLinear(dense.weight, dense.bias, use_onednn)

        self.layers: list[_Layer] = []
        for layer in bert.encoder.layer:
            sa = layer.attention.self
            qkv = InferenceLinear(
                torch.cat([sa.query.weight, sa.key.weight, sa.value.weight]),
                torch.cat([sa.query.bias, sa.key.bias, sa.value.bias]),
                use_onednn,
            )
            self.layers.append(
                _Layer(
                    qkv=qkv,
                    out=linear(layer.attention.output.dense),
                    ln1=(layer.attention.output.LayerNorm.weight.detach(), layer.attention.output.LayerNorm.bias.detach()),
                    ffn_in=linear(layer.intermediate.dense),
                    ffn_out=linear(layer.output.dense),
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

    def attention(self, qkv: Tensor, plan: list[Bucket]) -> Tensor:
        """qkv [T, 3H] → context [T, H], attending only within each sequence."""
        nh, hd = self.num_heads, self.head_dim
        outs = []
        for b in plan:
            if b.mask is None:  # one run of equal length: a dense block, no mask, no copy
                n, L = b.count, b.length
                q, k, v = qkv[b.start : b.start + n * L].view(n, L, 3, nh, hd).permute(2, 0, 3, 1, 4)
                ctx = F.scaled_dot_product_attention(q, k, v)  # [n, nh, L, hd]
                outs.append(ctx.transpose(1, 2).reshape(n * L, nh * hd))  # [n*L, H]
            else:  # several runs padded to the longest: one SDPA call, padded keys masked out
                n, L = b.count, b.length
                padded = qkv.index_select(0, b.gather)  # [n*L, 3H]; padding rows repeat a real row
                q, k, v = padded.view(n, L, 3, nh, hd).permute(2, 0, 3, 1, 4)  # 3 x [n, nh, L, hd]
                ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=b.mask)  # [n, nh, L, hd]
                outs.append(ctx.transpose(1, 2).reshape(n * L, nh * hd).index_select(0, b.scatter))  # [real, H]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def layer(self, x: Tensor, w: _Layer, groups: list[Bucket]) -> Tensor:
        """One post-LN block: x = LN(x + Attn(x)); x = LN(x + FFN(x)), on [T, H]."""
        ctx = self.attention(w.qkv(x), groups)  # [T, H]
        x = F.layer_norm(w.out.add(ctx, x), x.shape[-1:], *w.ln1, self.eps)
        h = w.ffn_in(x, self.act)  # [T, I]
        return F.layer_norm(w.ffn_out.add(h, x), x.shape[-1:], *w.ln2, self.eps)

    def __call__(self, batch: PackedBatch) -> Tensor:
        groups = attention_plan(batch.lengths, self.max_padding)
        x = self.embed(batch)
        for w in self.layers:
            x = self.layer(x, w, groups)
        return x  # [T, H]
