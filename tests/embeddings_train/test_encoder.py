"""Tests of `bertforge.embeddings_train.encoder`: packed embeddings against the padded forward, in input order."""

from __future__ import annotations

import torch

from bertforge import BertModel
from bertforge.embeddings_train.encoder import embed_all, embed_ids, rng_state, set_rng_state

CPU = torch.device("cpu")
IDS = [[2, 7, 8, 3], [2, 9, 3], [2, 10, 11, 12, 13, 14, 15, 3], [2, 3], [2, 16, 17, 3]]  # [CLS] ... [SEP], unsorted


def reference(model: BertModel, ids: list[list[int]], pooling: str) -> torch.Tensor:
    """Each sequence alone through the padded `forward`: the mean of its rows, or its first."""
    rows = []
    with torch.no_grad():
        for row in ids:
            hidden = model(torch.tensor([row])).last_hidden_state[0]  # [L, H]
            rows.append(hidden.mean(0) if pooling == "mean" else hidden[0])
    return torch.stack(rows)


def test_embed_ids_and_embed_all_equal_the_padded_forward(tiny):
    model = BertModel.from_pretrained(tiny, quiet=True).eval()
    for pooling in ("mean", "cls"):
        expected = reference(model, IDS, pooling)
        with torch.no_grad():
            packed = embed_ids(model, IDS, pooling, CPU)
        assert packed.shape == (len(IDS), model.config.hidden_size)
        torch.testing.assert_close(packed, expected, rtol=0, atol=1e-5)  # in the input's order, not by length
    model.train()
    batched = embed_all(model, IDS, "mean", CPU, batch_size=2)  # eval mode inside (no dropout), 3 batches
    assert model.training and not batched.requires_grad and batched.dtype == torch.float32
    torch.testing.assert_close(batched, reference(model.eval(), IDS, "mean"), rtol=0, atol=1e-5)


def test_rng_state_replays_the_random_draws():
    state = rng_state(CPU)
    assert state[1] is None  # no device generator on the CPU
    first = torch.rand(5)
    set_rng_state(state, CPU)
    assert torch.equal(torch.rand(5), first)
