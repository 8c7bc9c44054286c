"""Tests of `bertforge.data.masking`: `MaskingCollator`'s token, whole-word and n-gram masking."""

import json
import random

import pytest
import torch
from tests.data.data_helpers import CLS, MASK, PAD, SEP, SPECIAL, VOCAB, collator, random_instances

from bertforge.data.instances import Instance
from bertforge.core.errors import BertforgeError

def test_masking_statistics():
    rng = random.Random(0)
    coll = collator(seed=123)
    chosen_total = candidates_total = 0
    n_mask = n_random = n_same = 0
    position_hits = torch.zeros(80)
    position_cands = torch.zeros(80)
    for _ in range(150):
        instances = random_instances(rng, 32)
        batch = coll(instances)
        original = coll.pad(instances)["input_ids"]
        ids, labels, attn = batch["input_ids"], batch["labels"], batch["attention_mask"]
        cand = ~torch.isin(original, torch.tensor(sorted(SPECIAL))) & attn.bool()
        chosen = labels != -100
        # never a special or padding token; labels hold the original id exactly where chosen
        assert not (chosen & ~cand).any()
        assert torch.equal(labels[chosen], original[chosen])
        assert torch.equal(ids[~chosen], original[~chosen])
        # BERT's count rule, per sequence
        n = cand.sum(1)
        expected = torch.clamp(torch.floor(n * 0.15 + 0.5), min=1).long()
        assert torch.equal(chosen.sum(1), expected)
        chosen_total += int(chosen.sum())
        candidates_total += int(cand.sum())
        n_mask += int((ids[chosen] == MASK).sum())
        changed = chosen & (ids != original) & (ids != MASK)
        n_random += int(changed.sum())
        n_same += int((chosen & (ids == original)).sum())
        assert not torch.isin(ids[changed], torch.tensor(sorted(SPECIAL))).any()
        width = ids.shape[1]
        position_hits[:width] += chosen.sum(0)
        position_cands[:width] += cand.sum(0)
        assert torch.equal(batch["next_sentence_label"], torch.tensor([i.next_sentence_label for i in instances]))
    assert abs(chosen_total / candidates_total - 0.15) < 0.01
    assert abs(n_mask / chosen_total - 0.8) < 0.015
    assert abs(n_random / chosen_total - 0.1) < 0.01
    assert abs(n_same / chosen_total - 0.1) < 0.01
    rate = position_hits[1:40] / position_cands[1:40]  # no position is favoured
    assert (rate - 0.15).abs().max() < 0.03


def test_max_predictions_and_probability():
    rng = random.Random(1)
    instances = random_instances(rng, 64, lo=100, hi=120)
    labels = collator(max_predictions=5)(instances)["labels"]
    assert ((labels != -100).sum(1) == 5).all()
    batch = collator(mlm_probability=0.4)(instances)
    n = batch["attention_mask"].sum(1) - 3
    assert torch.equal((batch["labels"] != -100).sum(1), torch.floor(n * 0.4 + 0.5).long())


def test_whole_word_masking_masks_whole_words():
    continuation = [i >= 600 for i in range(VOCAB)]  # ids 600.. are "##" pieces
    rng = random.Random(2)
    coll = collator(whole_word_mask=True, is_continuation=continuation, seed=5)
    fn_coll = collator(whole_word_mask=True, is_continuation=lambda i: i >= 600, seed=5)
    masked_words = 0
    for _ in range(40):
        instances = []
        for _ in range(16):
            ids = [CLS, rng.randrange(600, VOCAB)]  # a stray piece right after [CLS] is a word of its own
            for _ in range(rng.randint(5, 30)):
                ids.append(rng.randrange(5, 600))
                ids.extend(rng.randrange(600, VOCAB) for _ in range(rng.choice([0, 0, 1, 2, 3])))
            ids.append(SEP)
            instances.append(Instance(ids, len(ids)))
        batch = coll(instances)
        assert torch.equal(batch["labels"], fn_coll(instances)["labels"])
        for row, inst in enumerate(instances):
            chosen = (batch["labels"][row] != -100).tolist()
            ids = inst.input_ids
            words, current = [], []
            for pos in range(1, len(ids) - 1):
                if pos > 1 and continuation[ids[pos]] and current:
                    current.append(pos)
                else:
                    if current:
                        words.append(current)
                    current = [pos]
            words.append(current)
            for word in words:
                flags = {chosen[p] for p in word}
                assert len(flags) == 1, f"word {word} only partly masked"
                masked_words += flags == {True}
            n = len(ids) - 2
            k = max(1, int(n * 0.15 + 0.5))
            assert k - 3 <= sum(chosen) <= k
    assert masked_words > 500


def test_padding_options_and_dict_instances():
    instances = [
        {"input_ids": [CLS, 10, 11, SEP], "token_type_ids": [0, 0, 0, 0]},
        {"input_ids": [CLS, 12, SEP, 13, 14, SEP], "token_type_ids": [0, 0, 0, 1, 1, 1]},
    ]
    batch = collator()(instances)
    assert batch["input_ids"].shape == (2, 6) and "next_sentence_label" not in batch
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6]
    assert batch["input_ids"][0, 4:].tolist() == [PAD, PAD] and batch["labels"][0, 4:].tolist() == [-100, -100]
    assert batch["token_type_ids"][1].tolist() == [0, 0, 0, 1, 1, 1]
    assert all(v.dtype == torch.long for v in batch.values())
    assert collator(pad_to=10)(instances)["input_ids"].shape == (2, 10)
    assert collator(pad_to_multiple_of=8)(instances)["input_ids"].shape == (2, 8)
    with pytest.raises(BertforgeError, match="more than pad_to"):
        collator(pad_to=5)(instances)


def test_generator_state_roundtrip_and_seeding():
    rng = random.Random(3)
    batches = [random_instances(rng, 8) for _ in range(6)]
    a = collator(seed=9)
    for instances in batches[:3]:
        a(instances)
    state = json.loads(json.dumps(a.state_dict()))
    expected = [a(instances) for instances in batches[3:]]
    b = collator(seed=0)
    b.load_state_dict(state)
    for instances, want in zip(batches[3:], expected, strict=False):
        got = b(instances)
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert not torch.equal(collator(seed=1)(batches[0])["labels"], collator(seed=2)(batches[0])["labels"])


def test_masking_argument_errors():
    with pytest.raises(BertforgeError, match="is_continuation"):
        collator(whole_word_mask=True)
    with pytest.raises(BertforgeError, match="mlm_probability"):
        collator(mlm_probability=0.0)
    with pytest.raises(BertforgeError, match="is_continuation has 3 entries"):
        collator(whole_word_mask=True, is_continuation=[False] * 3)
