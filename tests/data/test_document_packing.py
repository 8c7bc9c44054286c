"""ModernBERT's document packing: each document its own [CLS] … [SEP], end to end in rows, long ones cut into
pieces across rows; the batches say each token's piece (`document_ids`), exactly resumable."""

from __future__ import annotations

import json

import pytest
import torch
from tests.data.data_helpers import CLS, SEP, WordVocab, make_stream, tagged_docs, write_txt

from bertforge.core.constants import IGNORE_INDEX
from bertforge.data.instance_stream import Buffers
from bertforge.data.instances import DocumentPacker
from bertforge.core.errors import BertforgeError


def pieces(ids: list[int]) -> list[list[int]]:
    """A row's [CLS] … [SEP] pieces, their content only; fails unless the row is exactly such pieces."""
    out = []
    while ids:
        assert ids[0] == CLS and SEP in ids, ids
        end = ids.index(SEP)
        out.append(ids[1:end])
        ids = ids[end + 1 :]
    return out


def test_documents_are_packed_whole_and_long_ones_continue_in_the_next_row():
    packer = DocumentPacker(16, CLS, SEP, min_piece=4)
    docs = [[list(range(100 + 10 * d, 100 + 10 * d + n))] for d, n in enumerate((5, 3, 20, 2, 9))]
    rows = [inst.input_ids for doc in docs for inst in packer.add_document(doc)]
    rows.append(packer.current)
    assert all(len(r) <= 16 for r in rows)
    found = [p for r in rows for p in pieces(r)]
    # 5 and 3 fit the first row ([CLS] 5 [SEP] [CLS] 3 [SEP] = 12); 2 content tokens left < 4: 20 starts a new
    # row, is cut into 14 (a full row) + 6; 2 follows the 6; 9 does not fit the 2 left: the last row (being filled)
    assert [len(p) for p in found] == [5, 3, 14, 6, 2, 9]
    assert [len(r) for r in rows] == [12, 16, 12, 11]
    assert [t for p in found for t in p] == [t for d in docs for t in d[0]]  # nothing lost, nothing reordered


def test_document_stream_rows_keep_documents_apart_and_resume_exactly(tmp_path):
    docs = tagged_docs(40, seed=3, sentences=(1, 6))
    path = write_txt(tmp_path / "c.txt", docs)
    vocab = WordVocab(docs)
    kw = dict(batch_size=6, max_seq_length=40, buffers=Buffers(shuffle=30), seed=5, sentence_objective=None,
              packing="documents", mlm_probability=0.3)
    stream = make_stream(path, vocab, **kw)
    for _ in range(25):
        batch = next(stream)
        assert sorted(batch) == ["attention_mask", "document_ids", "input_ids", "labels", "token_type_ids"]
        check_pieces(batch, vocab)
        labelled = batch["labels"] != IGNORE_INDEX
        assert not torch.isin(batch["labels"][labelled], torch.tensor([CLS, SEP])).any()
    state = json.loads(json.dumps(stream.state_dict()))
    want = [next(stream) for _ in range(10)]
    resumed = make_stream(path, vocab, **kw)
    resumed.load_state_dict(state)
    for batch in want:
        got = next(resumed)
        assert all(torch.equal(got[k], batch[k]) for k in batch)
    streamed = make_stream(path, vocab, **{**kw, "packing": "stream"})
    with pytest.raises(BertforgeError, match="packing"):
        streamed.load_state_dict(state)


def test_document_packing_needs_mlm_alone(tmp_path):
    docs = tagged_docs(4)
    with pytest.raises(BertforgeError, match="documents only without a sentence objective"):
        make_stream(write_txt(tmp_path / "c.txt", docs), WordVocab(docs), sentence_objective="nsp", packing="documents")


def check_pieces(batch, vocab):
    """Every row of `batch` is [CLS] … [SEP] pieces, `document_ids` numbering them, each piece of one document."""
    original = torch.where(batch["labels"] != IGNORE_INDEX, batch["labels"], batch["input_ids"])
    for row, ids, real in zip(batch["document_ids"], original, batch["attention_mask"]):
        n = int(real.sum())
        assert [len(p) + 2 for p in pieces(ids[:n].tolist())] == torch.bincount(row[:n])[1:].tolist()
        for piece in set(row[:n].tolist()):
            words = [vocab.tag(t)[0] for t in ids[:n][row[:n] == piece].tolist() if t not in (CLS, SEP)]
            assert len(set(words)) == 1


def test_static_shards_of_packed_documents_carry_their_pieces(tmp_path):
    """--static-masking with document packing: the shards' index records the packing, and the reader's batches get
    the same `document_ids` a streamed batch has (read off the [CLS] of each piece, which masking never touches)."""
    from bertforge.data import StaticShardReader, write_static_shards

    docs = tagged_docs(30, seed=4, sentences=(1, 6))
    path, vocab = write_txt(tmp_path / "c.txt", docs), WordVocab(docs)
    stream = make_stream(path, vocab, max_seq_length=40, buffers=Buffers(shuffle=0), sentence_objective=None,
                         packing="documents")
    index = write_static_shards(stream, tmp_path / "shards", 2, 50)
    assert index["packing"] == "documents"
    reader = StaticShardReader(tmp_path / "shards", batch_size=5, seed=1)
    assert reader.packing == "documents"
    seen = 0
    for batch in reader:
        assert "document_ids" in batch
        check_pieces(batch, vocab)
        seen += 1
        if seen == 8:
            break
    assert seen == 8
