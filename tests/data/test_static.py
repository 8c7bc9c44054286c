"""Tests of `bertforge.data.static`: static (pre-masked) shards written and read back."""

import json

import numpy as np
import pytest
import torch
from tests.data.data_helpers import WordVocab, tagged_docs, write_txt
from safetensors.numpy import load_file

from bertforge.data import Buffers, PretrainingStream, StaticShardReader, write_static_shards
from bertforge.core.errors import BertforgeError


def make_stream(path, vocab, **kw):
    return PretrainingStream(path, vocab.tokenize, **vocab.special_kwargs(), **kw)


@pytest.fixture
def corpus(tmp_path):
    docs = tagged_docs(25, seed=6)
    return write_txt(tmp_path / "c.txt", docs), WordVocab(docs)


def test_write_static_shards_with_dupe_factor(tmp_path, corpus):
    path, vocab = corpus
    unshuffled = Buffers(shuffle=0)
    one = write_static_shards(make_stream(path, vocab, max_seq_length=32, buffers=unshuffled), tmp_path / "s1", 1, 50)
    index = write_static_shards(
        make_stream(path, vocab, max_seq_length=32, buffers=unshuffled), tmp_path / "s3", dupe_factor=3, shard_size=50
    )
    assert index["nsp"] and index["dupe_factor"] == 3
    on_disk = json.loads((tmp_path / "s3" / "index.json").read_text())
    assert on_disk["total"] == index["total"] == sum(s["count"] for s in index["shards"])
    assert abs(index["total"] - 3 * one["total"]) < one["total"] // 3  # each duplicate re-samples the pairs
    assert all(s["count"] == 50 for s in index["shards"][:-1]) and 0 < index["shards"][-1]["count"] <= 50
    arrays = load_file(str(tmp_path / "s3" / index["shards"][0]["file"]))  # safetensors: no pickle
    assert arrays["input_ids"].shape == (50, 32) and arrays["input_ids"].dtype == np.int32
    assert set(arrays) == {"input_ids", "token_type_ids", "labels", "lengths", "next_sentence_label"}
    masked = arrays["labels"] != -100
    assert masked.any() and (masked.sum(1) >= 1).all()
    with pytest.raises(BertforgeError, match="already holds static shards"):
        write_static_shards(make_stream(path, vocab), tmp_path / "s3", 1, 10)


def test_static_reader_batches_resume_and_ranks(tmp_path, corpus):
    path, vocab = corpus
    index = write_static_shards(make_stream(path, vocab, max_seq_length=32), tmp_path / "s", 2, 40)
    reader = StaticShardReader(tmp_path / "s", batch_size=16, seed=1)
    batch = next(reader)
    assert sorted(batch) == sorted(["input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label"])
    assert batch["input_ids"].shape[0] == 16
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape[1] == int(lengths.max())
    for _ in range(7):
        next(reader)  # crosses shards and wraps into epoch 1
    state = json.loads(json.dumps(reader.state_dict()))
    expected = [next(reader) for _ in range(10)]
    again = StaticShardReader(tmp_path / "s", batch_size=16, seed=1)
    again.load_state_dict(state)
    for want in expected:
        got = next(again)
        assert all(torch.equal(got[k], want[k]) for k in want)

    # ranks split the rows: one epoch over both ranks sees every row exactly once
    def rows(reader):
        out = []
        for b in reader:
            for ids, labels, n in zip(b["input_ids"], b["labels"], b["attention_mask"].sum(1), strict=False):
                out.append((tuple(ids[:n].tolist()), tuple(labels[:n].tolist())))
        return out

    everything = rows(StaticShardReader(tmp_path / "s", batch_size=1000, max_epochs=1, shuffle=False))
    assert len(everything) == index["total"]
    per_rank = [rows(StaticShardReader(tmp_path / "s", 7, seed=1, rank=r, world_size=2, max_epochs=1)) for r in (0, 1)]
    assert abs(len(per_rank[0]) - len(per_rank[1])) <= len(index["shards"])
    assert sorted(per_rank[0] + per_rank[1]) == sorted(everything)


def test_write_duplicated_shards_masks_the_same_instances_differently(tmp_path, corpus):
    from bertforge.data import write_duplicated_shards

    path, vocab = corpus
    one = write_static_shards(make_stream(path, vocab, max_seq_length=32), tmp_path / "s1", 1, 1000)
    index = write_duplicated_shards(lambda: make_stream(path, vocab, max_seq_length=32), tmp_path / "d", 3, 25,
                                    progress=True)
    assert index["dupe_factor"] == 3 and index["same_instances"] and index["total"] == 3 * one["total"]
    rows = [r for r in StaticShardReader(tmp_path / "d", 1000, max_epochs=1, shuffle=False)]
    ids = torch.cat([torch.nn.functional.pad(b["input_ids"], (0, 32 - b["input_ids"].shape[1])) for b in rows])
    labels = torch.cat([torch.nn.functional.pad(b["labels"], (0, 32 - b["labels"].shape[1]), value=-100) for b in rows])
    original = torch.where(labels != -100, labels, ids)
    n = one["total"]
    for k in (1, 2):  # pass k: the same instances in the same order, masked another way
        assert torch.equal(original[k * n : (k + 1) * n], original[:n])
        assert not torch.equal(labels[k * n : (k + 1) * n], labels[:n])
    # a make_stream that does not rebuild the same stream is refused
    streams = iter([make_stream(path, vocab, max_seq_length=32), make_stream(path, vocab, max_seq_length=32, seed=9)])
    with pytest.raises(BertforgeError, match="same stream"):
        write_duplicated_shards(lambda: next(streams), tmp_path / "bad", 2, 25)


def test_static_shards_with_sop_and_ngram_masking(tmp_path, corpus):
    from bertforge.data import index_sentence_objective, write_duplicated_shards

    path, vocab = corpus

    def sop_stream():
        return make_stream(path, vocab, max_seq_length=32, sentence_objective="sop", masking="ngram")

    index = write_duplicated_shards(sop_stream, tmp_path / "sop", 2, 30)
    assert index["sentence_objective"] == "sop" and index["nsp"] is False
    assert index["masking"] == "ngram" and index["max_ngram"] == 3
    reader = StaticShardReader(tmp_path / "sop", batch_size=1000, max_epochs=1, shuffle=False)
    assert reader.sentence_objective == "sop"
    on_disk = torch.cat([b["next_sentence_label"] for b in reader])
    one_pass = make_stream(path, vocab, max_seq_length=32, sentence_objective="sop", masking="ngram", max_epochs=1)
    streamed = torch.cat([b["next_sentence_label"] for b in one_pass])
    assert torch.equal(on_disk, torch.cat([streamed, streamed]))  # the SOP labels, once per duplicate
    assert set(on_disk.tolist()) == {0, 1}
    mlm_stream = make_stream(path, vocab, max_seq_length=32, sentence_objective=None)
    mlm = write_static_shards(mlm_stream, tmp_path / "mlm", 1, 100)
    assert mlm["sentence_objective"] is None and mlm["masking"] == "token" and mlm["max_ngram"] is None
    assert "next_sentence_label" not in next(StaticShardReader(tmp_path / "mlm", 4))
    # an index written before SOP existed says only nsp
    assert index_sentence_objective({"nsp": True}) == "nsp" and index_sentence_objective({"nsp": False}) is None
    assert index_sentence_objective({"nsp": False, "sentence_objective": "sop"}) == "sop"
    old = json.loads((tmp_path / "mlm" / "index.json").read_text())
    del old["sentence_objective"]
    (tmp_path / "mlm" / "index.json").write_text(json.dumps(old | {"nsp": True}))
    assert StaticShardReader(tmp_path / "mlm", 4).sentence_objective == "nsp"
