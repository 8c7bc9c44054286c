"""Tests of `bertforge.tokenizer.vocabulary`: the vocabulary accessors against transformers' BertTokenizerFast on the
same all-MiniLM-L6-v2 files, and a vocabulary that lacks a special token."""

from __future__ import annotations

import json

import pytest

from bertforge.core.errors import BertforgeError
from bertforge.tokenizer import Tokenizer
from tests.tokenizer.tokenizer_helpers import MINILM


def test_vocabulary_accessors_match(pair):
    ours, hf = pair
    assert ours.vocab_size == len(ours) == len(hf) == 30522
    assert ours.get_vocab() == hf.get_vocab()
    for role in ("pad", "unk", "cls", "sep", "mask"):
        assert getattr(ours, f"{role}_token") == getattr(hf, f"{role}_token")
        assert getattr(ours, f"{role}_token_id") == getattr(hf, f"{role}_token_id")
    tokens = ["hello", "##ing", "[MASK]", "not-a-token-at-all", "日"]
    assert ours.convert_tokens_to_ids(tokens) == hf.convert_tokens_to_ids(tokens)
    assert ours.convert_tokens_to_ids("hello") == hf.convert_tokens_to_ids("hello")
    ids = [101, 7592, 2088, 102, 0, 103, 29999]
    assert ours.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert ours.convert_ids_to_tokens(ids, skip_special_tokens=True) == hf.convert_ids_to_tokens(
        ids, skip_special_tokens=True
    )
    assert ours.convert_ids_to_tokens(7592) == hf.convert_ids_to_tokens(7592)
    assert isinstance(ours.backend.get_vocab_size(), int)


def test_tokenizer_json_without_a_special_token(tmp_path):
    data = json.loads((MINILM / "tokenizer.json").read_text(encoding="utf-8"))
    del data["model"]["vocab"]["[MASK]"]
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "[MASK]"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(BertforgeError, match=r"tokenizer\.json: vocabulary lacks the required special token \[MASK\]"):
        Tokenizer.from_pretrained(tmp_path)
