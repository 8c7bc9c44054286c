"""`evaluation.negatives.mine_negatives` against sentence-transformers' `mine_hard_negatives` on all-MiniLM-L6-v2 and
~60 synthetic pairs (five topics, some anchors with two positives): the same rows for top sampling under each
filter, the same candidate set for random sampling, never a positive."""

from __future__ import annotations

import random

import pytest
import torch

from bertforge.core.errors import BertforgeError
from bertforge.evaluation.negatives import MiningSettings, mine_negatives
from tests.evaluation.evaluation_helpers import TOPICS, sentence

st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers: pip install -e '.[test]'")
datasets = pytest.importorskip("datasets", reason="needs datasets: pip install -e '.[test]'")


def make_pairs(n: int = 60, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    topics = list(TOPICS)
    anchors, positives = [], []
    for i in range(n):
        topic = topics[i % len(topics)]
        anchor = sentence(rng, topic, 5)
        anchors.append(anchor)
        positives.append(sentence(rng, topic, 10))
        if i % 10 == 0:  # an anchor with two positives, and a duplicated row
            anchors += [anchor, anchor]
            positives += [sentence(rng, topic, 9), positives[-1]]
    return anchors, positives


ANCHORS, POSITIVES = make_pairs()


@pytest.fixture(scope="module")
def reference(minilm_dir, tmp_path_factory):
    """sentence-transformers' mining of the pairs (its embeddings cached across calls)."""
    model = st.SentenceTransformer(str(minilm_dir), device="cpu")
    cache = str(tmp_path_factory.mktemp("st-cache"))
    dataset = datasets.Dataset.from_dict({"anchor": ANCHORS, "positive": POSITIVES})

    def mine(**kwargs):
        return st.util.mine_hard_negatives(dataset, model, verbose=False, cache_folder=cache, **kwargs).to_list()

    return mine


@pytest.fixture(scope="module")
def ours(minilm_dir):
    """bertforge's mining through the embed pipeline (each text list embedded once)."""
    from bertforge.pipelines.embed import EmbedPipeline

    pipeline = EmbedPipeline(minilm_dir, normalize=True, progress=False)
    seen: dict[tuple[str, ...], torch.Tensor] = {}

    def embed(texts: list[str]) -> torch.Tensor:
        if tuple(texts) not in seen:
            seen[tuple(texts)] = torch.from_numpy(pipeline(texts))
        return seen[tuple(texts)]

    def mine(**kwargs):
        return mine_negatives(ANCHORS, POSITIVES, embed, embed, MiningSettings(**kwargs))

    return mine


def negatives(row: dict) -> list[str]:
    return [v for k, v in row.items() if k.startswith("negative")]


def agreement(a: list[dict], b: list[dict]) -> float:
    assert len(a) == len(b)
    return sum(x == y for x, y in zip(a, b)) / len(a)


def positives_of() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for a, p in zip(ANCHORS, POSITIVES):
        found.setdefault(a, set()).add(p)
    return found


@pytest.mark.parametrize("output_format", ["triplet", "n-tuple"])
def test_top_sampling_picks_sentence_transformers_negatives(reference, ours, output_format):
    for kwargs in ({}, {"range_min": 2, "range_max": 12, "num_negatives": 4}):
        expected, got = reference(output_format=output_format, **kwargs), ours(output_format=output_format, **kwargs)
        assert agreement(expected, got) >= 0.95, kwargs
        assert len(got) == (len(expected))
    triplets = ours(output_format="triplet")
    assert set(triplets[0]) == {"anchor", "positive", "negative"}
    assert len(triplets) == 3 * 66  # 66 distinct (anchor, positive) pairs (a duplicated row counts once), 3 each
    tuples = ours(output_format="n-tuple", num_negatives=2)
    assert list(tuples[0]) == ["anchor", "positive", "negative_1", "negative_2"] and len(tuples) == 66


def test_filters_drop_what_sentence_transformers_drops(reference, ours):
    plain = ours(num_negatives=5)
    for ours_kwargs in ({"margin": 0.1}, {"relative_margin": 0.3}, {"max_score": 0.45}, {"min_score": 0.5},
                        {"max_score": 0.6, "min_score": 0.45, "range_max": 30}):
        theirs_kwargs = {("absolute_margin" if k == "margin" else k): v for k, v in ours_kwargs.items()}
        expected = reference(num_negatives=5, **theirs_kwargs)
        got = ours(num_negatives=5, **ours_kwargs)
        assert agreement(expected, got) >= 0.95, ours_kwargs
        assert got != plain, f"{ours_kwargs} changed nothing: the test would not see a wrong filter"


def test_random_sampling_draws_from_the_same_candidates(reference, ours):
    window = {"range_min": 1, "range_max": 10, "num_negatives": 3}
    allowed: dict[tuple[str, str], set[str]] = {}
    for row in reference(sampling_strategy="top", **{**window, "num_negatives": 9}):
        allowed.setdefault((row["anchor"], row["positive"]), set()).add(row["negative"])
    first, again, other = (ours(sampling="random", seed=seed, **window) for seed in (1, 1, 2))
    assert first == again and first != other  # seeded: repeatable, and a draw
    for row in first + reference(sampling_strategy="random", **window):
        assert row["negative"] in allowed[row["anchor"], row["positive"]]
    assert len(first) == len(reference(sampling_strategy="random", **window))


def test_never_a_positive_nor_the_anchor(ours):
    known = positives_of()
    for kwargs in ({}, {"num_negatives": 8, "sampling": "random"}, {"output_format": "n-tuple", "num_negatives": 6}):
        for row in ours(**kwargs):
            assert not set(negatives(row)) & (known[row["anchor"]] | {row["anchor"]})
    # the anchor's own text in the corpus is not its negative
    same = mine_negatives(["a b", "c d"], ["x y", "z w"], lambda t: torch.eye(4)[: len(t)],
                          lambda t: torch.eye(4)[: len(t)], MiningSettings(num_negatives=1), corpus=["a b"])
    assert all(row["negative"] not in (row["anchor"], row["positive"]) for row in same)


def test_a_cross_encoder_rescores_as_sentence_transformers(minilm_dir, reranker_dir, tmp_path):
    """The candidates and positives rescored by a (tiny random) cross-encoder, then filtered by a margin on its
    scores: the rows of `mine_hard_negatives(cross_encoder=...)`."""
    from bertforge.pipelines.embed import EmbedPipeline
    from bertforge.pipelines.rerank import RerankPipeline

    pipeline = EmbedPipeline(minilm_dir, normalize=True, progress=False)
    embed = lambda texts: torch.from_numpy(pipeline(texts))  # noqa: E731
    anchors, positives = ANCHORS[:30], POSITIVES[:30]
    expected = st.util.mine_hard_negatives(
        datasets.Dataset.from_dict({"anchor": anchors, "positive": positives}),
        st.SentenceTransformer(str(minilm_dir), device="cpu"), cross_encoder=st.CrossEncoder(str(reranker_dir)),
        num_negatives=2, absolute_margin=0.0, verbose=False).to_list()
    got = mine_negatives(anchors, positives, embed, embed, MiningSettings(num_negatives=2, margin=0.0),
                         rerank=RerankPipeline(reranker_dir, progress=False).score)
    assert len(got) == len(expected) and agreement(expected, got) >= 0.95
    plain = mine_negatives(anchors, positives, embed, embed, MiningSettings(num_negatives=2, margin=0.0))
    assert got != plain  # the cross-encoder changed the choice


def test_reranker_rescores_the_candidates():
    """A cross-encoder that prefers the longest texts decides the order (and the margin is on its scores)."""
    embed = lambda texts: torch.nn.functional.normalize(torch.ones(len(texts), 4), dim=1)  # noqa: E731 all tied
    corpus = ["one", "one two three", "one two", "one two three four five"]
    rows = mine_negatives(["q"], ["pos"], embed, embed, MiningSettings(num_negatives=2), corpus=corpus,
                          rerank=lambda pairs: [len(d.split()) for _, d in pairs])
    assert [r["negative"] for r in rows] == ["one two three four five", "one two three"]
    kept = mine_negatives(["q"], ["pos"], embed, embed, MiningSettings(num_negatives=2, margin=1.5), corpus=corpus,
                          rerank=lambda pairs: [len(d.split()) + (5 if d == "pos" else 0) for _, d in pairs])
    assert [r["negative"] for r in kept] == ["one two three", "one two"]  # 5 + 1.5 > 6 (the positive): dropped


def test_bad_windows_are_refused():
    for settings, message in ((MiningSettings(range_min=5, range_max=5), "range_min must be smaller"),
                              (MiningSettings(range_min=-1), "range_min must be 0 or more"),
                              (MiningSettings(num_negatives=0), "at least 1"),
                              (MiningSettings(range_max=2, num_negatives=3), "cannot mine 3 negatives"),
                              (MiningSettings(sampling="best"), "sampling must be one of")):
        with pytest.raises(BertforgeError, match=message):
            settings.window(1, False)
