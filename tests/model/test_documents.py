"""Rows that pack several documents (`document_ids`): each document attends only within itself, its positions (a
position table's, rotary ones, sliding windows) counted from its own start, so every token gets what the document
alone gives it."""

from __future__ import annotations

import pytest
import torch

from bertforge import BertConfig, BertforgeError
from bertforge.model import BertForMaskedLM, BertModel
from bertforge.model.attention import document_layout

FAMILIES = {  # a window of 4 (shorter than the documents) and rotary positions; position tables with and without offset
    "modernbert": dict(local_attention=4, global_attn_every_n_layers=2),
    "bert": {}, "roberta": {}, "deberta-v2": {},
}


def tiny(family: str) -> BertConfig:
    name = "tiny" if family == "bert" else f"{family}-tiny"
    config = BertConfig.preset(name, vocab_size=60, num_hidden_layers=3, hidden_size=32, num_attention_heads=2,
                               intermediate_size=48, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config.extra.update(FAMILIES[family])
    return config


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])  # train: calls merged (no dropout here)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_packed_row_of_documents_equals_the_documents_alone(family, training):
    torch.manual_seed(0)
    model = BertModel(tiny(family)).train(training)
    g = torch.Generator().manual_seed(1)
    docs = [torch.randint(5, 60, (n,), generator=g) for n in (9, 6, 11, 4)]
    # row 0: documents 0 and 1 then padding; row 1: documents 2 and 3, no padding (left to right, lengths 15 / 15)
    input_ids = torch.full((2, 16), 0)
    attention_mask = torch.zeros(2, 16, dtype=torch.long)
    document_ids = torch.zeros(2, 16, dtype=torch.long)
    input_ids[0, :15] = torch.cat(docs[:2])
    attention_mask[0, :15] = 1
    document_ids[0, 9:] = 1
    input_ids[1, :15] = torch.cat(docs[2:])
    attention_mask[1, :15] = 1
    document_ids[1, 11:] = 7  # any ids: a change of id is a new document
    with torch.no_grad():
        packed = model(input_ids, attention_mask, document_ids=document_ids).last_hidden_state
        alone = [model(d[None]).last_hidden_state[0] for d in docs]
    got = [packed[0, :9], packed[0, 9:15], packed[1, :11], packed[1, 11:15]]
    for i, (a, b) in enumerate(zip(got, alone)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5, msg=f"{family} document {i}")
    assert packed[0, 15].abs().max() == 0  # padding
    # without document_ids, the second document sees the first: the test can tell
    with torch.no_grad():
        crossed = model(input_ids, attention_mask).last_hidden_state
    assert (crossed[0, 9:15] - alone[1]).abs().max() > 1e-3


def test_documents_train_through_sparse_mlm_and_give_gradients():
    torch.manual_seed(0)
    model = BertForMaskedLM(tiny("modernbert"))
    ids = torch.randint(5, 60, (2, 12))
    labels = torch.full((2, 12), -100)
    labels[0, 3], labels[1, 8] = 7, 9
    document_ids = (torch.arange(12) >= 5).long().expand(2, 12)
    out = model(ids, torch.ones_like(ids), labels=labels, document_ids=document_ids)
    out.loss.backward()
    assert out.logits.shape == (2, 60) and model.input_embeddings().grad.abs().sum() > 0


def test_document_layout_orders_documents_by_length_and_counts_positions_within_each():
    document_ids = torch.tensor([[0, 0, 0, 1, 1, 0], [2, 2, 5, 5, 5, 5]])
    real = torch.tensor([0, 1, 2, 3, 4, 6, 7, 8, 9, 10])  # row 0's last token is padding, row 1's first
    layout, order, positions = document_layout(real, document_ids)
    # documents of 3, 2, 2 and 3 tokens, packed longest first (stable): 0, 3, 1, 2
    assert order.tolist() == [0, 1, 2, 7, 8, 9, 3, 4, 5, 6]
    assert positions.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 0, 1]
    assert [(b.start, b.count, b.length) for b in layout.plan] == [(0, 2, 3), (6, 2, 2)]
    merged, _, _ = document_layout(real, document_ids, merge_short=True)  # training: one call, padded within 0.5
    assert [(b.start, b.count, b.length, b.real) for b in merged.plan] == [(0, 4, 3, 10)]


def test_a_long_document_beside_short_ones_is_not_padded_to_its_length():
    """One 40-token document and 20 of 3 tokens: the calls cover 40² + 20 · 3² key pairs' worth, not 21 · 40²."""
    document_ids = torch.cat([torch.zeros(40), torch.arange(1, 21).repeat_interleave(3)]).long()[None]
    real = torch.arange(100)
    layout, _, _ = document_layout(real, document_ids, merge_short=True)
    assert sum(b.count * b.length for b in layout.plan) == 100  # no padding at all: two runs of equal length


def test_document_ids_refuse_per_layer_outputs():
    model = BertModel(tiny("bert"))
    ids = torch.randint(5, 60, (1, 6))
    with pytest.raises(BertforgeError, match="document_ids"):
        model(ids, document_ids=torch.zeros_like(ids), output_hidden_states=True)
