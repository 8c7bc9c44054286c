"""Tests of `bertforge.data.spans`: n-gram spans (p(n) ∝ 1/n, within segments, whole words), through
`MaskingCollator(masking="ngram")`."""

import json
import random

import pytest
import torch
from tests.data.data_helpers import CLS, MASK, SEP, SPECIAL, VOCAB, collator, random_instances

from bertforge.data.instances import Instance
from bertforge.core.errors import BertforgeError

def spans_of(draw, row):
    """{span number: its positions} of one row of an NgramDraw."""
    out = {}
    for pos, t in enumerate(draw.tile[row].tolist()):
        if t >= 0:
            out.setdefault(t, []).append(pos)
    return out


def segmented_instances(rng, n, length=(100, 120), sep_every=(3, 40)):
    """Rows with extra [SEP]s inside (like packed documents): many segment ends for spans to respect."""
    out = []
    for _ in range(n):
        ids = [CLS]
        target = rng.randint(*length)
        while len(ids) < target:
            ids.extend(rng.randrange(5, VOCAB) for _ in range(rng.randint(*sep_every)))
            ids.append(SEP)
        out.append(Instance(ids, len(ids)))
    return out


def test_ngram_span_lengths_follow_one_over_n():
    """The n of the spans that get masked follows p(n) = (1/n) / (1 + 1/2 + 1/3) = 6/11, 3/11, 2/11; a masked span
    is shorter than its n only where its segment ends or, once per sequence at most, where the count ends."""
    rng = random.Random(4)
    coll = collator(masking="ngram", seed=11)
    hist = torch.zeros(4, dtype=torch.long)
    shortened = 0
    for _ in range(60):
        batch = coll.pad(random_instances(rng, 32, lo=100, hi=120))
        draw = coll.ngram_draw(batch["input_ids"], batch["attention_mask"])
        ids = batch["input_ids"]
        for row in range(ids.shape[0]):
            straddlers = 0
            for t, pos in spans_of(draw, row).items():
                drawn, units, taken = (int(x[row, t]) for x in (draw.drawn, draw.units, draw.taken))
                assert 1 <= drawn <= 3 and 1 <= units <= drawn and 0 <= taken <= units
                assert units == len(pos)  # tokens: one unit each
                assert draw.chosen[row, pos].tolist() == [True] * taken + [False] * (units - taken)
                if taken:
                    hist[drawn] += 1
                if units < drawn:  # cut by the end of its segment: a special token or padding follows
                    assert pos[-1] + 1 == ids.shape[1] or int(ids[row, pos[-1] + 1]) in SPECIAL
                straddlers += 0 < taken < units
                shortened += 0 < taken < drawn
            assert straddlers <= 1
    n = int(hist.sum())
    p = torch.tensor([6 / 11, 3 / 11, 2 / 11], dtype=torch.float64)
    share = hist[1:].double() / n
    sigma = (p * (1 - p) / n).sqrt()
    # n = 21,165 masked spans here; sigma(p(1)) = 0.0034: each share within 4 sigma (measured 0.545, 0.274, 0.181
    # against 0.545, 0.273, 0.182; uniform lengths, 1/3 each, would be 62 sigma off on n = 1). Not exactly p(n):
    # spans are drawn uniformly per sequence, and a sequence tiled by more spans has more 1-grams, each drawn a
    # little less often (-0.002 to -0.004 on p(1) over 100,000 spans of such sequences, about 1 sigma here; -0.03
    # on sequences of a few tokens).
    assert n > 15000
    assert ((share - p).abs() <= 4 * sigma).all(), (share.tolist(), n)
    assert shortened < 0.08 * n  # measured 4.7 %: where the count or a segment ended


def test_ngram_masks_the_count_and_never_crosses_a_special_token():
    rng = random.Random(5)
    coll = collator(masking="ngram", seed=3)
    twin = collator(masking="ngram")
    chosen_total = candidates_total = n_mask = n_random = 0
    for _ in range(40):
        instances = segmented_instances(rng, 16)
        twin.load_state_dict(coll.state_dict())
        batch = coll(instances)
        original = coll.pad(instances)["input_ids"]
        draw = twin.ngram_draw(original, batch["attention_mask"])  # the draw mask() made
        chosen = batch["labels"] != -100
        assert torch.equal(chosen, draw.chosen)  # mask() masks exactly the spans ngram_draw reports
        cand = ~torch.isin(original, torch.tensor(sorted(SPECIAL))) & batch["attention_mask"].bool()
        n = cand.sum(1)
        assert torch.equal(chosen.sum(1), torch.clamp(torch.floor(n * 0.15 + 0.5), min=1).long())  # the count
        assert torch.equal(batch["labels"][chosen], original[chosen])
        for row in range(original.shape[0]):
            for pos in spans_of(draw, row).values():
                assert pos == list(range(pos[0], pos[-1] + 1))  # contiguous
                assert cand[row, pos[0] : pos[-1] + 1].all()  # so no special token inside
        chosen_total += int(chosen.sum())
        candidates_total += int(cand.sum())
        n_mask += int((batch["input_ids"][chosen] == MASK).sum())
        n_random += int((chosen & (batch["input_ids"] != original) & (batch["input_ids"] != MASK)).sum())
    assert abs(chosen_total / candidates_total - 0.15) < 0.005
    assert abs(n_mask / chosen_total - 0.8) < 0.03 and abs(n_random / chosen_total - 0.1) < 0.025


def test_ngram_of_whole_words_never_splits_a_word():
    continuation = [i >= 600 for i in range(VOCAB)]  # ids 600.. are "##" pieces
    rng = random.Random(6)
    coll = collator(masking="ngram", is_continuation=continuation, seed=8)
    assert coll.word_units and collator(masking="ngram", whole_word_mask=True, is_continuation=continuation).word_units
    words_in_spans = torch.zeros(4, dtype=torch.long)
    exact = rows = 0
    for _ in range(30):
        instances = []
        for _ in range(16):
            ids = [CLS]
            for _ in range(rng.randint(20, 60)):
                ids.append(rng.randrange(5, 600))
                ids.extend(rng.randrange(600, VOCAB) for _ in range(rng.choice([0, 0, 1, 2])))
                if rng.random() < 0.05:
                    ids.append(SEP)
            ids.append(SEP)
            instances.append(Instance(ids, len(ids)))
        batch = coll.pad(instances)
        draw = coll.ngram_draw(batch["input_ids"], batch["attention_mask"])
        ids = batch["input_ids"]
        for row, inst in enumerate(instances):
            row_ids = inst.input_ids
            word_of, words = {}, 0
            for pos, token in enumerate(row_ids):
                if token in SPECIAL:
                    continue
                if not (continuation[token] and pos - 1 in word_of):
                    words += 1
                word_of[pos] = words
            chosen = draw.chosen[row].tolist()
            for word in set(word_of.values()):
                flags = {chosen[p] for p, w in word_of.items() if w == word}
                assert len(flags) == 1, f"word {word} only partly masked"
            for t, pos in spans_of(draw, row).items():
                span_words = {word_of[p] for p in pos}
                assert pos == list(range(pos[0], pos[-1] + 1)) and int(draw.units[row, t]) == len(span_words)
                assert pos[0] == min(p for p, w in word_of.items() if w == word_of[pos[0]])  # starts a word
                if draw.taken[row, t] == draw.units[row, t] == draw.drawn[row, t]:
                    words_in_spans[len(span_words)] += 1
            k = max(1, int(len(word_of) * 0.15 + 0.5))
            assert sum(chosen) <= k
            exact += sum(chosen) == k  # short only when no word left fits (words of 1-3 pieces)
            rows += 1
    assert words_in_spans[1] > words_in_spans[2] > words_in_spans[3] > 50  # n counted in words
    assert exact / rows > 0.99


def test_ngram_generator_state_roundtrip_and_seeding():
    rng = random.Random(7)
    batches = [random_instances(rng, 8) for _ in range(6)]
    a = collator(masking="ngram", seed=9)
    for instances in batches[:3]:
        a(instances)
    state = json.loads(json.dumps(a.state_dict()))
    expected = [a(instances) for instances in batches[3:]]
    b = collator(masking="ngram", seed=0)
    b.load_state_dict(state)
    for instances, want in zip(batches[3:], expected, strict=True):
        got = b(instances)
        assert all(torch.equal(got[k], want[k]) for k in want)
    labels = [collator(masking="ngram", seed=s)(batches[0])["labels"] for s in (1, 1, 2)]
    assert torch.equal(labels[0], labels[1]) and not torch.equal(labels[0], labels[2])


def test_ngram_options():
    rng = random.Random(8)
    batch = collator().pad(random_instances(rng, 16, lo=60, hi=80))
    draw = collator(masking="ngram", max_ngram=1).ngram_draw(batch["input_ids"], batch["attention_mask"])
    assert set(draw.drawn.unique().tolist()) == {0, 1}
    draw = collator(masking="ngram", max_ngram=5).ngram_draw(batch["input_ids"], batch["attention_mask"])
    assert int(draw.drawn.max()) == 5
    with pytest.raises(BertforgeError, match="unknown masking 'span'; choose one of token, whole_word, ngram"):
        collator(masking="span")
    with pytest.raises(BertforgeError, match="max_ngram must be at least 1"):
        collator(masking="ngram", max_ngram=0)
    with pytest.raises(BertforgeError, match="whole_word masking of whole words needs is_continuation"):
        collator(masking="whole_word")
    assert collator(whole_word_mask=True, is_continuation=[False] * VOCAB).masking == "whole_word"
    empty = collator(masking="ngram")(
        [{"input_ids": [CLS, SEP]}, {"input_ids": [CLS, SEP, SEP]}]
    )  # nothing to mask anywhere
    assert (empty["labels"] == -100).all()
