"""Tests of `bertforge.data.instance_stream`: the window of documents NotNext draws from, epochs, seeds and ranks."""

import pytest
from tests.data.data_helpers import CLS, SEP, WordVocab, at_least_half, make_stream, split_pair, tagged_docs, take, write_txt

from bertforge.data import CorpusReader
from bertforge.data.instance_stream import Buffers, InstanceStream
from bertforge.data.instances import IS_NEXT, NOT_NEXT
from bertforge.core.errors import BertforgeError


def test_not_next_never_same_document_in_tiny_corpus_over_epochs(tmp_path):
    docs = tagged_docs(3, seed=7, sentences=(1, 3))
    vocab = WordVocab(docs)
    stream = make_stream(write_txt(tmp_path / "c.txt", docs), vocab, max_seq_length=16, buffers=Buffers(shuffle=5))
    not_next = 0
    for inst in take(stream, 400):
        a, b = split_pair(inst)
        same = vocab.tag(a[0])[0] == vocab.tag(b[0])[0]
        assert same == (inst.next_sentence_label == IS_NEXT)
        not_next += inst.next_sentence_label == NOT_NEXT
    # n = 400, sigma = sqrt(400 / 4) = 10: NotNext >= 200 - 4 x 10 = 160 (measured 281)
    assert stream.epoch >= 10 and at_least_half(not_next, 400)
    assert len(stream.instances.window) <= 3


def test_single_document_with_nsp_is_an_error(tmp_path):
    docs = tagged_docs(1, seed=3, sentences=(5, 5))
    vocab = WordVocab(docs)
    path = write_txt(tmp_path / "one.txt", docs)
    with pytest.raises(BertforgeError, match="only 1 document.*next-sentence prediction"):
        next(make_stream(path, vocab))
    batch = next(make_stream(path, vocab, sentence_objective=None, max_seq_length=8, batch_size=4))
    assert "next_sentence_label" not in batch
    two = write_txt(tmp_path / "two.txt", tagged_docs(2, seed=3))
    with pytest.raises(BertforgeError, match="rank 1 of 2"):
        next(make_stream(two, WordVocab(tagged_docs(2, seed=3)), rank=1, world_size=2))


def test_epochs_and_seeds_change_the_data(tagged_corpus):
    path, docs, vocab = tagged_corpus

    def instances(seed, max_epochs):
        reader = CorpusReader(path)
        stream = InstanceStream(
            reader,
            vocab.tokenize,
            cls_id=CLS,
            sep_id=SEP,
            max_seq_length=24,
            seed=seed,
            buffers=Buffers(shuffle=0),
            max_epochs=max_epochs,
        )
        return [tuple(i.input_ids) for i in stream]

    one, two = instances(0, 1), instances(0, 2)
    assert two[: len(one)] == one
    assert sorted(two[len(one) :]) != sorted(one)  # epoch 1 makes different pairs than epoch 0
    assert instances(1, 1) != one
    assert instances(0, 1) == one


def test_seed_and_rank_make_different_batches(tagged_corpus):
    path, docs, vocab = tagged_corpus
    a = next(make_stream(path, vocab, seed=0))["input_ids"]
    b = next(make_stream(path, vocab, seed=0))["input_ids"]
    c = next(make_stream(path, vocab, seed=1))["input_ids"]
    assert a.equal(b) and not a.equal(c)
    ranks = [take(make_stream(path, vocab, rank=r, world_size=2, buffers=Buffers(shuffle=20)), 150) for r in range(2)]
    doc_sets = [{vocab.tag(split_pair(i)[0][0])[0] for i in insts} for insts in ranks]
    assert doc_sets[0] and doc_sets[1] and not doc_sets[0] & doc_sets[1]
    assert doc_sets[0] | doc_sets[1] == set(range(40))


def test_not_next_excludes_later_epoch_copy_of_the_same_document(tmp_path):
    """With two documents the window briefly holds the next epoch's copy of the current document: it must never
    be used as the "random other document"."""
    docs = tagged_docs(2, seed=11, sentences=(12, 12), words=(2, 3))
    vocab = WordVocab(docs)
    path = write_txt(tmp_path / "two.txt", docs)
    not_next = 0
    for seed in range(15):
        stream = make_stream(path, vocab, max_seq_length=8, short_seq_prob=0.0, buffers=Buffers(shuffle=0), seed=seed)
        for inst in take(stream, 40):
            a, b = split_pair(inst)
            assert (vocab.tag(a[0])[0] == vocab.tag(b[0])[0]) == (inst.next_sentence_label == IS_NEXT)
            not_next += inst.next_sentence_label == NOT_NEXT
    # n = 15 x 40 = 600, sigma = sqrt(600 / 4) = 12.2: NotNext >= 300 - 4 x 12.2 = 251 (measured 328)
    assert at_least_half(not_next, 600)


def test_buffers_bound_the_window_and_are_checked(tagged_corpus):
    path, docs, vocab = tagged_corpus
    assert Buffers() == Buffers(shuffle=10000, documents=1000, document_tokens=4_000_000)
    # the window is filled up to its bound (2 documents at least), then the current document leaves it
    for buffers, held in ((Buffers(), 39), (Buffers(documents=4), 3), (Buffers(document_tokens=1), 1)):
        stream = make_stream(path, vocab, buffers=buffers).instances
        sizes = {len(stream.window) for _ in range(100) if next(stream)}
        assert sizes == {held}
    with pytest.raises(BertforgeError, match=r"buffers.shuffle must be >= 0 instances \(got -1\)"):
        make_stream(path, vocab, buffers=Buffers(shuffle=-1))
    with pytest.raises(BertforgeError, match=r"buffers.documents must be at least 2 with NSP \(got 1\)"):
        make_stream(path, vocab, buffers=Buffers(documents=1))
    assert make_stream(path, vocab, buffers=Buffers(documents=1), sentence_objective=None)  # no window without NSP
