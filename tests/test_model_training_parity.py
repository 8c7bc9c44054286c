"""The fast training path (sparse MLM decoder, unpadded encoder, fused AdamW) follows the reference path step by
step: `transformers.BertForPreTraining` from the same weights, on the same padded batches, with the same optimizer
settings and no dropout, gives the same losses (bar 1e-6 x |loss|; measured 2.0e-7 x |loss|, 9.5e-7 absolute on a
loss of 4.7, two float32 ulps) and the same weights (bar 2e-6; measured 5.3e-7 with two threads, 2.4e-7 with one,
1.02e-6 with BERTFORGE_LINEAR=aten) after 25 steps."""

from __future__ import annotations

import pytest
import torch

import bertforge
from bertforge.training.optim import make_optimizer, parameter_groups

transformers = pytest.importorskip("transformers")

STEPS = 25


def batches(vocab: int, n: int, batch: int = 6, seq: int = 24) -> list[dict[str, torch.Tensor]]:
    """Padded [CLS] A [SEP] B [SEP] rows with 15% labelled positions and NSP labels (a few fixed batches reused,
    so that the loss has something to fall on)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        lengths = torch.randint(6, seq + 1, (batch,), generator=g)
        ids = torch.randint(5, vocab, (batch, seq), generator=g)
        mask = (torch.arange(seq) < lengths[:, None]).long()
        types = torch.zeros_like(ids)
        for b, length in enumerate(lengths.tolist()):
            cut = length // 2
            ids[b, 0], ids[b, cut], ids[b, length - 1] = 2, 3, 3  # [CLS] ... [SEP] ... [SEP]
            types[b, cut + 1 : length] = 1
        ids[mask == 0] = 0
        chosen = (torch.rand(batch, seq, generator=g) < 0.15) & (mask == 1) & (ids > 4)
        chosen[:, 1] = True  # at least one label per row
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        ids = torch.where(chosen, torch.full_like(ids, 4), ids)  # [MASK]
        nsp = torch.randint(0, 2, (batch,), generator=g)
        out.append(dict(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels,
                        next_sentence_label=nsp))
    return out


def test_training_run_follows_transformers(tmp_path):
    cfg = bertforge.BertConfig(vocab_size=120, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=96, max_position_embeddings=32, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    ours = bertforge.BertForPreTraining(cfg)
    ours.save_pretrained(tmp_path)
    ref = transformers.BertForPreTraining.from_pretrained(tmp_path, attn_implementation="sdpa")
    ours.train(), ref.train()
    opt_ours = make_optimizer(ours, "adamw", 2e-3, 0.01)  # fused AdamW on CPU
    assert opt_ours.defaults.get("fused"), "the fast path under test uses the fused AdamW kernel"
    opt_ref = torch.optim.AdamW(parameter_groups(ref, 0.01), lr=2e-3, betas=(0.9, 0.999), eps=1e-6, foreach=False)
    data = batches(cfg.vocab_size, 5)
    losses = []
    for step in range(STEPS):
        batch = data[step % len(data)]
        pair = []
        for model, opt in ((ours, opt_ours), (ref, opt_ref)):
            opt.zero_grad(set_to_none=True)
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            pair.append(loss.item())
        losses.append(pair)
    first, last = losses[0], losses[-1]
    assert abs(first[0] - first[1]) < 1e-5, first  # same weights, same batch
    assert last[1] < first[1] - 0.5, "the reference run must learn something for the comparison to mean anything"
    gaps = [abs(a - b) / max(1.0, abs(b)) for a, b in losses]
    ref_params = dict(ref.named_parameters())
    drift = {name: (p - ref_params[name]).abs().max().item() for name, p in ours.named_parameters()
             if name != "cls.predictions.decoder.weight" and name in ref_params}  # the decoder is tied to the embeddings
    print(f"largest relative loss gap {max(gaps):.2e}, largest weight gap {max(drift.values()):.2e}")
    for step, ((a, b), gap) in enumerate(zip(losses, gaps)):
        assert gap <= 1e-6, f"step {step}: bertforge {a:.7f} vs transformers {b:.7f}"  # measured at most 2.0e-7
    for name, diff in drift.items():
        assert diff <= 2e-6, f"{name}: weights drifted apart by {diff:.2e} after {STEPS} steps"  # measured 5.3e-7
