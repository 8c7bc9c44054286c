"""The small parts an encoder is assembled from: dense layers, norms, embedding tables, rotary positions and
relative-position score terms. Parameters are named `weight` / `bias` like the checkpoints.

Shapes: n = sequences in one attention call, nh = heads, L = their length, hd = head size, H = hidden size.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.linear import linear
from ..core.ops import activation_fn, dropout
from .spec import EncoderSpec, RelativeAttention, RelativeBias

#: What a dense layer's weight is for, which an init rule may treat differently: "in" (into a block's attention
#: or feed-forward), "out" (a block's output projections and the heads' transforms), "head" (the pooler and
#: sentence heads), "final" (the classifiers that give a task's logits).
INIT_ROLES = ("in", "out", "head", "final")


# ---------------------------------------------------------------------------------------------------- init rules
def normal_rule(param: Tensor, spec: EncoderSpec, role: str) -> None:
    """BERT's (as `transformers` does it): N(0, σ²) for every matrix and embedding (a truncated normal, BERT's
    TensorFlow init, gave fine-tuning heads 0.6 F1 points less on CoNLL-2003 over 3 seeds)."""
    nn.init.normal_(param, std=spec.init_std)


def scaled_truncated_rule(param: Tensor, spec: EncoderSpec, role: str) -> None:
    """ModernBERT's: a normal cut off at ±2σ; the blocks' output projections and head transforms ("out") at
    σ / √(2L), the classifiers ("final") at 1 / √H."""
    std = spec.init_std
    if role == "out":
        std = std / (2.0 * spec.num_layers) ** 0.5
    elif role == "final":
        std = spec.hidden_size ** -0.5
    nn.init.trunc_normal_(param, std=std, a=-2 * std, b=2 * std)


#: How a matrix is drawn, by the spec's `init` (`spec.InitName`): (parameter, spec, its part's role) → in place.
INIT_RULES: dict[str, Callable[[Tensor, EncoderSpec, str], None]] = {"normal": normal_rule,
                                                                     "scaled-truncated": scaled_truncated_rule}


def init_matrix(param: Tensor, spec: EncoderSpec, role: str) -> None:
    """Draw a dense or embedding matrix by the spec's rule; `role` is its part's (`INIT_ROLES`; embeddings "in")."""
    INIT_RULES[spec.init](param, spec, role)


# ---------------------------------------------------------------------------------------------------- parts
# Each part initialises its own parameters (`init_parameter`), so the model's init asks its parts, never their type.
class Dense(nn.Module):
    """y = act(x Wᵀ + b) (+ a residual), parameters named `weight` [out, in] and `bias` [out] like the checkpoints.

    `act` is a `hidden_act` name or None, resolved once here; the matrix multiply is `bertforge.core.linear.linear`
    (`F.linear`, or oneDNN's kernels on CPU, which fuse the activation or the residual add at inference).
    `role` (of `INIT_ROLES`) tells the init rule what the weight is for."""

    def __init__(self, n_in: int, n_out: int, bias: bool = True, act: str | None = None, role: str = "in") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None
        self.act = act
        self.role = role
        if act is not None:
            activation_fn(act)  # an unknown name fails at construction, not at the first batch

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        return linear(x, self.weight, self.bias, act=self.act, residual=residual)

    def init_parameter(self, name: str, param: Tensor, spec: EncoderSpec) -> None:
        """The weight by the spec's rule for this layer's role; the bias zero."""
        if name == "weight":
            init_matrix(param, spec, self.role)
        else:
            param.zero_()


class LayerNorm(nn.Module):
    def __init__(self, size: int, eps: float, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size)) if bias else None
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)

    def init_parameter(self, name: str, param: Tensor, spec: EncoderSpec) -> None:
        param.fill_(1.0 if name == "weight" else 0.0)


class RMSNorm(nn.Module):
    """x / √(mean(x²) + ε) · weight (Zhang & Sennrich, 2019; Llama's, EuroBERT's), computed in float32 as
    `transformers`' `LlamaRMSNorm` does, in x's dtype. No bias."""

    def __init__(self, size: int, eps: float, bias: bool = False) -> None:
        super().__init__()
        if bias:
            raise ValueError("RMSNorm has no bias")
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        fused = x.dtype == torch.float32 and self.weight.dtype == torch.float32 and not torch.onnx.is_in_onnx_export()
        if fused:  # one kernel, twice as fast as the three ops (which ONNX's opset 17 export spells out)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def init_parameter(self, name: str, param: Tensor, spec: EncoderSpec) -> None:
        param.fill_(1.0)


#: The norms by the spec's `norm_kind` (`spec.NormName`): (size, eps, bias) → module.
NORMS: dict[str, Callable[..., nn.Module]] = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}


class Embedding(nn.Module):
    """A table of `num` rows of `dim`; `padding_idx`: a row drawn as zeros (the word table's padding id)."""

    def __init__(self, num: int, dim: int, padding_idx: int | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, dim))
        self.padding_idx = padding_idx

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight)

    def init_parameter(self, name: str, param: Tensor, spec: EncoderSpec) -> None:
        init_matrix(param, spec, "in")
        if self.padding_idx is not None:
            param[self.padding_idx].zero_()


def norm(spec: EncoderSpec, size: int | None = None) -> nn.Module:
    """A norm as the spec makes them (its kind, its epsilon, with or without a bias)."""
    return NORMS[spec.norm_kind](size or spec.hidden_size, spec.norm_eps, bias=spec.norm_bias)


# ---------------------------------------------------------------------------------------------------- rotary
class Rotary:
    """Rotary positions (RoFormer; the NeoX layout: the two halves of each head rotate together), base θ.

    q and k [n, nh, L, hd] are rotated by their position 0 .. L-1 in the call, in float32. Their product then
    depends only on i - j, so a sequence gets the same scores wherever a layout puts it (alone, padded on
    either side, or in a packed run)."""

    def __init__(self, theta: float, head_dim: int) -> None:
        self.theta = theta
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim  # not on meta
        self.inv_freq = 1.0 / theta**exponents  # [hd/2]
        self._cache: dict[torch.device, tuple[Tensor, Tensor]] = {}  # device -> the tables of `_tables` for 0 .. n-1

    def _tables(self, L: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """What rotates positions 0 .. L-1: [L, hd] each (`Rotary`: cos and the signed sin of the halves)."""
        angles = torch.outer(torch.arange(L, device=device, dtype=torch.float32), self.inv_freq.to(device))
        cos, sin = angles.cos(), angles.sin()  # [L, hd/2]
        return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)

    def tables(self, L: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """`_tables` for L positions, cut from a table kept for the longest call so far (row p is the same whatever
        the table's length; about 5 % of a rotary encoder's embedding time was recomputing them); computed afresh
        while tracing or compiling, so that an exported graph holds no table of one input's length."""
        if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling():
            return self._tables(L, device)
        cached = self._cache.get(device)
        if cached is None or cached[0].shape[0] < L:
            with torch.inference_mode(False), torch.no_grad():  # plain tensors, usable by training after inference
                cached = self._cache[device] = self._tables(max(L, 128), device)
        return cached[0][:L], cached[1][:L]

    def __call__(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        cos, signed_sin = self.tables(q.shape[-2], q.device)
        return rotate(q, cos, signed_sin), rotate(k, cos, signed_sin)


class InterleavedRotary(Rotary):
    """Rotary positions with RoFormer's (GPT-J's) pairs: neighbouring features (x0, x1), (x2, x3), ... rotate
    together, by the same angles as `Rotary`'s halves."""

    def _tables(self, L: int, device: torch.device) -> tuple[Tensor, Tensor]:
        angles = torch.outer(torch.arange(L, device=device, dtype=torch.float32), self.inv_freq.to(device))
        return angles.cos().repeat_interleave(2, dim=-1), angles.sin().repeat_interleave(2, dim=-1)  # [L, hd] each

    def __call__(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.tables(q.shape[-2], q.device)  # each angle for both members of its pair
        return rotate_pairs(q, cos, sin), rotate_pairs(k, cos, sin)


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x · cos + (-x1, x0, -x3, x2, ...) · sin, in float32, in x's dtype."""
    x32 = x.float()
    swapped = torch.stack((-x32[..., 1::2], x32[..., ::2]), dim=-1).flatten(-2)  # [..., hd]
    return (x32 * cos + swapped * sin).to(x.dtype)


#: The rotary layouts by the spec's `rotary` (`spec.RotaryName`): (θ, head size) → (q, k) ↦ rotated (q, k).
ROTARIES: dict[str, type[Rotary]] = {"neox": Rotary, "interleaved": InterleavedRotary}


def rotate(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """x · cos + rotate_half(x) · sin, computed in float32, in x's dtype. rotate_half(x) = (-x2, x1) for the
    halves (x1, x2) is x with its halves swapped (a roll by hd/2) times the sign that `signed_sin` (-sin, sin)
    carries: three passes over x instead of five (ModernBERT's embedding: rotary 12 % of the time before)."""
    x32 = x.float()
    return torch.addcmul(x32 * cos, x32.roll(x.shape[-1] // 2, dims=-1), signed_sin).to(x.dtype)


# ---------------------------------------------------------------------------------------------------- relative
def relative_positions(L: int, relative: RelativeAttention, device: torch.device | None = None) -> Tensor:
    """[L, L] row index into the relative table for query i and key j: bucket(i - j) + span, clipped to the table.

    bucket(r) = r while |r| < mid = buckets / 2, else sign(r) · (⌈ln(|r| / mid) / ln((P - 1) / mid) · (mid - 1)⌉
    + mid) with P = max_distance (DeBERTa-v2's log buckets; buckets 0: r itself).

    The bucket is a function of r = i - j alone: it is computed once for each of the 2L - 1 distances and the [L, L]
    index read from that row (at 512 tokens about 1 ms instead of 45 ms computing it on all L² pairs; 2 threads)."""
    r = torch.arange(-(L - 1), L, device=device)  # every distance i - j, [2L - 1]
    if relative.buckets > 0 and relative.max_distance > 0:
        mid = relative.buckets // 2
        magnitude = torch.where((r < mid) & (r > -mid), torch.full_like(r, mid - 1), r.abs()).float()  # float32, as transformers computes it
        scale = torch.log(torch.tensor((relative.max_distance - 1) / mid, device=device))  # float32, as transformers: a float64 log moves boundary buckets by one
        log = torch.ceil(torch.log(magnitude / mid) / scale * (mid - 1)) + mid
        r = torch.where(magnitude <= mid, r.float(), log * torch.sign(r)).long()
    span = relative.span
    return by_distance((r + span).clamp(0, 2 * span - 1), L)  # the index of distance d at d + L - 1


def by_distance(row: Tensor, L: int) -> Tensor:
    """[L, L] with [i, j] = row[L - 1 + i - j], from `row` [2L - 1] holding a value for each distance i - j from
    -(L - 1) up. Flipped, row's windows h[i' + j] (a strided view) are the rows from the last one up; flipped back,
    a copy (0.4 ms at 512 tokens; indexing row with an [L, L] tensor takes 10)."""
    return row.flip(0).as_strided((L, L), (1, 1)).flip(0)


def bias_buckets(L: int, bias: RelativeBias, device: torch.device | None = None) -> Tensor:
    """[L, L] bucket of query i and key j for `RelativeBias`, as MPNet computes it (T5's bidirectional buckets):
    with r = i - j, h = buckets / 2 and e = h / 2, bucket = h · [r < 0] + (|r| if |r| < e, else min(h - 1,
    e + ⌊ln(|r| / e) / ln(max_distance / e) · (h - e)⌋)). Computed once per distance (`by_distance`)."""
    r = torch.arange(-(L - 1), L, device=device)  # every distance i - j, [2L - 1]
    half = bias.buckets // 2
    exact = half // 2
    n = r.abs()
    log = torch.log(n.clamp(min=1).float() / exact) / math.log(bias.max_distance / exact) * (half - exact)
    large = (exact + log.long()).clamp(max=half - 1)  # .long() truncates, as transformers' .to(torch.long)
    return by_distance((r < 0).long() * half + torch.where(n < exact, n, large), L)


class BiasTable(nn.Module):
    """The encoder's side of `RelativeBias`: the [table, nh] table shared by every block (`weight`, as MPNet's
    `relative_attention_bias` Embedding holds it), and, per forward pass, the bias [1, nh, L, L] of each length
    (computed once per length for all blocks)."""

    def __init__(self, bias: RelativeBias, heads: int) -> None:
        super().__init__()
        self.relative = bias
        self.weight = nn.Parameter(torch.empty(bias.table, heads))

    def init_parameter(self, name: str, param: Tensor, spec: EncoderSpec) -> None:
        init_matrix(param, spec, "in")

    def lengths(self) -> Callable[[int, torch.device], Tensor]:
        """A function L ↦ the additive bias [1, nh, L, L] (shared: never to be written in place), memoised for this
        forward pass (the table may change between passes)."""
        cache: dict[int, Tensor] = {}

        def of_length(L: int, device: torch.device) -> Tensor:
            if L not in cache:
                index = bias_buckets(L, self.relative, device)  # [L, L]
                cache[L] = F.embedding(index, self.weight).permute(2, 0, 1).unsqueeze(0)  # [1, nh, L, L]
            return cache[L]

        return of_length


class RelativeTerms(nn.Module):
    """The per-block side of `RelativeAttention`: projects the (normalised) relative table with the block's
    query/key projections (`share_key`) or its own `pos_key_proj` / `pos_query_proj`, and returns the function
    that adds the score terms to q kᵀ. One gather per term for all heads."""

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        assert spec.relative is not None
        self.relative = spec.relative
        self.heads = spec.num_heads
        self.dropout = spec.hidden_dropout
        h = spec.hidden_size
        separate = not spec.relative.share_key
        self.pos_key_proj = Dense(h, h) if separate and "c2p" in spec.relative.terms else None
        self.pos_query_proj = Dense(h, h) if separate and "p2c" in spec.relative.terms else None

    def scorer(self, table: Tensor, query: Dense, key: Dense, scale: float) -> Callable[[Tensor, Tensor], Tensor]:
        """`table` [2·span, H]: the encoder's relative embeddings → (q · scale, k [n, nh, L, hd]) ↦ the terms times
        `scale`, [n, nh, L, L]. Every product takes a scaled operand (the query, or the position queries scaled
        here), so half-precision products never hold unscaled scores."""
        table = dropout(table, self.dropout, self.training)
        key_proj = self.pos_key_proj or key
        query_proj = self.pos_query_proj or query
        terms = self.relative.terms

        def split(x: Tensor) -> Tensor:  # [2·span, H] → [nh, 2·span, hd]
            return x.view(x.shape[0], self.heads, -1).transpose(0, 1)

        pos_key = split(key_proj(table)) if "c2p" in terms else None
        pos_query = split(query_proj(table)) * scale if "p2c" in terms else None

        def score_terms(q: Tensor, k: Tensor) -> Tensor:
            n, nh, L, _ = q.shape
            index = relative_positions(L, self.relative, q.device)  # [L, L]
            out = None
            if pos_key is not None:  # c2p[i, j] = q_i · Kr[δ(i, j)], q already scaled
                out = torch.gather(q @ pos_key.transpose(-1, -2), -1, index.expand(n, nh, L, L))
            if pos_query is not None:  # p2c[i, j] = k_j · Qr[δ(i, j)]
                p2c = torch.gather(k @ pos_query.transpose(-1, -2), -1, index.T.expand(n, nh, L, L)).transpose(-1, -2)
                out = p2c if out is None else out.add_(p2c)  # gather's output: its backward does not read it
            return out  # type: ignore[return-value]

        return score_terms


__all__ = ["BiasTable", "Dense", "Embedding", "INIT_ROLES", "INIT_RULES", "InterleavedRotary", "LayerNorm", "NORMS",
           "RMSNorm", "ROTARIES", "RelativeTerms", "Rotary", "bias_buckets", "by_distance", "init_matrix", "norm",
           "normal_rule", "relative_positions", "rotate", "rotate_pairs", "scaled_truncated_rule"]
