"""`bertforge attention` (`bertforge.commands.attention`): the attention probabilities it draws."""

from __future__ import annotations

import numpy as np
import pytest
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


def test_cli_attention(tmp_path, cognition_dir, capsys):
    out = tmp_path / "att.png"
    assert main(["attention", "--model", str(cognition_dir), "--text", "The cat sat on the mat.", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    one = tmp_path / "one.png"
    assert main(["attention", "--model", str(cognition_dir), "--text", "Hi", "--out", str(one), "--layer", "0",
                 "--head", "1"]) == 0
    capsys.readouterr()
    assert main(["attention", "--model", str(cognition_dir), "--text", "Hi", "--out", str(one), "--layer", "7"]) == 2
    assert "--layer 7 is out of range: the model has 2 layers" in capsys.readouterr().err
    assert main(["attention", "--model", str(cognition_dir), "--text", "Hi", "--out", str(one), "--head", "5"]) == 2
    assert "--head 5 is out of range" in capsys.readouterr().err
    assert main(["attention", "--model", str(cognition_dir), "--text", "Hi", "--out", str(tmp_path / "a.gif")]) == 2
    assert "must end in one of" in capsys.readouterr().err


def test_attention_probabilities_match_transformers(cognition_dir):
    from bertforge.commands.attention import attention_probabilities
    transformers = pytest.importorskip("transformers")

    layers, tokens = attention_probabilities(cognition_dir, "The cat sat on the mat.", None)
    tok = transformers.AutoTokenizer.from_pretrained(cognition_dir)
    ref = transformers.BertModel.from_pretrained(cognition_dir, attn_implementation="eager").eval()
    enc = tok("The cat sat on the mat.", return_tensors="pt")
    with torch.no_grad():
        expected = ref(**enc, output_attentions=True).attentions
    assert tokens == tok.convert_ids_to_tokens(enc["input_ids"][0])
    for mine, theirs in zip(layers, expected):
        assert np.abs(mine - theirs[0].numpy()).max() < 1e-5


def test_attention_without_matplotlib_names_the_extra(tmp_path, model_dir, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the `plots` extra were not installed
    out = tmp_path / "a.png"
    assert main(["attention", "--model", str(model_dir), "--text", "river stone", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "matplotlib" in err and "pip install 'bertforge[plots]'" in err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []  # nothing written
