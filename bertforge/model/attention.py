"""Attention, and the three layouts a batch of sequences can have while it goes through the encoder.

This is the only module that computes attention (`attend`: SDPA, or its explicit maths for the reference
"eager" backend, for attention probabilities and for CPU dropout). Everything else in the encoder (dense layers,
LayerNorm, activations, dropout) works row by row and does not care how the rows are laid out; attention needs
whole sequences, so each layout says how its rows become [n, nh, L, hd] blocks and back:

* `Padded`: rows are [B, S, ·] with an additive [B, 1, 1, S] mask for the padding (the Hugging Face layout);
* `Unpadded`: rows are the T real tokens of a padded batch, [T, ·] (T = Σ lengths): dense layers skip padding;
  attention scatters q, k, v back to [B, S] for one masked call (training with sparse MLM, NSP, classification);
* `Packed`: sequences laid end to end, [T, ·], sorted by non-increasing length, with no [B, S] layout at all:
  each run of equal length is one dense attention call without a mask; neighbouring runs may share one padded,
  masked call (`attention_plan`). The pipelines' inference path, and the documents of rows that pack several
  (`document_layout`: ModernBERT's pretraining).

What a block adds to plain softmax(q kᵀ / √hd) attention (rotary positions, a sliding window, relative-position
score terms, another scale) is a `Scores` value that every layout hands to `attend_scored` with each call's
[n, nh, L, hd] blocks: positions and windows are counted within each sequence of the call, so every layout gives
a sequence the same attention.

Shapes: B = batch, S = padded length, T = real tokens, H = hidden, nh = heads, hd = head size (H / nh),
n = sequences in one attention call, L = their (longest) length.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.ops import dropout


#: Longest sequences that CPU inference attends with two batched matmuls and a softmax instead of SDPA, with one
#: thread and with more. PyTorch's CPU SDPA kernel has a fixed cost per sequence and head that dominates short
#: sequences. Measured (all-MiniLM's 12 heads of 32, a batch of ~3,400 tokens, AMD EPYC, 2026-11-27): time of the
#: matmuls / SDPA's at L = 8, 16, 24, 32, 48, 64, 96, 128: 0.43 0.47 0.59 0.79 0.76 0.91 1.04 2.09 with 2 threads,
#: 0.91 0.83 0.84 1.20 1.36 1.42 1.54 2.63 with 1 (SDPA gained nothing from the second thread on short ones).
MATMUL_ATTENTION_MAX_LENGTH = {"one thread": 24, "threads": 64}


def matmuls_beat_sdpa(q: Tensor, training: bool = False) -> bool:
    """Whether `attend` computes this call's attention as matmuls and a softmax (see MATMUL_ATTENTION_MAX_LENGTH):
    float32 CPU inference (eval mode, no autograd) on short sequences, and never while traced or compiled (a
    branch on the shape). Training mode keeps SDPA even without autograd, so that a pass without gradients
    computes what the same pass with them does (cached in-batch negatives re-run their mini-batches)."""
    if (training or static_graph() or q.device.type != "cpu" or q.dtype != torch.float32
            or (torch.is_grad_enabled() and q.requires_grad)):
        return False
    return q.shape[-2] <= matmul_attention_max_length()


def matmul_attention_max_length() -> int:
    """MATMUL_ATTENTION_MAX_LENGTH for this thread's number of torch threads."""
    return MATMUL_ATTENTION_MAX_LENGTH["one thread" if torch.get_num_threads() == 1 else "threads"]


def softmax_last(scores: Tensor) -> Tensor:
    """softmax over the last dimension. PyTorch's CPU kernel runs rows shorter than one vector register (16 floats
    with AVX-512, 8 with AVX2) element by element: there, outside autograd, three whole-tensor passes (max,
    exp, divide by the sum), in place, are 3.7-5.9x faster (measured on [n, 12, L, L] scores, 2026-11-27:
    0.26-0.27x the time at L = 8-15 with 2 threads, 0.17-0.27x with 1; 1.1-2.9x slower at L = 16-64, where the
    kernel is vectorised)."""
    if (scores.device.type != "cpu" or scores.shape[-1] >= _cpu_vector_floats()
            or (torch.is_grad_enabled() and scores.requires_grad)):
        return scores.softmax(dim=-1)
    scores = scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
    return scores.div_(scores.sum(dim=-1, keepdim=True))


@functools.cache
def _cpu_vector_floats() -> int:
    """float32 lanes of the vector registers PyTorch's CPU kernels use here (AVX-512: 16, AVX2: 8, else 4)."""
    capability = torch.backends.cpu.get_cpu_capability()
    return 16 if capability.startswith("AVX512") else 8 if capability.startswith("AVX2") else 4


def attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float, training: bool, explicit: bool = False,
    scale: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q kᵀ · scale + mask) v for q, k, v [n, nh, L, hd] → context [n, nh, L, hd] and the probabilities;
    scale 1 / √hd unless given.

    `mask` is additive (0 or the dtype's minimum, any shape that broadcasts to [n, nh, L, L]: [n, 1, 1, L] for
    padding; score terms add real numbers) or boolean (True = attend), or None.
    `explicit` asks for the maths written out (the probabilities are returned then; SDPA returns None). Dropout
    on CPU always takes the explicit path: SDPA would draw PyTorch's slower mask (see `ops.dropout`). So does
    CPU inference on short sequences, where it is faster (`matmuls_beat_sdpa`); it returns no probabilities then.
    """
    p = p if training else 0.0
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    if explicit or (p > 0 and q.device.type == "cpu") or matmuls_beat_sdpa(q, training):
        # half precision scales the query before the product, so its scores never hold the unscaled q kᵀ (fp16
        # overflows); float32 scales the product, as transformers' eager attention does (the same rounding)
        half = q.dtype in (torch.float16, torch.bfloat16)
        scores = (q * scale if half and scale != 1.0 else q) @ k.transpose(-1, -2)  # [n, nh, L, L]
        post = 1.0 if half else scale
        if training or (torch.is_grad_enabled() and scores.requires_grad):  # the same maths with or without autograd
            if post != 1.0:
                scores = scores * post
            if mask is not None:
                minimum = torch.finfo(scores.dtype).min
                scores = scores.masked_fill(~mask, minimum) if mask.dtype == torch.bool else scores + mask
            probs = scores.softmax(dim=-1)
        else:  # inference: the new scores are changed in place
            if post != 1.0:
                scores.mul_(post)
            if mask is not None:
                minimum = torch.finfo(scores.dtype).min
                scores = scores.masked_fill_(~mask, minimum) if mask.dtype == torch.bool else scores.add_(mask)
            probs = softmax_last(scores)
        return dropout(probs, p, training) @ v, (probs if explicit or p > 0 else None)  # [n, nh, L, hd]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scale), None


@dataclass(frozen=True)
class Scores:
    """What one block adds to softmax(q kᵀ / √hd) over all keys: each applies per call, to [n, nh, L, hd] blocks
    whose positions 0 .. L-1 are positions within each sequence (all of them translation-invariant, so a
    sequence's attention does not depend on where a layout puts it)."""

    rotary: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None  # (q, k) → rotated (q, k)
    window: int | None = None  # query i attends key j only where |i - j| <= window // 2
    terms: Callable[[Tensor, Tensor], Tensor] | None = None  # (q · scale, k) → [n, nh, L, L] added to the scaled q kᵀ
    scale: float | None = None  # None: 1 / √hd
    bias: Callable[[int, torch.device], Tensor] | None = None  # (L, device) → [1, nh, L, L] added too; shared, not written

    @property
    def plain(self) -> bool:
        return (self.rotary is None and self.window is None and self.terms is None and self.scale is None
                and self.bias is None)


PLAIN = Scores()


def real_keys(mask: Tensor) -> Tensor:
    """A padding mask (boolean, True = attend, or additive, 0 = attend) as booleans, in its own shape."""
    return mask if mask.dtype == torch.bool else mask == 0


def window_mask(L: int, window: int, device: torch.device) -> Tensor:
    """[L, L] bool, True where |i - j| <= window // 2 (a sliding window of `window` + 1 keys around each query)."""
    pos = torch.arange(L, device=device)
    return (pos[:, None] - pos[None, :]).abs() <= window // 2


def attend_scored(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float, training: bool, explicit: bool, scores: Scores
) -> tuple[Tensor, Tensor | None]:
    """`attend` with `scores` applied: q and k rotated, the window's and the terms' masks joined to the padding
    mask. Joined masks are additive (the dtype's minimum where masked), so a padded query row that the window
    leaves no real key still gets finite values, as an all-masked row does in `attend`."""
    if scores.plain:
        return attend(q, k, v, mask, p, training, explicit)
    if scores.rotary is not None:
        q, k = scores.rotary(q, k)
    scale = 1 / math.sqrt(q.shape[-1]) if scores.scale is None else scores.scale
    L = q.shape[-2]
    if (scores.window is not None and scores.terms is None and scores.bias is None and not explicit
            and L >= blockwise_min_length(scores.window)):
        return attend_blocks(q, k, v, mask, p, training, scores.window, scale), None
    keep = window_mask(L, scores.window, q.device) if scores.window is not None else None  # [L, L]
    if mask is not None:
        real = real_keys(mask)  # [n, 1, 1, L]
        keep = real if keep is None else keep & real  # [n, 1, L, L]
    bias, fresh = None, False
    if scores.terms is not None:  # the query scaled once, before every product it enters (q kᵀ and the terms)
        q, scale = q * scale, 1.0
        bias, fresh = scores.terms(q, k), True  # [n, nh, L, L], new: changed in place below
    if scores.bias is not None:
        shared = scores.bias(L, q.device).to(q.dtype)  # [1, nh, L, L]
        bias = shared if bias is None else bias.add_(shared)
    if bias is None and keep is not None and mask is None:  # a window alone: every row keeps its diagonal
        joined: Tensor | None = keep
    elif keep is None:
        joined = bias
    elif bias is not None:
        minimum = torch.finfo(q.dtype).min
        joined = bias.masked_fill_(~keep, minimum) if fresh else bias.masked_fill(~keep, minimum)
    else:
        joined = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill_(~keep, torch.finfo(q.dtype).min)
    return attend(q, k, v, joined, p, training, explicit, scale)


#: A sliding window's attention is computed in blocks of queries, each against only the keys its window reaches,
#: once the sequence is this many times the window (time and memory then grow with L · window, not L²).
#: Measured (12 heads of 64, window 128, 2 threads, inference, 2026-11-27, a quiet machine, two runs): blocks /
#: dense time 0.84 0.75 at L = 512, 0.46 0.41 at 1,024, 0.20 0.23 at 2,048, 0.12 0.14 at 4,096 (8 windows is the
#: cautious side: smaller windows than 128 were not measured).
BLOCKWISE_MIN_WINDOWS = 8


def blockwise_min_length(window: int) -> int:
    """The shortest call whose windowed attention `attend_scored` computes in blocks (`attend_blocks`)."""
    return BLOCKWISE_MIN_WINDOWS * max(window, 16)


def attend_blocks(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float, training: bool, window: int,
                  scale: float) -> Tensor:
    """Sliding-window attention (|i - j| <= window // 2) of q, k, v [n, nh, L, hd] in blocks of b = window
    queries: block m's queries [m·b, (m + 1)·b) see keys [m·b - w, (m + 1)·b + w) (w = window // 2), so each
    block is one [b, b + 2w] call of `attend`, all blocks in one batch. `mask`: the padding mask ([n, 1, 1, L],
    additive or boolean) or None. Masks are additive: a query row with no key left (padding, the tail past L)
    stays finite."""
    n, nh, L, hd = q.shape
    w, b = window // 2, max(window, 16)
    blocks = -(-L // b)
    tail = blocks * b - L
    real = torch.ones(n, L, dtype=torch.bool, device=q.device) if mask is None else real_keys(mask).reshape(n, L)

    def windows(x: Tensor) -> Tensor:  # [n, nh, L, hd] → [n · blocks, nh, b + 2w, hd]: each block's keys
        x = F.pad(x, (0, 0, w, w + tail))  # [n, nh, w + L + w + tail, hd]
        x = x.unfold(2, b + 2 * w, b)  # [n, nh, blocks, hd, b + 2w]
        return x.permute(0, 2, 1, 4, 3).reshape(n * blocks, nh, b + 2 * w, hd)

    keys_real = F.pad(real, (w, w + tail)).unfold(1, b + 2 * w, b)  # [n, blocks, b + 2w]
    row, col = torch.arange(b, device=q.device), torch.arange(b + 2 * w, device=q.device)
    band = (col[None, :] >= row[:, None]) & (col[None, :] <= row[:, None] + 2 * w)  # [b, b + 2w]: |i - j| <= w
    keep = band & keys_real[:, :, None, :]  # [n, blocks, b, b + 2w]
    additive = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill_(~keep, torch.finfo(q.dtype).min)
    queries = F.pad(q, (0, 0, 0, tail)).reshape(n, nh, blocks, b, hd).transpose(1, 2).reshape(n * blocks, nh, b, hd)
    ctx, _ = attend(queries, windows(k), windows(v), additive.reshape(n * blocks, 1, b, b + 2 * w), p, training,
                    scale=scale)  # [n · blocks, nh, b, hd]
    return ctx.reshape(n, blocks, nh, b, hd).transpose(1, 2).reshape(n, nh, blocks * b, hd)[:, :, :L]


def split_heads(qkv: Tensor, n: int, L: int, nh: int, kv: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """[n * L, H + 2·kv·hd] or [n, L, ·] (query, key, value side by side) → q, k, v [n, nh, L, hd]. With fewer
    key/value heads than query heads (`kv` < nh, grouped-query attention), key/value head j serves query heads
    j·g .. (j + 1)·g - 1, g = nh / kv (as `transformers`' `repeat_kv`)."""
    if kv is None or kv == nh:
        q, k, v = qkv.view(n, L, 3, nh, qkv.shape[-1] // (3 * nh)).permute(2, 0, 3, 1, 4)
        return q, k, v
    x = qkv.view(n, L, nh + 2 * kv, qkv.shape[-1] // (nh + 2 * kv))  # [n, L, heads, hd]
    q = x[:, :, :nh].transpose(1, 2)  # [n, nh, L, hd]
    k = x[:, :, nh : nh + kv].transpose(1, 2).repeat_interleave(nh // kv, dim=1)  # [n, kv, L, hd] → [n, nh, L, hd]
    v = x[:, :, nh + kv :].transpose(1, 2).repeat_interleave(nh // kv, dim=1)
    return q, k, v


def merge_heads(ctx: Tensor) -> Tensor:
    """[n, nh, L, hd] → [n, L, H]."""
    n, nh, L, hd = ctx.shape
    return ctx.transpose(1, 2).reshape(n, L, nh * hd)


def static_graph() -> bool:
    """True while the model is traced (ONNX export) or compiled (`--compile`): shortcuts that depend on the data
    (no mask when nothing is padded, the unpadded layout) are not taken, so the graph neither freezes one branch
    nor breaks on it."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling()


def extended_attention_mask(attention_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """[B, S] of 1 (token) / 0 (padding) → additive [B, 1, 1, S] mask, built once per batch.

    Masked keys get the dtype's most negative finite value, not -inf, so a row with every key masked gives a
    uniform softmax instead of NaN. Returns None when nothing is masked (lets SDPA pick its fastest kernel),
    except while tracing (ONNX export) or compiling (`--compile`), where that data-dependent branch would be
    frozen into the graph or break it.
    """
    if attention_mask is None or (not static_graph() and bool(attention_mask.all())):
        return None
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


@dataclass
class Padded:
    """Rows [B, S, ·]; `mask` the additive [B, 1, 1, S] padding mask, or None when nothing is padded."""

    mask: Tensor | None = None

    def attend(self, qkv: Tensor, nh: int, p: float, training: bool, explicit: bool,
               scores: Scores = PLAIN, kv: int | None = None) -> tuple[Tensor, Tensor | None]:
        """qkv [B, S, 3H] → context [B, S, H], probabilities [B, nh, S, S] when `explicit`; `kv`: key/value heads
        where fewer than `nh` (`split_heads`)."""
        B, S = qkv.shape[:2]
        ctx, probs = attend_scored(*split_heads(qkv, B, S, nh, kv), self.mask, p, training, explicit, scores)
        return merge_heads(ctx), probs


@dataclass
class Unpadded(Padded):
    """Where the real tokens of a right- or left-padded [B, S] batch are: the encoder then runs its dense layers,
    LayerNorms, activations and dropout on the T real rows only ([T, H]), and only attention, which needs whole
    sequences, sees the [B, S] layout again. Real tokens get exactly what the padded model computes for them
    (padding keys are masked out either way); no FLOP is spent on padding outside attention."""

    index: Tensor | None = None  # [T] flat positions b * S + s of the real tokens
    batch: int = 0
    seq: int = 0

    @classmethod
    def from_mask(cls, attention_mask: Tensor, mask: Tensor | None) -> "Unpadded":
        """`attention_mask` [B, S] of 1 / 0; `mask` its additive form (`extended_attention_mask`)."""
        B, S = attention_mask.shape
        return cls(mask, attention_mask.reshape(-1).nonzero().squeeze(1), B, S)

    def unpad(self, x: Tensor) -> Tensor:
        """[B, S, C] or [B*S, C] → [T, C]"""
        return x.reshape(self.batch * self.seq, -1).index_select(0, self.index)  # type: ignore[arg-type]

    def pad(self, x: Tensor) -> Tensor:
        """[T, C] → [B, S, C], zeros at padding."""
        full = x.new_zeros(self.batch * self.seq, x.shape[-1]).index_copy(0, self.index, x)  # type: ignore[arg-type]
        return full.view(self.batch, self.seq, -1)

    def attend(self, qkv: Tensor, nh: int, p: float, training: bool, explicit: bool,
               scores: Scores = PLAIN, kv: int | None = None) -> tuple[Tensor, Tensor | None]:
        """qkv [T, 3H] → context [T, H]: zeros at padding (masked keys; their query rows are dropped)."""
        ctx, probs = super().attend(self.pad(qkv), nh, p, training, explicit, scores, kv)  # [B, S, H]
        return self.unpad(ctx), probs


# ---------------------------------------------------------------------------------------------------- packed
@dataclass
class PackedBatch:
    """Sequences laid end to end. `lengths` must be non-increasing so equal lengths form runs."""

    input_ids: Tensor  # [T] int64
    token_type_ids: Tensor | None  # [T] int64, None = all segment 0
    position_ids: Tensor  # [T] int64, 0..len-1 within each sequence
    lengths: list[int]  # tokens per sequence, sum = T

    def to(self, device: torch.device) -> "PackedBatch":
        """The same batch with its tensors on `device` (itself when they are there already)."""
        if self.input_ids.device == device:
            return self
        types = None if self.token_type_ids is None else self.token_type_ids.to(device, non_blocking=True)
        return PackedBatch(self.input_ids.to(device, non_blocking=True), types,
                           self.position_ids.to(device, non_blocking=True), self.lengths)

    @property
    def tokens(self) -> int:
        """Rows T (the sum of `lengths`; a padded batch's fillers included)."""
        return int(self.input_ids.shape[0])

    def padded_to(self, total: int, pad_id: int = 0) -> "PackedBatch":
        """The batch with filler sequences of `pad_id` appended so that it has `total` rows (at least `tokens`).
        The fillers are as long as the last sequence or shorter, so the lengths stay non-increasing; each attends
        only to itself, so the real rows compute what they compute without them. Nothing reads a filler's rows."""
        extra = total - self.tokens
        if extra <= 0:
            return self
        last = self.lengths[-1] if self.lengths else extra
        fill = [last] * (extra // last) + ([extra % last] if extra % last else [])
        device = self.input_ids.device
        ids = torch.cat([self.input_ids, self.input_ids.new_full((extra,), pad_id)])
        types = None if self.token_type_ids is None else torch.cat([self.token_type_ids, self.token_type_ids.new_zeros(extra)])
        positions = torch.cat([self.position_ids, torch.cat([torch.arange(n, device=device) for n in fill])])
        return PackedBatch(ids, types, positions, self.lengths + fill)

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


def bucket_size(tokens: int) -> int:
    """The number of rows a packed batch of `tokens` real rows runs at in inference: rounded up to a multiple of
    1/8 of the power of two below it (at least 16), so at most 12.5 % more rows and 8 sizes per doubling (a
    pipeline's full batches, a few tokens short of max_batch_tokens, round to it when it is a power of two).

    Why: the allocator and oneDNN both keep what they made for each new shape. glibc keeps freed blocks of
    ever-new sizes in the heap, and PyTorch's oneDNN (ideep) caches a primitive for each new matrix size, up to
    1,024 of them; with a packed batch's exact token count as the size, a long-running pipeline or server keeps
    growing. all-MiniLM-L6-v2 embedding chunks of 350 random SST-2 sentence triples, 1 thread, glibc's default,
    2026-12-03 (`bench/embed_memory.py`, medians of 2): after 3 chunks 634 MB, after 30 975 MB at exact sizes (62
    of them); 433 -> 567 MB bucketed (19 sizes), at the same speed (104 and 102 texts/s).
    """
    step = max(16, 1 << max(0, tokens.bit_length() - 4))
    return -(-tokens // step) * step


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


#: Default `max_padding` of the packed layout: none, so a sequence's result does not depend on the rest of its
#: batch (padded, masked calls agree with separate calls only up to float rounding). The embed pipeline uses 0.5
#: (1.45x faster on WikiText paragraphs when SDPA computed every call), for calls longer than
#: `matmul_attention_max_length()` only: short ones are attended by matmuls, and merging them no longer paid
#: (no merging against 0.5 for every length, interleaved, 2026-11-27, all-MiniLM-L6-v2, 2 threads: 2,000 SST-2
#: sentences 590 / 582 /s float32, 1352 / 1269 /s int8).
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


def attention_plan(
    lengths: list[int], max_padding: float = MAX_ATTENTION_PADDING, merge_short: bool = False
) -> list[Bucket]:
    """Attention calls for sequences of non-increasing `lengths` laid end to end.

    Each run of equal length is a dense block needing no mask. Few sequences per run means many small calls, each
    with a fixed cost (a parallel region), so consecutive runs are merged into one call padded to its longest
    sequence while padding stays within `max_padding` of the real positions; padded keys are masked out, so the
    real rows' results are those of separate calls (up to float rounding). Unless `merge_short` (training, where
    SDPA computes every call), only calls longer than `matmul_attention_max_length()` merge: shorter ones are
    attended by matmuls in inference, whose calls cost little, and there the gathering and masking cost more than
    they save (see MAX_ATTENTION_PADDING).
    """
    buckets: list[tuple[int, list[tuple[int, int, int]]]] = []  # (real rows, runs)
    short = 0 if merge_short else matmul_attention_max_length()
    for run in length_groups(lengths):
        if buckets and buckets[-1][1][0][2] > short:
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


@dataclass
class Packed:
    """Rows [T, ·] of sequences laid end to end (a `PackedBatch`), attended in the calls of `plan`."""

    plan: list[Bucket]

    @classmethod
    def from_lengths(cls, lengths: list[int], max_padding: float = MAX_ATTENTION_PADDING,
                     merge_short: bool = False) -> "Packed":
        return cls(attention_plan(lengths, max_padding, merge_short))

    def attend(self, qkv: Tensor, nh: int, p: float, training: bool, explicit: bool,
               scores: Scores = PLAIN, kv: int | None = None) -> tuple[Tensor, None]:
        """qkv [T, 3H] → context [T, H], attending only within each sequence (a run of equal length needs no
        padding mask; `scores` may still add a window's)."""
        if explicit:
            raise ValueError("the packed layout returns no attention probabilities: run the padded model for them")
        outs = []
        for b in self.plan:
            n, L = b.count, b.length
            if b.mask is None:  # one run of equal length: a dense block, no mask, no copy
                ctx, _ = attend_scored(*split_heads(qkv[b.start : b.start + n * L], n, L, nh, kv), None, p,
                                       training, False, scores)
                outs.append(merge_heads(ctx).view(n * L, -1))  # [n*L, H]
            else:  # several runs padded to the longest: one call, padded keys masked out
                padded = qkv.index_select(0, b.gather)  # type: ignore[arg-type]  # [n*L, 3H]; padding rows repeat a real row
                ctx, _ = attend_scored(*split_heads(padded, n, L, nh, kv), b.mask, p, training, False, scores)
                outs.append(merge_heads(ctx).view(n * L, -1).index_select(0, b.scatter))  # type: ignore[arg-type]  # [real, H]
        return (outs[0] if len(outs) == 1 else torch.cat(outs)), None


#: `max_padding` of the documents of packed rows (`document_layout`): runs of nearby lengths share a call while
#: padding stays within half of the real positions, as the embed pipeline's packed batches do.
DOCUMENT_MAX_PADDING = 0.5


def document_layout(real: Tensor, document_ids: Tensor, merge_short: bool = False) -> tuple[Packed, Tensor, Tensor]:
    """Rows that pack several documents, as a `Packed` layout whose sequences are the documents: attention, rotary
    positions and windows then stay within each document, and a long document beside many short ones costs its own
    length squared, not every document's. `real` [T]: the flat positions b * S + s of the real tokens
    (`Unpadded.index`), in row order; `document_ids` [B, S]: side by side, the tokens of a row with one id are one
    document (a new row is always a new document). Returns the layout, `order` [T] (the packed rows' tokens as
    indices into `real`'s order: the documents by non-increasing length) and each packed token's position within
    its document [T]."""
    S = document_ids.shape[1]
    row, doc = real // S, document_ids.reshape(-1).index_select(0, real)
    first = torch.ones_like(real, dtype=torch.bool)
    first[1:] = (row[1:] != row[:-1]) | (doc[1:] != doc[:-1])
    t = torch.arange(real.numel(), device=real.device)
    positions = t - torch.where(first, t, torch.zeros_like(t)).cummax(0).values  # [T], row order
    number = first.cumsum(0) - 1  # [T]: each token's document
    lengths = torch.bincount(number)  # [n]
    longest_first, by_length = torch.sort(lengths, descending=True, stable=True)
    rank = torch.empty_like(by_length).scatter_(0, by_length, torch.arange(lengths.numel(), device=real.device))
    starts = longest_first.cumsum(0) - longest_first  # [n]: each document's first packed row, by rank
    order = torch.empty_like(t).scatter_(0, starts[rank[number]] + positions, t)  # [T]
    layout = Packed.from_lengths(longest_first.tolist(), DOCUMENT_MAX_PADDING, merge_short)
    return layout, order, positions.index_select(0, order)


Layout = Padded | Unpadded | Packed
