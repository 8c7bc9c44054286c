"""What the family tests share: the Auto class of each `transformers` task suffix, and the output comparison."""

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
