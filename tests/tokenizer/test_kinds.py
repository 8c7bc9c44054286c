"""Tests of `bertforge.tokenizer.kinds`: the tokenizer kinds against `transformers` on the same saved files.

The kinds beside BERT's: RoBERTa and ModernBERT (byte-level BPE), ALBERT and XLM-RoBERTa (Unigram), DistilBERT
(WordPiece under its own class), MPNet (WordPiece under RoBERTa's template), EuroBERT (byte-level BPE under
Llama 3's special tokens), mmBERT (byte-fallback BPE), against `transformers` on the same saved files, both ways; and the registry of kinds.

The `tokenizers` trainers are not reproducible run to run, so nothing here expects a fixed vocabulary: each test
compares bertforge with `transformers` loading the very files bertforge wrote (or the other way round).
"""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import pytest
import transformers
from transformers import AutoTokenizer

from bertforge.core.errors import BertforgeError
from bertforge.tokenizer import (ALBERT, BERT, DEBERTA, DISTILBERT, EUROBERT, KINDS, MMBERT, MODERNBERT, MPNET, ROBERTA,
                                 XLM_ROBERTA,
                                 Tokenizer, kind_by_name)
from tests.tokenizer.tokenizer_helpers import TRUNCATIONS, assert_same, hard_strings, training_corpus

NEW_KINDS = [ROBERTA, ALBERT, XLM_ROBERTA, DISTILBERT, MODERNBERT, DEBERTA, MPNET, EUROBERT, MMBERT]
FILES = {
    "roberta": ["merges.txt", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.json"],
    "albert": ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"],
    "xlm-roberta": ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"],
    "distilbert": ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"],
    "modernbert": ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"],
    "deberta-v2": ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"],
    "mpnet": ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"],
    "eurobert": ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"],
    "mmbert": ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"],
}
HF_CLASS = {"roberta": "RobertaTokenizer", "albert": "AlbertTokenizer", "xlm-roberta": "XLMRobertaTokenizer",
            "distilbert": "DistilBertTokenizer", "modernbert": "PreTrainedTokenizerFast",
            "deberta-v2": "DebertaV2Tokenizer", "mpnet": "MPNetTokenizer", "eurobert": "PreTrainedTokenizerFast",
            "mmbert": "PreTrainedTokenizerFast"}
OPTIONS = dict(return_offsets_mapping=True, return_special_tokens_mask=True)


def hf_call(hf, *args, **kwargs):
    """transformers' encoding with token_type_ids (RoBERTa's and ALBERT's classes leave them out by default)."""
    return hf(*args, return_token_type_ids=True, **kwargs)


def mask_texts(mask: str) -> list[str]:
    """Text around the mask token: spaces before and after it, none, several, at the edges, twice."""
    return [f"Hello {mask}!", f"Hello{mask}!", f"Hello   {mask} world", f"{mask}", f" {mask} ", f"{mask}{mask}",
            f"kato {mask}. rimé {mask}", f"Ça {mask} été", f"{mask.lower()} {mask.upper()}"]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return training_corpus(1500, seed=11)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return hard_strings(800, seed=99)


@pytest.fixture(scope="module", params=NEW_KINDS, ids=lambda kind: kind.name)
def saved(request, corpus, tmp_path_factory) -> tuple[Tokenizer, Path, object]:
    """(a tokenizer of the kind trained on `corpus`, the directory it was saved to, transformers' load of it)."""
    kind = request.param
    tok = Tokenizer.train(iter(corpus), vocab_size=700, kind=kind, show_progress=False)
    directory = tmp_path_factory.mktemp(kind.name)
    tok.save_pretrained(directory)
    return tok, directory, AutoTokenizer.from_pretrained(directory)


# ---------------------------------------------------------------------------------------------- the saved files


def test_saved_files_load_as_the_right_class_and_kind(saved):
    tok, directory, hf = saved
    kind = tok.kind
    assert sorted(p.name for p in directory.iterdir()) == FILES[kind.name]
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == kind.tokenizer_class == HF_CLASS[kind.name]
    if kind in (MODERNBERT, EUROBERT, MMBERT):  # transformers 5 names its generic fast tokenizer TokenizersBackend
        assert isinstance(hf, transformers.PreTrainedTokenizerFast)
    else:
        assert type(hf).__name__ == HF_CLASS[kind.name]
    assert isinstance(tok.backend.model, kind.model_type)
    reloaded = Tokenizer.from_pretrained(directory)
    assert reloaded.kind is kind
    assert reloaded.get_vocab() == tok.get_vocab() == hf.get_vocab()
    assert reloaded.special_tokens == tok.special_tokens
    for role in ("pad", "unk", "cls", "sep", "mask", "bos", "eos"):
        assert getattr(tok, f"{role}_token") == getattr(hf, f"{role}_token"), role
        assert getattr(tok, f"{role}_token_id") == getattr(hf, f"{role}_token_id"), role
    assert sorted(tok.all_special_ids) == sorted(hf.all_special_ids)


def test_special_tokens_come_first_in_the_kinds_order(saved):
    tok = saved[0]
    first = [tok.convert_ids_to_tokens(i) for i in range(5)]
    assert first == {"roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                     "xlm-roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                     "albert": ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"],
                     "distilbert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                     "modernbert": ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"],
                     "deberta-v2": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                     "mpnet": ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"],
                     "eurobert": ["<|begin_of_text|>", "<|end_of_text|>", "<|mask|>", "!", "\""],
                     "mmbert": ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]}[tok.kind.name]
    if tok.kind is ROBERTA:
        assert tok.pad_token_id == 1 and tok.vocab_size > 261  # roberta-base's padding id; 256 bytes + 5 specials
        assert all(tok.backend.token_to_id(c) is not None for c in ("Ġ", "Ã", "©"))  # the byte alphabet


# ---------------------------------------------------------------------------------------------- parity


def test_singles_match(saved, corpus, texts):
    tok, _, hf = saved
    batch = corpus[:300] + texts + mask_texts(tok.mask_token) + ["", " ", "Ångström ﬁnance straße", "``quoted''"]
    assert_same(tok(batch, **OPTIONS), hf_call(hf, batch, **OPTIONS), batch)
    for text in batch[:50] + batch[-15:]:
        assert_same(tok(text), hf_call(hf, text), text)
        assert tok.tokenize(text) == hf.tokenize(text), text


@pytest.mark.parametrize("truncation", TRUNCATIONS)
def test_pairs_with_truncation_match(saved, corpus, texts, truncation):
    tok, _, hf = saved
    rng = random.Random(TRUNCATIONS.index(truncation))
    refused = 0
    pairs = list(zip(corpus[:60] + texts[:120], texts[120:240] + corpus[60:120]))
    if truncation == "longest_first" and tok.kind in (EUROBERT, MMBERT):  # transformers' side takes ~0.1 s a pair
        pairs = pairs[::3]  # here; the byte-level cases are ModernBERT's and RoBERTa's, run in full
    for first, second in pairs:
        options = dict(truncation=truncation, max_length=rng.choice([1, 3, 4, 5, 6, 8, 16, 32]), **OPTIONS)
        mine, theirs = outcome(tok, first, second, **options), outcome(hf_call, hf, first, second, **options)
        if theirs == "error":  # the backend refuses when the sequence to cut is too short: both must refuse
            assert mine == "error", (first, second, options)
            refused += 1
        else:
            assert_same(mine, theirs, (first, second, options))
    assert (refused > 0) == (truncation != "longest_first")


def test_batched_pairs_and_singles_with_truncation_and_padding_match(saved, corpus, texts):
    tok, _, hf = saved
    first, second = corpus[:200] + texts[:300], texts[300:500] + corpus[200:500]
    for options in (dict(truncation=True, max_length=24, padding=True),
                    dict(truncation="longest_first", max_length=30, padding="max_length", return_tensors="pt")):
        assert_same(tok(first, second, **options), hf_call(hf, first, second, **options), first)
        assert_same(tok(first, **options), hf_call(hf, first, **options), first)
    assert_same(tok(corpus[:100], max_length=7), hf_call(hf, corpus[:100], max_length=7), corpus[:100])


def outcome(call, *args, **kwargs):
    """call(...), or "error" when it raises: BertforgeError from ours, the backend's plain Exception from theirs."""
    try:
        return call(*args, **kwargs)
    except Exception as error:  # noqa: BLE001
        assert not isinstance(call, Tokenizer) or isinstance(error, BertforgeError), repr(error)
        return "error"


def test_pair_templates_and_token_types(saved):
    tok, _, hf = saved
    encoded = tok("kato rimé", "lu sa")
    ids, types = encoded["input_ids"], encoded["token_type_ids"]
    a, b = tok.encode_ids(["kato rimé", "lu sa"])
    cls, sep = tok.cls_token_id, tok.sep_token_id
    if tok.kind in (ROBERTA, XLM_ROBERTA, MPNET):  # <s> A </s></s> B </s>, one token type
        assert ids == [cls, *a, sep, sep, *b, sep] and set(types) == {0}
        assert tok.num_special_tokens_to_add(pair=True) == hf.num_special_tokens_to_add(pair=True) == 4
    else:  # [CLS] A [SEP] B [SEP], types 0 then 1 (EuroBERT: <|begin_of_text|> A <|end_of_text|> B ..., one type)
        second = 0 if tok.kind in (EUROBERT, MMBERT) else 1
        assert ids == [cls, *a, sep, *b, sep] and types == [0] * (len(a) + 2) + [second] * (len(b) + 1)
        assert tok.num_special_tokens_to_add(pair=True) == hf.num_special_tokens_to_add(pair=True) == 3
    assert tok.num_special_tokens_to_add() == hf.num_special_tokens_to_add() == 2
    assert tok.build_inputs(a, b) == (ids, types)
    assert tok.build_inputs(a) == (tok("kato rimé")["input_ids"], tok("kato rimé")["token_type_ids"])
    two_seps = tok.kind in (ROBERTA, XLM_ROBERTA, MPNET)
    assert tok.build_inputs([], [])[0] == ([cls, sep, sep, sep] if two_seps else [cls, sep, sep])


def test_mask_token_inside_text(saved):
    tok, _, hf = saved
    mask, unk = tok.mask_token_id, tok.unk_token_id
    for text in mask_texts(tok.mask_token):
        assert tok(text)["input_ids"] == hf_call(hf, text)["input_ids"], text
    hello = tok.encode_ids(["Hello"])[0]
    if tok.kind is ROBERTA:  # <mask> swallows the spaces before it, as in roberta-base: no "Ġ" token before it
        assert tok("Hello <mask>!")["input_ids"] == [tok.cls_token_id, *hello, mask, *tok.encode_ids(["!"])[0],
                                                     tok.sep_token_id]
        assert tok("Hello   <mask>")["input_ids"] == tok("Hello<mask>")["input_ids"]
    assert tok("Hello <mask>!".replace("<mask>", tok.mask_token))["input_ids"].count(mask) == 1
    if tok.kind is not EUROBERT:  # its unknown role names its end token (byte-level BPE has no unknown token)
        assert unk not in tok(f"kato {tok.mask_token}")["input_ids"]


def test_decode_matches(saved, corpus, texts):
    tok, _, hf = saved
    batch = corpus[:100] + texts[:300] + mask_texts(tok.mask_token)
    for ids in hf_call(hf, batch)["input_ids"]:
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
        assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids)
    if tok.kind is ROBERTA:  # byte-level BPE gives back the text itself
        for text in corpus[:100] + ["Ça été  naïve 東京 😀", " two  spaces "]:
            assert tok.decode(tok(text)["input_ids"]) == text


def test_cased_albert_matches(corpus, texts, tmp_path):
    tok = Tokenizer.train(iter(corpus[:600]), vocab_size=400, lowercase=False, kind="albert", show_progress=False)
    assert not tok.do_lower_case and not tok.normalization.strips_accents
    tok.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["do_lower_case"] is False and config["keep_accents"] is True
    hf = AutoTokenizer.from_pretrained(tmp_path)
    batch = corpus[:200] + texts[:300]
    assert_same(tok(batch), hf_call(hf, batch), batch)
    assert tok.tokenize("The")[0] == "▁T" or tok.tokenize("The")[0].startswith("▁")
    assert "é" in "".join(tok.tokenize("mé"))
    reloaded = Tokenizer.from_pretrained(tmp_path)
    assert not reloaded.do_lower_case and reloaded(batch) == tok(batch)


# ---------------------------------------------------------------------------------------------- the other way


def hf_built(tok: Tokenizer, directory: Path):
    """The `transformers` class of `tok`'s kind, built from its vocabulary (and merges), saved into `directory`."""
    data = json.loads(tok.backend.to_str())
    cls = getattr(transformers, HF_CLASS[tok.kind.name])
    if tok.kind is ROBERTA:
        built = cls(vocab=data["model"]["vocab"], merges=[tuple(m) for m in data["model"]["merges"]])
        built.add_special_tokens({"mask_token": transformers.AddedToken("<mask>", lstrip=True, special=True,
                                                                         normalized=False)})
    elif tok.kind in (DISTILBERT, MPNET):
        built = cls(vocab=data["model"]["vocab"])
    elif tok.kind in (MODERNBERT, EUROBERT, MMBERT):  # the generic class takes a whole `tokenizers` backend, as the Hub's files are
        import tokenizers

        built = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizers.Tokenizer.from_str(tok.backend.to_str()), **tok.kind.special_tokens)
    else:
        built = cls(vocab=[tuple(piece) for piece in data["model"]["vocab"]])
    built.save_pretrained(directory)
    return built


def test_a_tokenizer_saved_by_transformers_loads_with_the_right_kind(saved, corpus, texts, tmp_path):
    tok = saved[0]
    hf = hf_built(tok, tmp_path)
    ours = Tokenizer.from_pretrained(tmp_path)
    assert ours.kind is tok.kind
    batch = corpus[:200] + texts[:300] + mask_texts(tok.mask_token)
    assert_same(ours(batch, **OPTIONS), hf_call(hf, batch, **OPTIONS), batch)
    assert_same(ours(batch, batch[::-1], truncation=True, max_length=20),
                hf_call(hf, batch, batch[::-1], truncation=True, max_length=20), batch)
    assert ours(batch)["input_ids"] == tok(batch)["input_ids"]
    # without tokenizer_config.json the model in tokenizer.json decides (DistilBERT's is BERT's WordPiece)
    (tmp_path / "tokenizer_config.json").unlink()
    bare = Tokenizer.from_pretrained(tmp_path)
    assert bare.kind is (BERT if tok.kind is DISTILBERT else tok.kind)
    assert bare(batch)["input_ids"] == tok(batch)["input_ids"]


def test_roberta_loads_from_vocab_json_and_merges_alone(corpus, texts, tmp_path):
    tok = Tokenizer.train(iter(corpus), vocab_size=500, kind=ROBERTA, show_progress=False)
    tok.save_pretrained(tmp_path / "full")
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        (plain / name).write_bytes((tmp_path / "full" / name).read_bytes())
    assert (plain / "merges.txt").read_text(encoding="utf-8").startswith("#version: 0.2\n")
    hf, ours = AutoTokenizer.from_pretrained(plain), Tokenizer.from_pretrained(plain)
    batch = corpus[:200] + texts[:300] + mask_texts("<mask>")
    assert ours.kind is ROBERTA
    assert_same(ours(batch, **OPTIONS), hf_call(hf, batch, **OPTIONS), batch)
    assert ours(batch, **OPTIONS) == tok(batch, **OPTIONS)
    (plain / "tokenizer_config.json").unlink()  # the files alone say BPE
    assert Tokenizer.from_pretrained(plain).kind is ROBERTA


def test_pickled_tokenizers_encode_alike(saved, texts):
    tok = saved[0]
    copy = pickle.loads(pickle.dumps(tok))
    assert copy(texts[:200]) == tok(texts[:200]) and copy.kind.name == tok.kind.name


# ---------------------------------------------------------------------------------------------- the registry


def test_kind_by_name_and_the_registry():
    names = ("bert", "distilbert", "roberta", "albert", "xlm-roberta", "modernbert", "deberta-v2", "mpnet", "eurobert",
             "mmbert")
    assert {name: kind_by_name(name) for name in names} == KINDS
    assert kind_by_name("deberta-v3") is kind_by_name("DeBERTa") is DEBERTA
    assert kind_by_name("wordpiece") is BERT and kind_by_name("bpe") is ROBERTA and kind_by_name("unigram") is ALBERT
    assert kind_by_name("XLM_RoBERTa") is XLM_ROBERTA
    assert [kind.model_name for kind in (BERT, ROBERTA, ALBERT)] == ["wordpiece", "bpe", "unigram"]
    with pytest.raises(BertforgeError, match="unknown tokenizer kind 'gpt2': expected one of bert, distilbert"):
        kind_by_name("gpt2")
    assert [str(p) for p in ROBERTA.pieces(pair=True)] == [
        "TemplatePiece(piece='cls_token', type_id=0)", "TemplatePiece(piece='A', type_id=0)",
        "TemplatePiece(piece='sep_token', type_id=0)", "TemplatePiece(piece='sep_token', type_id=0)",
        "TemplatePiece(piece='B', type_id=0)", "TemplatePiece(piece='sep_token', type_id=0)"]
    assert [p.type_id for p in BERT.pieces(pair=True)] == [0, 0, 0, 1, 1]


def test_bert_keeps_its_roles_and_ids(corpus):
    tok = Tokenizer.train(iter(corpus[:300]), vocab_size=200, show_progress=False)
    assert tok.kind is BERT and tok.bos_token is None and tok.bos_token_id is None and tok.eos_token_id is None
    assert tok.all_special_ids == [0, 1, 2, 3, 4]
    assert tok.build_inputs([7], [8]) == ([2, 7, 3, 8, 3], [0, 0, 0, 1, 1])


def test_continuation_mask(saved):
    tok = saved[0]
    flags = tok.continuation_mask()
    assert len(flags) == tok.vocab_size and not any(flags[i] for i in tok.all_special_ids)
    marker = {"roberta": "Ġ", "modernbert": "Ġ", "eurobert": "Ġ", "mmbert": "▁", "albert": "▁", "xlm-roberta": "▁", "deberta-v2": "▁"}.get(tok.kind.name)
    for i, flag in enumerate(flags):
        token = tok.convert_ids_to_tokens(i)
        if i not in tok.all_special_ids:
            assert flag == (token.startswith("##") if marker is None else not token.startswith(marker)), token


# ---------------------------------------------------------------------------------------------- bad input


def test_an_unsupported_model_is_named_with_the_supported_ones(tmp_path):
    word_level = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None,
                  "post_processor": None, "decoder": None, "truncation": None, "padding": None,
                  "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(word_level))
    with pytest.raises(BertforgeError) as error:
        Tokenizer.from_pretrained(tmp_path)
    message = str(error.value)
    assert "\n" not in message and "tokenizer.json: model WordLevel is not a supported tokenizer model" in message
    assert "WordPiece (BERT, DistilBERT, MPNet)" in message and "BPE (RoBERTa, ModernBERT, EuroBERT, mmBERT)" in message
    assert "Unigram (ALBERT, XLM-RoBERTa, DeBERTa)" in message


def test_bad_training_and_loading_arguments(tmp_path, corpus):
    with pytest.raises(BertforgeError, match="a RoBERTa tokenizer .bpe. keeps case and accents"):
        Tokenizer.train(iter(corpus[:50]), vocab_size=400, lowercase=True, kind="roberta", show_progress=False)
    with pytest.raises(BertforgeError, match="vocab_size=200 leaves no room beside the 5 special tokens and the 256"):
        Tokenizer.train(iter(corpus[:50]), vocab_size=200, kind=ROBERTA, show_progress=False)
    for kind in ("bpe", "unigram"):
        with pytest.raises(BertforgeError, match="no text to train on"):
            Tokenizer.train(iter(["", "  "]), vocab_size=400, kind=kind, show_progress=False)
    with pytest.raises(BertforgeError, match="holds no tokenizer.json .an ALBERT tokenizer is read from"):
        Tokenizer.from_pretrained(tmp_path, kind="albert")
    with pytest.raises(BertforgeError, match="neither tokenizer.json nor vocab.json \\+ merges.txt"):
        Tokenizer.from_pretrained(tmp_path, kind=ROBERTA)
    (tmp_path / "vocab.json").write_text(json.dumps({"<s>": 0, "a": 1}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b c\n")
    with pytest.raises(BertforgeError, match=r"merges\.txt: line 2 is not two tokens"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "merges.txt").write_text("x y\n")
    with pytest.raises(BertforgeError, match=r"merges\.txt: the merges do not fit vocab\.json"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "vocab.json").write_text(json.dumps({"<s>": 0, "a": 5}))
    with pytest.raises(BertforgeError, match=r"vocab\.json: vocabulary id 5 of token 'a' is outside 0..1"):
        Tokenizer.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------- slow fuzz


@pytest.mark.slow
def test_fuzz_20k_strings_per_kind_against_transformers(saved):
    tok, _, hf = saved
    for seed in range(4):
        batch = hard_strings(5000, seed=1000 + seed)
        assert_same(tok(batch, **OPTIONS), hf_call(hf, batch, **OPTIONS), batch)
        pairs = dict(truncation=True, max_length=64, padding=True)
        assert_same(tok(batch, batch[::-1], **pairs), hf_call(hf, batch, batch[::-1], **pairs), batch)
        for ids in hf_call(hf, batch[:1000])["input_ids"]:
            assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
