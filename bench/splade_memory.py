"""SPLADE training: the activations the MLM head keeps for backward, with `splade_pool`'s chunked, recomputed
vocabulary projection against the plain one (every token's [V] logits kept), and the time of forward + backward.

The head is BERT-base's (dense 768 → 768, GELU, LayerNorm, the 30,522-entry decoder) on random hidden states of a
packed batch (`--texts` texts of `--tokens` tokens each, the texts of a batch of in-batch negatives: queries and
documents). What autograd keeps from the forward pass to the backward pass is counted exactly, tensor by tensor
(`torch.autograd.graph.saved_tensors_hooks`), so the memory figures are not noisy; `splade_pool`'s backward then
recomputes one chunk at a time, whose activations (printed too: the plain forward's on one chunk) are alive only
during that chunk's backward. The times are noisy on a shared machine (medians of `--repeats`).

    .venv/bin/python bench/splade_memory.py                       # 64 texts x 128 tokens
    .venv/bin/python bench/splade_memory.py --texts 32 --tokens 256 --chunk-tokens 1024
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bertforge.model.pooling import SPLADE_CHUNK_TOKENS, splade_pool


def head(hidden: int, vocab: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.GELU(), torch.nn.LayerNorm(hidden),
                               torch.nn.Linear(hidden, vocab))


def plain(logits, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Every token's logits at once, kept for backward: the straightforward SPLADE forward."""
    values = torch.log1p(torch.relu(logits(x)))  # [T, V]
    return torch.stack([part.amax(0) for part in values.split(lengths)])


def saved_bytes(fn) -> int:
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--chunk-tokens", type=int, default=SPLADE_CHUNK_TOKENS)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    mlm = head(args.hidden, args.vocab)
    lengths = [args.tokens] * args.texts
    x = torch.randn(sum(lengths), args.hidden, requires_grad=True)
    ways = {"plain": lambda: plain(mlm, x, lengths),
            "splade_pool": lambda: splade_pool(mlm, x, lengths, chunk_tokens=args.chunk_tokens)}
    print(f"{args.texts} texts x {args.tokens} tokens, head {args.hidden} -> {args.vocab}, "
          f"chunks of {args.chunk_tokens} tokens, {torch.get_num_threads()} threads")
    results = {}
    for name, fn in ways.items():
        memory = saved_bytes(lambda fn=fn: fn().sum().backward())
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            fn().sum().backward()
            times.append(time.perf_counter() - start)
        results[name] = (memory, statistics.median(times))
        print(f"{name:12s} saved for backward {memory / 2**20:9.1f} MiB   forward+backward {results[name][1]:.3f} s")
    per_chunk = max(1, args.chunk_tokens // args.tokens)  # whole texts to a chunk
    chunk = [args.tokens] * min(per_chunk, args.texts)
    transient = saved_bytes(lambda: plain(mlm, x[:sum(chunk)], chunk).sum().backward())
    print(f"{'':12s} + one chunk recomputed in backward {transient / 2**20:.1f} MiB ({len(chunk)} texts)")
    (m0, t0), (m1, t1) = results["plain"], results["splade_pool"]
    print(f"splade_pool / plain: kept memory {m1 / m0:.3f}x, peak of the head's activations "
          f"{(m1 + transient) / m0:.3f}x, time {t1 / t0:.2f}x")


if __name__ == "__main__":
    main()
