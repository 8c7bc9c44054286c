"""The heads: the MLM head projects only labelled positions with the same loss, and an untrained MLM head
starts at the loss of a uniform guess, ln |V| (BERT's init N(0, 0.02²)); the first-token head's order of
dropout, dense and activation."""

import math

import torch
import torch.nn.functional as F

import bertforge
from bertforge import BertConfig
from bertforge.model import BertForMaskedLM, FirstTokenHead, masked_lm


def test_sparse_masked_lm_projects_only_labelled_rows_with_the_dense_loss():
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig.preset("tiny", vocab_size=50))
    hidden = torch.randn(2, 6, 128, requires_grad=True)
    labels = torch.full((2, 6), -100)
    labels[0, 1], labels[1, 4] = 7, 33
    sparse_logits, sparse = masked_lm(model.mlm_head(), model.input_embeddings(), hidden, labels, sparse=True)
    dense_logits, dense = masked_lm(model.mlm_head(), model.input_embeddings(), hidden, labels, sparse=False)
    assert sparse_logits.shape == (2, 50) and dense_logits.shape == (2, 6, 50)
    assert torch.allclose(sparse, dense, atol=1e-6)
    assert torch.allclose(sparse_logits, dense_logits[labels != -100], atol=1e-6)
    assert torch.allclose(model.mlm_logits(hidden[0, 1]), dense_logits[0, 1], atol=1e-6)


def test_first_token_head_drops_out_then_dense_activation_dropout_out_proj():
    config = BertConfig.preset("distilbert-tiny", vocab_size=50, num_labels=3)
    head = FirstTokenHead(config.spec, 3, p=0.0).eval()
    for p in head.parameters():
        torch.nn.init.normal_(p)
    first = torch.randn(4, 128)
    want = F.linear(F.relu(F.linear(first, head.dense.weight, head.dense.bias)), head.out_proj.weight, head.out_proj.bias)
    assert torch.allclose(head(first), want, atol=1e-4)


def test_untrained_mlm_loss_is_about_ln_vocab():
    cfg = BertConfig.preset("tiny", vocab_size=30522)
    torch.manual_seed(0)
    model = bertforge.BertForMaskedLM(cfg).eval()
    ids = torch.randint(5, cfg.vocab_size, (4, 64))
    labels = torch.randint(5, cfg.vocab_size, (4, 64))
    loss = model(ids, labels=labels).loss.item()
    assert abs(loss - math.log(cfg.vocab_size)) < 0.3


