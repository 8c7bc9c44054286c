"""What the family tests share: the Auto class of each `transformers` task suffix, and the output comparison."""

import torch

import bertforge

TASKS = {
    "Model": bertforge.AutoModel,
    "ForMaskedLM": bertforge.AutoModelForMaskedLM,
    "ForSequenceClassification": bertforge.AutoModelForSequenceClassification,
    "ForTokenClassification": bertforge.AutoModelForTokenClassification,
    "ForQuestionAnswering": bertforge.AutoModelForQuestionAnswering,
}


def assert_close(ref, ours, mask, tol: float = 1e-5):
    """Every output of `transformers`' `ref` within `tol` of bertforge's `ours`; per-token outputs at the real
    positions of `mask` [B, S] only (padding rows carry no meaning, and some families fill them otherwise)."""
    compared = 0
    for name in ref.keys():
        if name in ("hidden_states", "attentions", "loss"):
            continue
        a, b = ref[name], ours[name]
        if a.shape[:2] == mask.shape:
            m = mask.reshape(*mask.shape, *[1] * (a.dim() - 2))
            a, b = a * m, b * m
        assert a.shape == b.shape, name
        assert (a - b).abs().max() <= tol, name
        compared += 1
    assert compared


def padded_batch(vocab_size: int = 99, pad: int = 0):
    """Rows of 12, 7 and 2 tokens padded with `pad` (ids from 5 up): (input_ids, attention_mask) [3, 12]."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab_size, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 2:] = 0
    return ids.masked_fill(mask == 0, pad), mask
