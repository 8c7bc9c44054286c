"""Texts → sentence embeddings through the encoder's packed layout, for training and for evaluation.

Training runs the model the way the embed pipeline does inference (`BertModel.forward_packed`): the texts of a
batch laid end to end, sorted by length, no padding row anywhere (dense layers see only real tokens; attention
groups sequences of equal or similar length), then mean or [CLS] pooling (`bertforge.model.pooling.pool`), or, for
a sparse encoder ("splade", a masked-LM model), SPLADE's pooling of the MLM head's logits
(`bertforge.model.pooling.splade_pool`: the vocabulary projection a chunk of tokens at a time, recomputed in the
backward pass). Embeddings come back in the order of the input.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ..model.attention import pack
from ..model import BertPreTrainedModel
from ..model.pooling import pool, splade_pool

SPLADE = "splade"  # the "pooling" of a sparse encoder: the MLM head's logits, SPLADE-pooled

# Neighbouring runs of lengths share one padded, masked attention call while padding stays under half of the real
# positions: the embed pipeline's setting (fewer small calls; results differ from separate calls by rounding only).
ATTENTION_PADDING = 0.5


def embedding_size(model: BertPreTrainedModel, pooling: str) -> int:
    """The size of the model's embeddings: its hidden size, or its vocabulary for a sparse encoder."""
    return model.config.vocab_size if pooling == SPLADE else model.config.hidden_size


def embed_ids(model: BertPreTrainedModel, ids: Sequence[list[int]], pooling: str, device: torch.device) -> Tensor:
    """Pooled (not normalised) embeddings [n, H] of token-id lists, in their order; grad as the caller's mode.
    With `pooling` "splade", `model` is a masked-LM model and the embeddings its SPLADE vectors [n, V]."""
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # the packed layout wants non-increasing lengths
    batch = pack([ids[i] for i in order])
    moved = dataclasses.replace(batch, input_ids=batch.input_ids.to(device), position_ids=batch.position_ids.to(device))
    hidden = model.base_model.forward_packed(moved, ATTENTION_PADDING)  # [T, H] (the encoder: itself for a BertModel)
    if pooling == SPLADE:
        head: Any = model  # a BertForMaskedLM or BertForPreTraining: its MLM head's logits
        pooled = splade_pool(head.mlm_logits, hidden, batch.lengths)  # [n, V], sorted order
    else:
        pooled = pool(hidden, batch.lengths, batch.starts, pooling)  # [n, H], sorted order
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
    return pooled.index_select(0, inverse.to(pooled.device))  # [n, H], input order


@torch.no_grad()
def embed_all(model: BertPreTrainedModel, ids: Sequence[list[int]], pooling: str, device: torch.device, batch_size: int,
              autocast: Callable[[], Any] | None = None) -> Tensor:
    """Float32 embeddings [n, H] (on the CPU) of every token-id list, `batch_size` at a time, in eval mode, with
    the lists sorted by length first so each batch holds similar lengths."""
    was_training = model.training
    model.eval()
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    out = torch.empty(len(ids), embedding_size(model, pooling))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        with autocast() if autocast is not None else contextlib.nullcontext():
            out[chunk] = embed_ids(model, [ids[i] for i in chunk], pooling, device).float().cpu()
    model.train(was_training)
    return out


def rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    """The random state dropout draws from on `device` (the CPU generator, and the device's own on CUDA)."""
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def set_rng_state(state: tuple[Tensor, Tensor | None], device: torch.device) -> None:
    """Put back a `rng_state`: a mini-batch re-run with grad then draws the dropout masks of its first run."""
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class SentenceEncoder(torch.nn.Module):
    """The model as training calls it: token-id lists → pooled embeddings (`embed_ids`) as its `forward`, so that
    DDP (`training.parallel.wrap_model`), which hooks the module's forward, sees every training pass."""

    def __init__(self, model: BertPreTrainedModel, pooling: str) -> None:
        super().__init__()
        self.model, self.pooling = model, pooling

    def forward(self, ids: Sequence[list[int]], device: torch.device) -> Tensor:
        return embed_ids(self.model, ids, self.pooling, device)
