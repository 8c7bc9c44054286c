"""Sentence-embedding training over several processes (`torchrun`): each rank embeds its share of the global batch
and the loss sees the whole batch.

Every rank draws the same batches (the run's generator, same seed). A batch's examples are split into `shares`,
contiguous and in the order of one process (rank 0 the first ones), so that the embeddings gathered from every rank,
rank after rank, are one process's batch. `gather_rows` all-gathers each rank's rows with autograd: every rank then
computes the loss of the whole batch, and the gradient that reaches a rank's own rows is the sum of what every
rank's loss sends them (its backward all-reduces the gathered gradient and keeps the rank's slice). With
`TrainStep`'s weights (each rank's loss weighted by its share of the examples, times the world size to undo DDP's
average) the parameters get the gradient of one process's loss on the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor


def shares(count: int, world_size: int) -> list[int]:
    """How many of a batch's `count` examples each rank takes: contiguous, near equal, the larger shares first."""
    return [count // world_size + (rank < count % world_size) for rank in range(world_size)]


class _GatherRows(torch.autograd.Function):
    """Every rank's [n_r, H] rows (padded to the largest n_r for the collective), in rank order; backward sums
    the gradient over ranks and returns this rank's rows of it."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, counts: list[int], rank: int) -> tuple[Tensor, ...]:
        most = max(counts)
        padded = F.pad(local, (0, 0, 0, most - len(local))).contiguous()  # [most, H]
        every = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(every, padded)
        ctx.counts, ctx.rank = counts, rank
        return tuple(rows[:n] for rows, n in zip(every, counts))

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, None, None]:
        total = torch.cat([g.contiguous() for g in grads])  # [Σ n_r, H], this rank's loss's gradient
        dist.all_reduce(total)  # summed over every rank's loss
        start = sum(ctx.counts[: ctx.rank])
        return total[start : start + ctx.counts[ctx.rank]], None, None


def gather_rows(local: Tensor, counts: Sequence[int], rank: int) -> list[Tensor]:
    """The rows of every rank ([counts[r], H] each, `local` being this rank's), differentiable (see the module)."""
    return list(_GatherRows.apply(local, list(counts), rank))


def gather_columns(local: Tensor, columns: int, sizes: Sequence[int], rank: int) -> list[Tensor]:
    """A batch's columns ([B, H] each: anchors, positives, negatives) from every rank's embeddings of its share
    (`local`: [columns * sizes[rank], H], column after column), in the order of one process."""
    every = gather_rows(local, [columns * n for n in sizes], rank)
    split = [rows.chunk(columns) if len(rows) else [rows] * columns for rows in every]
    return [torch.cat([parts[c] for parts in split]) for c in range(columns)]
