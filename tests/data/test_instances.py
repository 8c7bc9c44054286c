"""Tests of `bertforge.data.instances`: NSP and SOP sentence pairs and packed sequences from a document stream."""

import json
import math
import random
from array import array

import pytest
from tests.data.data_helpers import CLS, SEP, WordVocab, at_least_half, make_stream, split_pair, tagged_docs, take, write_txt

from bertforge.data import CorpusReader
from bertforge.data.instance_stream import Buffers, InstanceStream
from bertforge.data.instances import (
    IN_ORDER,
    IS_NEXT,
    NOT_NEXT,
    SWAPPED,
    Instance,
    PairLayout,
    SequencePacker,
    create_nsp_instances,
    create_sop_instances,
    truncate_pair,
)
from bertforge.core.constants import IGNORE_INDEX
from bertforge.core.errors import BertforgeError


def positions(vocab, docs, tokens):
    """(doc, position of each token inside its document) for a run of tagged tokens."""
    tags = [vocab.tag(t) for t in tokens]
    doc_ids = {d for d, _, _ in tags}
    assert len(doc_ids) == 1, f"segment mixes documents {doc_ids}"
    d = doc_ids.pop()
    offsets = [0]
    for sentence in docs[d]:
        offsets.append(offsets[-1] + len(sentence.split()))
    return d, [offsets[s] + w for _, s, w in tags], offsets


def test_nsp_layout_lengths_and_segment_ids(tagged_corpus):
    path, docs, vocab = tagged_corpus
    stream = make_stream(path, vocab, max_seq_length=24, batch_size=16, buffers=Buffers(shuffle=50))
    instances = take(stream, 600)
    labels = [inst.next_sentence_label for inst in instances]
    for inst in instances:
        ids = inst.input_ids
        assert len(ids) <= 24
        assert ids[0] == CLS and ids[inst.num_a - 1] == SEP and ids[-1] == SEP
        assert ids.count(SEP) == 2 and ids.count(CLS) == 1
        a, b = split_pair(inst)
        assert a and b
        assert inst.token_type_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert inst.next_sentence_label in (IS_NEXT, NOT_NEXT)
    # NotNext has probability 1/2 where a chunk has two or more sentences and 1 where it has one, so at least half:
    # n = 600, sigma = sqrt(600 / 4) = 12.2, NotNext >= 300 - 4 x 12.2 = 251 (measured 413). That IsNext is 1/2
    # where there is a choice is test_is_next_half_the_time_where_there_is_a_choice, at +-4 sigma.
    assert at_least_half(labels.count(NOT_NEXT), len(labels))
    batch = stream.collator(instances[:8])
    for row, inst in enumerate(instances[:8]):
        n = len(inst.input_ids)
        assert batch["token_type_ids"][row, :n].tolist() == inst.token_type_ids
        assert batch["token_type_ids"][row, n:].sum() == 0


def test_nsp_segments_respect_documents(tagged_corpus):
    """A is a contiguous run of one document; IsNext B follows it in the same document; NotNext B comes from
    another document (tags name the document of every token)."""
    path, docs, vocab = tagged_corpus
    stream = make_stream(path, vocab, max_seq_length=20, buffers=Buffers(shuffle=30), short_seq_prob=0.3)
    counts = {IS_NEXT: 0, NOT_NEXT: 0}
    for inst in take(stream, 800):
        a, b = split_pair(inst)
        doc_a, pos_a, _ = positions(vocab, docs, a)
        doc_b, pos_b, _ = positions(vocab, docs, b)
        assert pos_a == list(range(pos_a[0], pos_a[0] + len(a)))
        assert pos_b == list(range(pos_b[0], pos_b[0] + len(b)))
        counts[inst.next_sentence_label] += 1
        if inst.next_sentence_label == IS_NEXT:
            assert doc_b == doc_a and pos_b[0] > pos_a[-1]
        else:
            assert doc_b != doc_a
    # n = 800, sigma = sqrt(800 / 4) = 14.1: NotNext >= 400 - 4 x 14.1 = 343 (measured 591). IsNext has no
    # such bound (single-sentence chunks lower it by an amount this corpus decides): > 100 only makes sure that
    # the IsNext checks above ran often enough (measured 209).
    assert at_least_half(counts[NOT_NEXT], 800)
    assert counts[IS_NEXT] > 100


def test_is_next_half_the_time_where_there_is_a_choice(tmp_path):
    """Where a chunk has two or more sentences, B is the true continuation with probability 1/2 (BERT's 50/50).
    Documents of 2-4 sentences of 1-2 words at max_seq_length 32 (a 29-token target) make every chunk run from A's
    first sentence to the end of its document, untruncated; so each instance shows whether there was a choice:
    two or more sentences of its document from A's first one on. One sentence left is NotNext by force."""
    docs = tagged_docs(100, seed=3, sentences=(2, 4), words=(1, 2))
    vocab = WordVocab(docs)
    stream = make_stream(write_txt(tmp_path / "c.txt", docs), vocab, max_seq_length=32, short_seq_prob=0.0,
                         buffers=Buffers(shuffle=0))
    is_next = choices = 0
    for inst in take(stream, 8000):
        a, b = split_pair(inst)
        doc, sentence, word = vocab.tag(a[0])
        assert word == 0 and len(a) + len(b) <= 29  # A starts at a sentence; nothing was truncated
        if len(docs[doc]) - sentence >= 2:
            choices += 1
            is_next += inst.next_sentence_label == IS_NEXT
        else:
            assert inst.next_sentence_label == NOT_NEXT
    # n = 6,052 choices here, sigma = sqrt(0.25 / n) = 0.0064, 4 sigma = 0.026: IsNext in 0.474-0.526 (measured
    # 0.504, 3,053 of 6,052; a 40/60 sampler is 15 sigma off)
    assert choices > 5000
    sigma = math.sqrt(0.5 * 0.5 / choices)
    assert abs(is_next / choices - 0.5) <= 4 * sigma, (is_next, choices)


def test_is_next_is_the_exact_continuation(tagged_corpus):
    """Without truncation (long max length): A is whole sentences i..j-1, IsNext B exactly sentences j..k-1 of
    the same document, NotNext B whole sentences of another document."""
    path, docs, vocab = tagged_corpus
    stream = make_stream(path, vocab, max_seq_length=512, short_seq_prob=0.0, buffers=Buffers(shuffle=10))
    seen_is_next = 0
    for inst in take(stream, 300):
        a, b = split_pair(inst)
        doc_a, pos_a, offsets_a = positions(vocab, docs, a)
        doc_b, pos_b, offsets_b = positions(vocab, docs, b)
        assert pos_a[0] in offsets_a and pos_a[-1] + 1 in offsets_a  # whole sentences
        assert pos_b[0] in offsets_b and pos_b[-1] + 1 in offsets_b
        if inst.next_sentence_label == IS_NEXT:
            seen_is_next += 1
            assert doc_b == doc_a and pos_b[0] == pos_a[-1] + 1
        else:
            assert doc_b != doc_a
    assert seen_is_next > 30


def test_truncate_pair_trims_longer_side_at_random_ends():
    fronts = backs = 0
    for seed in range(50):
        a, b = list(range(10)), list(range(100, 103))
        truncate_pair(a, b, 8, random.Random(seed))
        assert len(a) == 5 and b == [100, 101, 102]
        assert a == list(range(a[0], a[0] + 5))
        fronts += a[0] > 0
        backs += a[-1] < 9
    assert fronts > 5 and backs > 5
    a, b = [1, 2, 3], [4, 5, 6, 7, 8, 9]
    truncate_pair(a, b, 4, random.Random(0))
    assert len(a) == 2 and len(b) == 2


def test_short_seq_prob_makes_shorter_sequences(tmp_path):
    docs = tagged_docs(20, seed=2, sentences=(20, 30), words=(8, 10))
    vocab = WordVocab(docs)
    path = write_txt(tmp_path / "long.txt", docs)
    full = [len(i.input_ids) for i in take(make_stream(path, vocab, max_seq_length=64, short_seq_prob=0.0), 200)]
    short = [len(i.input_ids) for i in take(make_stream(path, vocab, max_seq_length=64, short_seq_prob=1.0), 200)]
    assert sum(full) / len(full) > 55 and max(full) == 64
    assert sum(short) / len(short) < 50


def test_no_nsp_packs_full_sequences_across_documents(tmp_path):
    docs = tagged_docs(6, seed=5)
    vocab = WordVocab(docs)
    stream = make_stream(write_txt(tmp_path / "c.txt", docs), vocab, sentence_objective=None, max_seq_length=16,
                         buffers=Buffers(shuffle=0))
    instances = take(stream, 60)  # several epochs of this corpus
    content = []
    for inst in instances:
        assert len(inst.input_ids) == 16
        assert inst.input_ids[0] == CLS and inst.input_ids[-1] == SEP
        assert inst.token_type_ids == [0] * 16 and inst.next_sentence_label == IGNORE_INDEX
        assert inst.input_ids[1] != SEP  # no separator at a sequence start
        content.extend(inst.input_ids[1:-1])
    doc_tokens = [[t for s in vocab.tokenize(doc) for t in s] for doc in docs]
    flat = [t for t in content if t != SEP]
    expected = [t for _ in range(20) for doc in doc_tokens for t in doc][: len(flat)]
    assert flat == expected
    for i, t in enumerate(content[:-1]):  # every separator sits exactly between two documents
        if t == SEP:
            assert vocab.tag(content[i + 1])[1:] == (0, 0)
            assert vocab.tag(content[i - 1])[0] != vocab.tag(content[i + 1])[0] or len(docs) == 1
    assert stream.epoch >= 2


# ---------------------------------------------------------------------------------------------- linear-time rewrites
# The one-token-at-a-time implementations that truncate_pair and SequencePacker.add_document replaced (quadratic in
# a sentence's length), kept as the reference: the new code must make the same draws and give the same results.


def reference_truncate_pair(tokens_a, tokens_b, max_tokens, rng):
    while len(tokens_a) + len(tokens_b) > max_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


class ReferencePacker:
    def __init__(self, max_seq_length, cls_id, sep_id):
        self.capacity = max_seq_length - 2
        self.cls_id = cls_id
        self.sep_id = sep_id
        self.current = []
        self.seen_document = False

    def add_document(self, sentences):
        out = []
        if self.seen_document and self.current:
            self.current.append(self.sep_id)
        self.seen_document = True
        for sentence in sentences:
            self.current.extend(sentence)
            while len(self.current) >= self.capacity:
                content = self.current[: self.capacity]
                self.current = self.current[self.capacity :]
                ids = [self.cls_id, *content, self.sep_id]
                out.append(Instance(ids, len(ids), IGNORE_INDEX))
        return out

    def state_dict(self):
        return {"current": list(self.current), "seen_document": self.seen_document}


def random_length(rng):
    roll = rng.random()
    if roll < 0.1:
        return 0
    if roll < 0.6:
        return rng.randint(1, 20)
    if roll < 0.9:
        return rng.randint(1, 300)
    return rng.randint(300, 3000)


@pytest.mark.parametrize("case", range(400))
def test_truncate_pair_matches_one_token_at_a_time(case):
    cases = random.Random(case)
    len_a, len_b = random_length(cases), random_length(cases)
    if cases.random() < 0.2:
        len_b = len_a + cases.choice([-1, 0, 1])  # near ties: the alternating phase from every start
        len_b = max(len_b, 0)
    total = len_a + len_b
    max_tokens = cases.choice([0, 1, 2, 5, 61, 125, 509, cases.randint(0, total + 5), total, total + 1])
    a, b = list(range(len_a)), list(range(10_000, 10_000 + len_b))
    ref_a, ref_b = list(a), list(b)
    rng, ref_rng = random.Random(case * 7 + 1), random.Random(case * 7 + 1)
    id_a, id_b = id(a), id(b)
    truncate_pair(a, b, max_tokens, rng)
    reference_truncate_pair(ref_a, ref_b, max_tokens, ref_rng)
    assert (a, b) == (ref_a, ref_b)
    assert (id(a), id(b)) == (id_a, id_b)  # in place
    assert rng.getstate() == ref_rng.getstate()


@pytest.mark.parametrize("max_tokens", [-1, -3])
def test_truncate_pair_negative_budget_fails_like_one_token_at_a_time(max_tokens):
    for seed in range(8):
        outcomes = []
        for trim in (truncate_pair, reference_truncate_pair):
            a, b, rng = [1, 2, 3], [4, 5], random.Random(seed)
            with pytest.raises(IndexError) as err:
                trim(a, b, max_tokens, rng)
            outcomes.append((a, b, str(err.value), rng.getstate()))
        assert outcomes[0] == outcomes[1]


def test_truncate_pair_on_a_huge_segment_is_linear():
    import time

    for len_a, len_b in ((600_000, 3), (300_000, 300_000), (3, 600_000)):
        a, b = list(range(len_a)), list(range(len_b))
        ref_rng, rng = random.Random(5), random.Random(5)
        started = time.perf_counter()
        truncate_pair(a, b, 61, rng)
        assert time.perf_counter() - started < 5  # about 0.1 s; one token at a time: about a minute
        assert len(a) + len(b) == 61
        for _ in range(len_a + len_b - 61):
            ref_rng.random()
        assert rng.getstate() == ref_rng.getstate()


@pytest.mark.parametrize("case", range(300))
def test_sequence_packer_matches_reslicing(case):
    cases = random.Random(case)
    max_seq_length = cases.choice([3, 4, 5, 8, 16, 64, cases.randint(3, 200)])
    packer, ref = SequencePacker(max_seq_length, CLS, SEP), ReferencePacker(max_seq_length, CLS, SEP)
    next_token = 100
    for _ in range(cases.randint(1, 6)):
        document = []
        for _ in range(cases.randint(0, 5)):
            n = random_length(cases)
            document.append(list(range(next_token, next_token + n)) if cases.random() < 0.5
                            else array("i", range(next_token, next_token + n)))
            next_token += n
        got, want = packer.add_document(document), ref.add_document(document)
        assert [(i.input_ids, i.num_a, i.next_sentence_label) for i in got] == \
            [(i.input_ids, i.num_a, i.next_sentence_label) for i in want]
        assert packer.state_dict() == ref.state_dict()
        assert json.dumps(packer.state_dict()) == json.dumps(ref.state_dict())
        if cases.random() < 0.3:  # resume from the state
            state = json.loads(json.dumps(packer.state_dict()))
            packer = SequencePacker(max_seq_length, CLS, SEP)
            packer.load_state_dict(state)


def test_sequence_packer_on_a_huge_sentence_is_linear():
    import time

    started = time.perf_counter()
    out = SequencePacker(64, CLS, SEP).add_document([list(range(600_000))])
    assert time.perf_counter() - started < 5  # about 0.1 s; re-slicing: far longer
    assert len(out) == 600_000 // 62 and out[-1].input_ids[1:-1] == list(range(600_000 - 600_000 % 62 - 62,
                                                                                600_000 - 600_000 % 62))


def test_nsp_instances_from_long_documents_are_linear():
    """Two documents of 400,000 one-token sentences: every NotNext B used to copy the other document's list of
    sentences from its random start (about 9 s here); now ~0.7 s."""
    import time


    document = [[i] for i in range(400_000)]
    other = [[-i] for i in range(400_000)]
    started = time.perf_counter()
    out = create_nsp_instances(document, lambda rng: other, random.Random(0), PairLayout(64, 0.1, CLS, SEP))
    assert time.perf_counter() - started < 5
    assert sum(inst.next_sentence_label == NOT_NEXT for inst in out) > 1000


# ---------------------------------------------------------------------------------------------- sentence order (SOP)
def sop_stream(path, vocab, **kw):
    return make_stream(path, vocab, sentence_objective="sop", **kw)


def test_sop_pairs_are_consecutive_segments_of_one_document(tagged_corpus):
    """Untruncated (max length 512): A and B are one document's consecutive text, B right after A in the original
    order; the label is SWAPPED exactly when the segment shown first comes second in the document. Chunks of two or
    more sentences split at a sentence boundary; a one-sentence chunk is cut inside the sentence."""
    path, docs, vocab = tagged_corpus
    labels = {IN_ORDER: 0, SWAPPED: 0}
    cut_inside = 0
    for inst in take(sop_stream(path, vocab, max_seq_length=512, short_seq_prob=0.0, buffers=Buffers(shuffle=10)), 400):
        first, second = split_pair(inst)
        doc_1, pos_1, offsets = positions(vocab, docs, first)
        doc_2, pos_2, _ = positions(vocab, docs, second)
        assert doc_1 == doc_2  # never another document
        assert pos_1 == list(range(pos_1[0], pos_1[0] + len(first)))  # each a contiguous run
        assert pos_2 == list(range(pos_2[0], pos_2[0] + len(second)))
        early, late = (pos_1, pos_2) if inst.next_sentence_label == IN_ORDER else (pos_2, pos_1)
        assert late[0] == early[-1] + 1  # consecutive, in the order the label says
        assert early[0] in offsets and late[-1] + 1 in offsets  # the pair is whole sentences end to end
        cut_inside += late[0] not in offsets
        labels[inst.next_sentence_label] += 1
    assert labels[IN_ORDER] > 100 and labels[SWAPPED] > 100  # measured 213 and 187
    assert cut_inside > 30  # one-sentence chunks are cut inside the sentence (measured 90)


def test_sop_truncated_pairs_stay_in_one_document_and_in_order(tagged_corpus):
    path, docs, vocab = tagged_corpus
    for inst in take(sop_stream(path, vocab, max_seq_length=20, short_seq_prob=0.3, buffers=Buffers(shuffle=30)), 800):
        assert len(inst.input_ids) <= 20 and inst.input_ids[0] == CLS and inst.input_ids.count(SEP) == 2
        first, second = split_pair(inst)
        assert first and second
        assert inst.token_type_ids == [0] * (len(first) + 2) + [1] * (len(second) + 1)
        doc_1, pos_1, _ = positions(vocab, docs, first)
        doc_2, pos_2, _ = positions(vocab, docs, second)
        assert doc_1 == doc_2
        assert pos_1 == list(range(pos_1[0], pos_1[0] + len(first)))
        assert pos_2 == list(range(pos_2[0], pos_2[0] + len(second)))
        # truncation may drop tokens between the two, never reorder them
        assert (pos_2[0] > pos_1[-1]) == (inst.next_sentence_label == IN_ORDER)


def test_sop_swaps_half_the_time(tmp_path):
    """Every SOP instance is swapped with probability exactly 1/2 (no forced case, unlike NSP's NotNext)."""
    docs = tagged_docs(300, seed=8, sentences=(1, 6), words=(1, 6))
    vocab = WordVocab(docs)
    stream = sop_stream(write_txt(tmp_path / "c.txt", docs), vocab, max_seq_length=16, short_seq_prob=0.2,
                        buffers=Buffers(shuffle=0))
    instances = take(stream, 8000)
    swapped = sum(inst.next_sentence_label == SWAPPED for inst in instances)
    assert {inst.next_sentence_label for inst in instances} == {IN_ORDER, SWAPPED}
    # n = 8,000, sigma = sqrt(0.25 / n) = 0.0056, 4 sigma = 0.022: swapped share in 0.478-0.522 (measured 0.503,
    # 4,022 of 8,000; a 45/55 sampler is 9 sigma off)
    sigma = math.sqrt(0.25 / len(instances))
    assert abs(swapped / len(instances) - 0.5) <= 4 * sigma, swapped


def test_sop_swap_comes_before_truncation():
    """Sentences of 5 and 40 tokens trimmed to 9: truncate_pair cuts the longer one down to 5, then takes the tie
    from its second argument, so the segment shown first keeps 5 tokens and the second 4, whichever order they
    are in; had the pair been trimmed before the swap, a swapped pair would show (4, 5) and one in order (5, 4)."""
    document = [list(range(100, 105)), list(range(200, 240))]
    labels = set()
    for seed in range(40):
        (inst,) = create_sop_instances(document, random.Random(seed), PairLayout(12, 0.0, CLS, SEP))
        first, second = split_pair(inst)
        assert (len(first), len(second)) == (5, 4)
        assert (first[0] >= 200) == (inst.next_sentence_label == SWAPPED)
        labels.add(inst.next_sentence_label)
    assert labels == {IN_ORDER, SWAPPED}


def test_sop_single_sentence_and_single_token_documents(tmp_path):
    """A one-sentence document still gives pairs (cut at a random token boundary); a one-token one gives none, and
    a corpus of nothing else is an error, not an endless read. One document is enough for SOP (NSP needs two)."""
    document = [list(range(100, 110))]
    cuts = set()
    for seed in range(60):
        (inst,) = create_sop_instances(document, random.Random(seed), PairLayout(64, 0.0, CLS, SEP))
        first, second = split_pair(inst)
        early, late = (first, second) if inst.next_sentence_label == IN_ORDER else (second, first)
        assert early + late == list(range(100, 110))
        cuts.add(len(early))
    assert cuts == set(range(1, 10))
    assert create_sop_instances([[100]], random.Random(0), PairLayout(64, 0.0, CLS, SEP)) == []
    one = tagged_docs(1, seed=3, sentences=(1, 1), words=(6, 6))
    batch = next(sop_stream(write_txt(tmp_path / "one.txt", one), WordVocab(one), batch_size=4, max_seq_length=16))
    assert set(batch["next_sentence_label"].tolist()) <= {IN_ORDER, SWAPPED}
    tiny = tagged_docs(4, seed=3, sentences=(1, 1), words=(1, 1))
    with pytest.raises(BertforgeError, match="sentence-order pair"):
        next(sop_stream(write_txt(tmp_path / "tiny.txt", tiny), WordVocab(tiny), batch_size=4))


def test_sop_uses_nsp_chunks_and_split_points():
    """SOP shares BERT's chunking with NSP: with the same RNG, an IsNext instance's A/B boundary is SOP's."""
    document = [list(range(100 * s, 100 * s + 7)) for s in range(1, 12)]
    same = 0
    for seed in range(30):
        layout = PairLayout(32, 0.0, CLS, SEP)
        nsp = create_nsp_instances(document, lambda rng: [[-1, -2, -3]], random.Random(seed), layout)
        sop = create_sop_instances(document, random.Random(seed), layout)
        if nsp[0].next_sentence_label == IS_NEXT:  # the first chunk's draws were the same in both
            a, _ = split_pair(nsp[0])
            first, second = split_pair(sop[0])
            assert a == (first if sop[0].next_sentence_label == IN_ORDER else second)
            same += 1
    assert same > 5


def test_sentence_objective_is_nsp_sop_or_none(tagged_corpus):
    path, docs, vocab = tagged_corpus
    for objective in ("nsp", "sop", None):
        stream = make_stream(path, vocab, sentence_objective=objective)
        assert stream.sentence_objective == stream.instances.sentence_objective == objective
        assert stream.nsp == (objective == "nsp")
    assert make_stream(path, vocab).sentence_objective == "nsp"  # the default
    for bad in ("nso", "NSP", True, False):  # a bool is not an objective: the old nsp= switch is gone
        with pytest.raises(BertforgeError, match=f"unknown sentence_objective {bad!r}; choose one of nsp, sop or None"):
            InstanceStream(CorpusReader(path), vocab.tokenize, cls_id=CLS, sep_id=SEP, sentence_objective=bad)
        with pytest.raises(BertforgeError, match=f"unknown sentence_objective {bad!r}"):
            make_stream(path, vocab, sentence_objective=bad)
    with pytest.raises(TypeError, match="nsp"):
        make_stream(path, vocab, nsp=False)
