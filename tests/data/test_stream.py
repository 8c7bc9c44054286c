"""Tests of `bertforge.data.stream`: `PretrainingStream`'s batches, exact resume and constant memory."""

import gzip
import json
import os
import time

import pytest
import torch
from tests.data.data_helpers import WordVocab, tagged_docs, write_gz, write_jsonl, write_txt

from bertforge.data import DEFAULT_CORPUS, Buffers, PretrainingStream, iter_documents
from bertforge.core.errors import BertforgeError

KEYS_NSP = ["input_ids", "token_type_ids", "attention_mask", "next_sentence_label", "labels"]


def make_stream(path, vocab, **kw):
    return PretrainingStream(path, vocab.tokenize, **vocab.special_kwargs(), **kw)


@pytest.fixture
def mixed_corpus(tmp_path):
    docs = tagged_docs(30, seed=2, sentences=(1, 10))
    write_txt(tmp_path / "c" / "a.txt", docs[:10])
    write_gz(tmp_path / "c" / "b.txt.gz", docs[10:20])
    write_jsonl(tmp_path / "c" / "sub" / "c.jsonl", docs[20:])
    return tmp_path / "c", WordVocab(docs)


def test_batch_format(mixed_corpus):
    path, vocab = mixed_corpus
    batch = next(make_stream(path, vocab, batch_size=8, max_seq_length=32))
    assert sorted(batch) == sorted(KEYS_NSP)
    assert batch["input_ids"].shape[0] == 8 and batch["input_ids"].shape[1] <= 32
    assert all(t.dtype == torch.long for t in batch.values())
    assert batch["next_sentence_label"].shape == (8,)
    assert set(batch["next_sentence_label"].tolist()) <= {0, 1}
    no_nsp = next(make_stream(path, vocab, batch_size=8, max_seq_length=32, sentence_objective=None))
    assert "next_sentence_label" not in no_nsp and no_nsp["input_ids"].shape == (8, 32)
    assert no_nsp["token_type_ids"].sum() == 0 and no_nsp["attention_mask"].all()
    sop = next(make_stream(path, vocab, batch_size=8, max_seq_length=32, sentence_objective="sop", masking="ngram"))
    assert sorted(sop) == sorted(KEYS_NSP)  # the SOP label goes where the NSP label goes
    assert set(sop["next_sentence_label"].tolist()) <= {0, 1} and sop["token_type_ids"].any()


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"sentence_objective": None},
        {"whole_word_mask": True, "buffers": Buffers(shuffle=7, documents=3)},
        {"rank": 1, "world_size": 2, "short_seq_prob": 0.5, "shard_by": "file"},
        {"sentence_objective": "sop", "masking": "ngram"},
        {"sentence_objective": "sop", "masking": "ngram", "whole_word_mask": True, "rank": 1, "world_size": 2},
        {"sentence_objective": None, "masking": "ngram", "max_ngram": 4, "words": True},
    ],
    ids=["nsp", "no-nsp", "wwm-small-buffers", "rank1-files", "sop-ngram", "sop-ngram-words-rank1", "mlm-ngram"],
)
def test_exact_resume(mixed_corpus, options):
    path, vocab = mixed_corpus
    kw = {"batch_size": 6, "max_seq_length": 24, "buffers": Buffers(shuffle=40), "seed": 3, **options}
    if kw.pop("words", False) or options.get("whole_word_mask"):
        kw["is_continuation"] = [w.endswith("w1") for w in vocab.words]  # pretend "...w1" words are pieces
    stream = make_stream(path, vocab, **kw)
    for _ in range(37):  # several epochs of this small corpus
        next(stream)
    state = json.loads(json.dumps(stream.state_dict()))  # must survive JSON
    expected = [next(stream) for _ in range(40)]
    assert stream.stats["epoch"] >= 2
    resumed = make_stream(path, vocab, **kw)
    resumed.load_state_dict(state)
    for want in expected:
        got = next(resumed)
        assert sorted(got) == sorted(want)
        for key in want:
            assert torch.equal(got[key], want[key]), key
    assert resumed.stats == stream.stats


def test_resume_at_start_and_config_mismatch(mixed_corpus):
    path, vocab = mixed_corpus
    fresh = make_stream(path, vocab, batch_size=4)
    state = fresh.state_dict()
    want = next(fresh)
    again = make_stream(path, vocab, batch_size=4)
    again.load_state_dict(state)
    assert torch.equal(next(again)["input_ids"], want["input_ids"])
    with pytest.raises(BertforgeError, match="max_seq_length=128 but this run has max_seq_length=64"):
        make_stream(path, vocab, batch_size=4, max_seq_length=64).load_state_dict(state)
    with pytest.raises(BertforgeError, match="nsp"):
        make_stream(path, vocab, batch_size=4, sentence_objective=None).load_state_dict(state)
    with pytest.raises(BertforgeError, match="masking='token' but this run has masking='ngram'"):
        make_stream(path, vocab, batch_size=4, masking="ngram").load_state_dict(state)
    sop = make_stream(path, vocab, batch_size=4, sentence_objective="sop")
    with pytest.raises(BertforgeError, match="sentence_objective='sop' but this run has sentence_objective=None"):
        make_stream(path, vocab, batch_size=4, sentence_objective=None).load_state_dict(sop.state_dict())
    ngram = make_stream(path, vocab, batch_size=4, masking="ngram").state_dict()
    with pytest.raises(BertforgeError, match="max_ngram=3 but this run has max_ngram=2"):
        make_stream(path, vocab, batch_size=4, masking="ngram", max_ngram=2).load_state_dict(ngram)


def test_resume_from_a_state_written_before_sop_and_ngram(mixed_corpus):
    """A data state from before SOP and n-gram masking has only nsp and whole_word_mask in its config."""
    path, vocab = mixed_corpus
    for kw in ({}, {"sentence_objective": None}):
        stream = make_stream(path, vocab, batch_size=4, **kw)
        next(stream)
        state = stream.state_dict()
        for key in ("sentence_objective", "masking", "max_ngram", "mask_units"):
            del state["config"][key]
        want = next(stream)
        again = make_stream(path, vocab, batch_size=4, **kw)
        again.load_state_dict(state)
        assert torch.equal(next(again)["input_ids"], want["input_ids"])
        with pytest.raises(BertforgeError, match="masking='token' but this run has masking='ngram'"):
            make_stream(path, vocab, batch_size=4, masking="ngram", **kw).load_state_dict(state)
    with pytest.raises(BertforgeError, match="sentence_objective=None but this run has sentence_objective='sop'"):
        make_stream(path, vocab, batch_size=4, sentence_objective="sop").load_state_dict(state)


def test_stats_count_epochs_docs_and_replaced_bytes(tmp_path):
    docs = tagged_docs(5, seed=1)
    vocab = WordVocab(docs)
    path = tmp_path / "c.txt"
    path.write_bytes(write_txt(tmp_path / "x.txt", docs).read_bytes() + b"\n\nbroken \xc3( bytes\n")
    stream = make_stream(path, vocab, batch_size=4, max_seq_length=16, buffers=Buffers(shuffle=4))
    for _ in range(30):
        next(stream)
    stats = stream.stats
    assert stats["docs_per_epoch"] == 6 and stats["epoch"] >= 2
    assert stats["bytes_replaced"] == stats["docs_read"] // 6 > 0  # one bad byte in the 6th document
    assert stats["batches"] == 30


def test_empty_and_missing_corpus_errors(tmp_path):
    vocab = WordVocab([])
    with pytest.raises(BertforgeError, match="does not exist"):
        make_stream(tmp_path / "missing", vocab)
    (tmp_path / "blank.txt").write_text("\n \n\n")
    for objective in ("nsp", None):
        with pytest.raises(BertforgeError, match="has no text"):
            next(make_stream(tmp_path / "blank.txt", vocab, sentence_objective=objective))


def test_default_corpus_with_a_real_wordpiece_tokenizer():
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(iter_documents(DEFAULT_CORPUS), vocab_size=3000, show_progress=False)
    vocab = tok.get_vocab()
    inverse = {i: w for w, i in vocab.items()}
    size = tok.get_vocab_size()

    def tokenize(sentences):
        return [e.ids for e in tok.encode_batch(sentences, add_special_tokens=False)]

    stream = PretrainingStream(
        None,
        tokenize,
        cls_id=vocab["[CLS]"],
        sep_id=vocab["[SEP]"],
        pad_id=vocab["[PAD]"],
        mask_id=vocab["[MASK]"],
        vocab_size=size,
        is_continuation=[inverse[i].startswith("##") for i in range(size)],
        whole_word_mask=True,
        batch_size=16,
        buffers=Buffers(shuffle=200),
    )
    batch = next(stream)
    assert batch["input_ids"].shape[0] == 16 and batch["input_ids"].shape[1] <= 128
    assert (batch["labels"] != -100).any()
    assert stream.stats["docs_per_epoch"] is None or stream.stats["docs_per_epoch"] >= 20


def _write_big_corpus(path, megabytes):
    sentence = " ".join(f"w{i}" for i in range(12))
    doc = "\n".join([sentence] * 8) + "\n\n"
    block = (doc * 200).encode()
    with open(path, "wb") as fh:
        for _ in range(megabytes * 1024 * 1024 // len(block) + 1):
            fh.write(block)
    return WordVocab([[sentence]])


def test_first_batch_arrives_without_reading_the_whole_file(tmp_path):
    path = tmp_path / "big.txt"
    vocab = _write_big_corpus(path, 60)
    size = os.path.getsize(path)
    start = time.perf_counter()
    stream = make_stream(path, vocab, batch_size=32, buffers=Buffers(shuffle=500, documents=100))
    next(stream)
    assert time.perf_counter() - start < 10
    assert stream.stats["bytes_read"] < size / 20


def _rss_mb():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.slow
def test_memory_stays_constant_over_a_full_pass(tmp_path):
    path = tmp_path / "big.txt.gz"
    sentence = " ".join(f"w{i}" for i in range(12))
    with gzip.open(path, "wb", compresslevel=1) as fh:
        block = (("\n".join([sentence] * 8) + "\n\n") * 200).encode()
        for _ in range(60 * 1024 * 1024 // len(block)):
            fh.write(block)
    vocab = WordVocab([[sentence]])
    stream = make_stream(path, vocab, batch_size=64, buffers=Buffers(shuffle=2000, documents=200),
                         sentence_objective=None)
    next(stream)
    base = _rss_mb()
    peak = base
    while stream.stats["epoch"] < 1:
        for _ in range(200):
            next(stream)
        peak = max(peak, _rss_mb())
    assert peak - base < 100, f"RSS grew by {peak - base:.0f} MB over a 60 MB corpus"


def test_resume_refuses_a_changed_corpus_but_not_a_moved_one(tmp_path):
    docs = tagged_docs(8, seed=4)
    vocab = WordVocab(docs)
    write_txt(tmp_path / "a" / "c.txt", docs)
    stream = make_stream(tmp_path / "a", vocab, batch_size=4, max_seq_length=16, buffers=Buffers(shuffle=8))
    next(stream)
    state = stream.state_dict()
    want = next(stream)
    (tmp_path / "a").rename(tmp_path / "b")
    moved = make_stream(tmp_path / "b", vocab, batch_size=4, max_seq_length=16, buffers=Buffers(shuffle=8))
    moved.load_state_dict(state)
    assert torch.equal(next(moved)["input_ids"], want["input_ids"])
    write_txt(tmp_path / "b" / "c.txt", docs[:-1])
    with pytest.raises(BertforgeError, match="corpus differs from the checkpoint"):
        make_stream(tmp_path / "b", vocab, batch_size=4, max_seq_length=16).load_state_dict(state)


def test_a_corpus_smaller_than_one_batch_is_warned_about_loudly_once(tmp_path, caplog):
    """Two short documents make a handful of sequences an epoch: with a batch of 64 every batch repeats them. The
    stream still serves batches (a tiny corpus can be useful) but says so once, with the real counts (#34); a
    corpus that fills a batch is not warned about."""
    docs = [["the dog barks", "the cat meows"], ["the cow moos", "the bird sings"]]
    path = write_txt(tmp_path / "small.txt", docs)
    stream = make_stream(path, WordVocab(docs), batch_size=64, max_seq_length=16, sentence_objective=None)
    with caplog.at_level("WARNING", logger="bertforge"):
        for _ in range(3):
            assert next(stream)["input_ids"].shape[0] == 64
    warnings = [r.getMessage() for r in caplog.records if "fewer than one batch" in r.getMessage()]
    made = stream.instances.epoch_yield
    assert len(warnings) == 1 and 0 < made < 64
    assert f"only {made} training sequence" in warnings[0] and "one batch of 64" in warnings[0]
    caplog.clear()
    big = tagged_docs(40, seed=3, sentences=(4, 10))
    stream = make_stream(write_txt(tmp_path / "big.txt", big), WordVocab(big), batch_size=8, max_seq_length=16,
                         sentence_objective=None)
    with caplog.at_level("WARNING", logger="bertforge"):
        for _ in range(3):
            next(stream)
    assert not [r for r in caplog.records if "fewer than one batch" in r.getMessage()]
