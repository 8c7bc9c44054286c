"""Fixtures of the tokenizer tests: the all-MiniLM-L6-v2 tokenizer loaded by bertforge and by transformers (from
tokenizer.json and from vocab.txt alone), hard generated strings, and a tokenizer trained on generated text.

The tokenizers are built once per session: the tests only read them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from transformers import BertTokenizerFast

from bertforge.tokenizer import Tokenizer
from tests.tokenizer.tokenizer_helpers import MINILM, hard_strings, training_corpus


@pytest.fixture(scope="session")
def hf_json() -> BertTokenizerFast:
    return BertTokenizerFast.from_pretrained(MINILM)


@pytest.fixture(scope="session")
def ours_json() -> Tokenizer:
    return Tokenizer.from_pretrained(MINILM)


@pytest.fixture(scope="session")
def vocab_only_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("vocab_only")
    shutil.copy(MINILM / "vocab.txt", directory)
    shutil.copy(MINILM / "tokenizer_config.json", directory)
    return directory


@pytest.fixture(scope="session")
def hf_vocab(vocab_only_dir) -> BertTokenizerFast:
    return BertTokenizerFast.from_pretrained(vocab_only_dir)


@pytest.fixture(scope="session")
def ours_vocab(vocab_only_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(vocab_only_dir)


@pytest.fixture(params=["tokenizer.json", "vocab.txt"])
def pair(request, hf_json, ours_json, hf_vocab, ours_vocab) -> tuple[Tokenizer, BertTokenizerFast]:
    """(ours, transformers') loaded the same way: from tokenizer.json or from a directory with only vocab.txt."""
    if request.param == "tokenizer.json":
        return ours_json, hf_json
    return ours_vocab, hf_vocab


@pytest.fixture(scope="session")
def texts() -> list[str]:
    return hard_strings(2000, seed=1234)


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return training_corpus(2000, seed=7)


@pytest.fixture(scope="session")
def trained(corpus) -> Tokenizer:
    return Tokenizer.train(iter(corpus), vocab_size=600, show_progress=False)
