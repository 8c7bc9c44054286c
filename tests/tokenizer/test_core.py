"""Tests of `bertforge.tokenizer.core`: `Tokenizer` against transformers' BertTokenizerFast, training, threads.

Encodings and decoding against the same all-MiniLM-L6-v2 files loaded by transformers; BERT tokenizers trained here;
pickling and concurrent calls; training input checked."""

from __future__ import annotations

import pickle
import threading
import time

import pytest
import torch
from transformers import AutoTokenizer

from bertforge.core.errors import BertforgeError
from bertforge.tokenizer import Tokenizer
from tests.tokenizer.tokenizer_helpers import assert_same, hard_strings, word_lists


# ---------------------------------------------------------------------------------------------- parity


def test_generated_strings_are_hard(texts):
    joined = "".join(texts)
    assert any(len(word) > 100 for text in texts for word in text.split())
    for needle in ["\u0301", "\u200b", "\x00", "👍", "\u3000", "[CLS]", "日"]:
        assert needle in joined, needle


def test_single_strings_match(pair, texts):
    ours, hf = pair
    options = dict(return_offsets_mapping=True, return_special_tokens_mask=True)
    assert_same(ours(texts, **options), hf(texts, **options), texts)
    for text in texts[:200]:  # one string at a time: lists, not lists of lists
        assert_same(ours(text, **options), hf(text, **options), text)
    batch = texts[:800]
    assert_same(ours(batch, add_special_tokens=False), hf(batch, add_special_tokens=False), batch)


def test_tokenize_encode_ids_and_decode_match(pair, texts):
    ours, hf = pair
    assert [ours.tokenize(t) for t in texts[:300]] == [hf.tokenize(t) for t in texts[:300]]
    assert ours.encode_ids(texts[800:]) == hf(texts[800:], add_special_tokens=False)["input_ids"]
    batch = hf(texts[:250])["input_ids"]
    for ids in batch:
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False)
    assert ours.decode(batch[:5]) == hf.decode(batch[:5], skip_special_tokens=True)
    assert ours.decode(torch.tensor(batch[1])) == hf.decode(batch[1], skip_special_tokens=True)


# ---------------------------------------------------------------------------------------------- training


def test_train_gives_bert_special_tokens_first(trained):
    assert [trained.convert_ids_to_tokens(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (trained.pad_token_id, trained.unk_token_id, trained.cls_token_id, trained.sep_token_id,
            trained.mask_token_id) == (0, 1, 2, 3, 4)
    assert 100 < trained.vocab_size <= 600
    assert any(token.startswith("##") for token in trained.get_vocab())
    assert trained.do_lower_case and trained.model_max_length == 512
    encoded = trained("Kato rimé [MASK] 東京")
    assert encoded["input_ids"][0] == 2 and encoded["input_ids"][-1] == 3 and 4 in encoded["input_ids"]


def test_cased_training_round_trips(corpus, texts, tmp_path):
    cased = Tokenizer.train(iter(corpus[:500]), vocab_size=300, lowercase=False, strip_accents=True,
                            show_progress=False)
    assert not cased.do_lower_case
    cased.save_pretrained(tmp_path)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    batch = corpus[:300] + texts[:300]
    assert_same(cased(batch), hf(batch), batch)
    assert cased.tokenize("The")[0].startswith("T") and cased.tokenize("mé") == cased.tokenize("me")


# ---------------------------------------------------------------------------------------------- behaviour


def test_pickling_and_threads(ours_json, texts):
    clone = pickle.loads(pickle.dumps(ours_json))
    assert clone(texts[:200]) == ours_json(texts[:200])

    settings = [dict(truncation=True, max_length=8), dict(padding=True), dict(), dict(padding="max_length",
                                                                                   max_length=64, truncation=True)]
    expected = [ours_json(texts[:50], **s) for s in settings]
    errors: list[str] = []

    def worker(index: int) -> None:
        for _ in range(15):
            if ours_json(texts[:50], **settings[index]) != expected[index]:
                errors.append(f"settings {settings[index]} gave a different result under concurrency")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(settings))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    assert ours_json.encode_ids(["hello world"]) == [[7592, 2088]]


# ---------------------------------------------------------------------------------------------- errors


def test_empty_training_input(tmp_path):
    with pytest.raises(BertforgeError, match="no text to train on"):
        Tokenizer.train(iter([]), vocab_size=100, show_progress=False)
    with pytest.raises(BertforgeError, match="no text to train on"):
        Tokenizer.train(iter(["", "   ", "\n\t"]), vocab_size=100, show_progress=False)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(BertforgeError, match=r"empty\.txt: no text to train on"):
        Tokenizer.train([empty], vocab_size=100, show_progress=False)
    with pytest.raises(BertforgeError, match="no training files given"):
        Tokenizer.train([], vocab_size=100, show_progress=False)
    with pytest.raises(BertforgeError, match=r"missing\.txt: training file does not exist"):
        Tokenizer.train([tmp_path / "missing.txt"], vocab_size=100, show_progress=False)
    broken = tmp_path / "broken.txt.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(BertforgeError, match=r"broken\.txt\.gz: cannot read the training text"):
        Tokenizer.train([broken], vocab_size=100, show_progress=False)
    with pytest.raises(BertforgeError, match="vocab_size"):
        Tokenizer.train(iter(["some text"]), vocab_size=5, show_progress=False)


# ---------------------------------------------------------------------------------------------- slow fuzz


@pytest.mark.slow
def test_fuzz_100k_strings_against_transformers(ours_json, hf_json, ours_vocab, hf_vocab):
    started, compared, chunk = time.perf_counter(), 0, 5000
    for seed in range(20):
        batch = hard_strings(chunk, seed=10_000 + seed)
        pairs = batch[::-1]
        options = dict(return_offsets_mapping=True, return_special_tokens_mask=True)
        for ours, hf in ((ours_json, hf_json), (ours_vocab, hf_vocab)):
            assert_same(ours(batch, **options), hf(batch, **options), batch)
        assert_same(ours_json(batch, pairs, truncation=True, max_length=64, padding=True),
                    hf_json(batch, pairs, truncation=True, max_length=64, padding=True), batch)
        words = word_lists(chunk // 5, seed=20_000 + seed)
        mine = ours_json(words, is_split_into_words=True, return_word_ids=True, return_offsets_mapping=True)
        theirs = hf_json(words, is_split_into_words=True, return_offsets_mapping=True)
        assert mine.pop("word_ids") == [theirs.word_ids(i) for i in range(len(words))]
        assert_same(mine, theirs, words)
        compared += len(batch)
    seconds = time.perf_counter() - started
    print(f"\nfuzz: compared {compared} strings (tokenizer.json and vocab.txt loaders; truncated pairs) "
          f"and {compared // 5} word lists with transformers in {seconds:.1f}s: identical")
    assert compared >= 100_000
