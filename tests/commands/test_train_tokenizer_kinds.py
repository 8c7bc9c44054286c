"""`bertforge train-tokenizer --algorithm bpe | unigram | wordpiece`: a tokenizer of each kind trained from the command line.

A topic file of `tests/commands/test_train_tokenizer.py`."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from bertforge.cli import main
from bertforge.tokenizer import ALBERT, BERT, MMBERT, ROBERTA, Tokenizer
from tests.tokenizer.tokenizer_helpers import training_corpus


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return training_corpus(1500, seed=11)


# ---------------------------------------------------------------------------------------------- the command


def test_cli_train_tokenizer_model(tmp_path, corpus, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(corpus[:400] + ["Submarine harbour, submarine Harbour."] * 60) + "\n", encoding="utf-8")
    for model, kind in (("bpe", ROBERTA), ("unigram", ALBERT), ("wordpiece", BERT)):
        out = tmp_path / model
        assert main(["train-tokenizer", "--corpus", str(text), "--algorithm", model, "--vocab-size", "400",
                     "--out", str(out)]) == 0
        tok = Tokenizer.from_pretrained(out)
        assert tok.kind is kind and type(AutoTokenizer.from_pretrained(out)).__name__ == kind.tokenizer_class
        assert f"{kind.family} ({model}) vocabulary of" in capsys.readouterr().out
    bpe = Tokenizer.from_pretrained(tmp_path / "bpe").get_vocab()
    assert all(any(t.startswith(start) for t in bpe) for start in ("Sub", "Ġsub", "ĠHar", "Ġhar"))  # keeps case
    assert main(["train-tokenizer", "--corpus", str(text), "--algorithm", "bpe", "--cased", "--vocab-size", "400",
                 "--out", str(tmp_path / "bpe-cased")]) == 0
    assert "--cased changes nothing for --algorithm bpe" in capsys.readouterr().out
    assert main(["train-tokenizer", "--corpus", str(text), "--algorithm", "unigram", "--cased", "--vocab-size", "400",
                 "--out", str(tmp_path / "unigram-cased")]) == 0
    cased = Tokenizer.from_pretrained(tmp_path / "unigram-cased")
    def capitalized(vocab: dict[str, int]) -> set[str]:
        return {t for t in vocab if t.lstrip("▁")[:1].isupper() and t not in ("[CLS]", "[SEP]", "[MASK]")}

    assert not cased.do_lower_case and {"S", "H"} <= capitalized(cased.get_vocab())
    assert not capitalized(Tokenizer.from_pretrained(tmp_path / "unigram").get_vocab())


def test_cli_train_tokenizer_of_a_family_kind(tmp_path, corpus, capsys):
    """`--kind mmbert`: Gemma's byte-fallback BPE (any character spelt by its bytes), as transformers reads it."""
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(corpus[:400]) + "\n", encoding="utf-8")
    assert main(["train-tokenizer", "--corpus", str(text), "--kind", "mmbert", "--vocab-size", "600",
                 "--out", str(tmp_path / "mm")]) == 0
    assert "mmBERT (mmbert) vocabulary of 600 tokens" in capsys.readouterr().out
    tok, hf = Tokenizer.from_pretrained(tmp_path / "mm"), AutoTokenizer.from_pretrained(tmp_path / "mm")
    assert tok.kind is MMBERT and tok.unk_token_id not in tok("snowman ☃ 🦞")["input_ids"]
    assert tok("snowman ☃ 🦞", "pair")["input_ids"] == hf("snowman ☃ 🦞", "pair")["input_ids"]
    assert hf.decode(hf("snowman ☃ 🦞")["input_ids"], skip_special_tokens=True) == "snowman ☃ 🦞"
