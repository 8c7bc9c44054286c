"""`bertforge attention` (`bertforge.commands.attention`): the attention probabilities it draws."""

from __future__ import annotations

import numpy as np
import torch

from bertforge import BertModel
from bertforge.cli import main
from bertforge.tokenizer import Tokenizer

# model_dir, a tiny random BertModel with its tokenizer: a fixture of tests/commands/conftest.py


def test_attention_text_pair_adds_the_second_segment(tmp_path, model_dir, capsys, monkeypatch):
    from bertforge.commands import attention

    drawn = []
    monkeypatch.setattr(attention, "draw", lambda probs, tokens, *rest: drawn.append((probs, tokens)))
    argv = ["attention", "--model", str(model_dir), "--text", "river stone", "--out", str(tmp_path / "a.png")]
    assert main(argv) == 0
    assert main([*argv, "--text-pair", "golden castle"]) == 0
    (single_probs, single), (pair_probs, pair) = drawn
    assert single.count("[SEP]") == 1 and pair.count("[SEP]") == 2
    assert pair[: len(single)] == single and "".join(pair[len(single):]).replace("##", "") == "goldencastle[SEP]"
    assert pair_probs.shape[-1] == len(pair) and single_probs.shape[-1] == len(single)
    # the second segment is read as segment B: with token types all 0 the probabilities would differ
    model = BertModel.from_pretrained(model_dir).eval()
    model.set_attn_implementation("eager")
    tok = Tokenizer.from_pretrained(model_dir)
    enc = tok("river stone", "golden castle")
    with torch.no_grad():
        out = model(torch.tensor([enc["input_ids"]]), token_type_ids=torch.tensor([enc["token_type_ids"]]),
                    output_attentions=True)
    assert np.allclose(pair_probs, out.attentions[-1][0].numpy(), atol=1e-6)
    assert 1 in enc["token_type_ids"]
