"""Tests of `bertforge.embeddings_train.trainer`: gradient caching against the plain loss, batches, the schedule.

Everything runs on a tiny random BERT (2 layers, 32 wide) and data made here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertforge import BertForMaskedLM, BertModel
from bertforge.embeddings_train import EmbeddingsConfig
from bertforge.embeddings_train.data import normalized_scores, read_pairs
from bertforge.embeddings_train.losses import Splade, make_loss
from bertforge.embeddings_train.trainer import EmbeddingTraining, distinct_batches, encode_pairs
from bertforge.tokenizer import Tokenizer
from tests.embeddings_train.embeddings_train_helpers import (
    A,
    B,
    DEV_TEMPLATES,
    FILLERS,
    TRAIN_TEMPLATES,
    make_mlm_model,
    make_model,
    pairs,
    write_tsv,
)


# ---------------------------------------------------------------------------------------------------- caching


def _training(model_dir: Path, data_file: Path, **settings) -> EmbeddingTraining:
    cfg = EmbeddingsConfig(model=str(model_dir), train=str(data_file), out="unused", **settings)
    tokenizer = Tokenizer.from_pretrained(model_dir)
    data = read_pairs(data_file)
    labels = normalized_scores(data, None) if data.shape == "scored" else None
    encoded = encode_pairs(tokenizer, data, 16, labels)
    model = (BertForMaskedLM if cfg.sparse else BertModel).from_pretrained(model_dir, quiet=True)
    loss_name = "cosent" if data.shape == "scored" else "mnrl"
    loss = make_loss(loss_name, cfg.scale_value(loss_name), cfg.symmetric, cfg.dims(),
                     similarity="dot" if cfg.sparse else "cosine")
    if cfg.sparse:
        loss = Splade(loss, cfg.query_regularizer, cfg.document_regularizer)
    run = EmbeddingTraining(model, encoded, None, cfg, None, loss, "splade" if cfg.sparse else "mean",
                            torch.device("cpu"))
    if cfg.sparse:
        run.stepper.step = run.total_steps  # past the regularizers' warm-up: their full weights
    return run


def _gradients(run: EmbeddingTraining, indices: list[int], seed: int = 0) -> tuple[float, dict[str, torch.Tensor]]:
    run.model.zero_grad(set_to_none=True)
    run.model.train()
    torch.manual_seed(seed)
    share = run.forward_backward(run.make_batch(indices), {"loss": 1.0})["loss"].item()
    return share, {n: p.grad.clone() for n, p in run.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("settings", [dict(symmetric=True), dict(matryoshka_dims="32,16"),
                                      dict(sparse="splade", query_regularizer=0.1, document_regularizer=0.05)],
                         ids=["symmetric", "matryoshka", "splade"])
def test_cached_gradient_equals_plain_gradient(tmp_path, settings):
    """Gradient caching gives the plain batch's gradient; for SPLADE (its vocabulary vectors cached, the FLOPS
    regularizers in the loss) too."""
    make = make_mlm_model if settings.get("sparse") else make_model
    model_dir = make(tmp_path / "m", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    rows = [(a, p, FILLERS[i % 10] + " " + n) for i, ((a, p), (_, n)) in enumerate(zip(pairs(TRAIN_TEMPLATES), pairs(DEV_TEMPLATES) * 4))]
    data_file = write_tsv(tmp_path / "triplets.tsv", rows[:40])
    indices = list(range(0, 40, 2))  # 20 examples, 60 texts
    plain_run = _training(model_dir, data_file, **settings)
    plain_loss, plain = _gradients(plain_run, indices)
    if settings.get("sparse"):
        assert plain_run.loss.terms["query_regularizer_loss"] > 0 and plain_run.loss.terms["document_regularizer_loss"] > 0
    cached_loss, cached = _gradients(_training(model_dir, data_file, mini_batch_size=7, **settings), indices)
    assert abs(plain_loss - cached_loss) < 1e-6
    assert plain.keys() == cached.keys() and len(plain) > 10
    worst = max((plain[k] - cached[k]).abs().max().item() for k in plain)
    scale = max(v.abs().max().item() for v in plain.values())
    assert worst < 1e-6 * max(1.0, scale), worst


def test_fp16_cached_gradient_is_scaled_like_the_plain_one(tmp_path):
    """Under --precision fp16 the loss is scaled (2^16) before backward; gradient caching pushes its cached
    gradients in through `backward_from`, which must scale them alike: both then match fp32's gradient times the
    scale, within fp16's rounding."""
    model_dir = make_model(tmp_path / "m", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    data_file = write_tsv(tmp_path / "pairs.tsv", pairs(TRAIN_TEMPLATES)[:24])
    indices = list(range(24))
    _, fp32 = _gradients(_training(model_dir, data_file), indices)
    plain_loss, plain = _gradients(_training(model_dir, data_file, precision="fp16"), indices)
    cached_loss, cached = _gradients(_training(model_dir, data_file, precision="fp16", mini_batch_size=8), indices)
    assert abs(plain_loss - cached_loss) < 1e-2
    for got in (plain, cached):
        assert got.keys() == fp32.keys()
        diff = torch.cat([(got[k] / 2.0**16 - fp32[k]).flatten() for k in fp32]).norm()
        assert diff < 2e-2 * torch.cat([v.flatten() for v in fp32.values()]).norm(), diff


def test_cached_gradient_replays_the_dropout_masks(tmp_path, tiny):
    """With dropout on, each mini-batch's re-run with grad must draw the masks of its first run: the cached
    gradient then equals that of the loss on mini-batches embedded one after the other from the same seed."""
    data_file = write_tsv(tmp_path / "pairs.tsv", pairs(TRAIN_TEMPLATES)[:24])
    indices = list(range(24))
    run = _training(tiny, data_file, mini_batch_size=8)
    _, cached = _gradients(run, indices, seed=3)
    run.model.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    batch = run.make_batch(indices)
    embeddings = torch.cat([run.embed(batch.ids[i : i + 8]) for i in range(0, len(batch.ids), 8)])
    run.stepper.accumulate({"loss": run.batch_loss(batch, embeddings)}, {"loss": 1.0})
    reference = {n: p.grad for n, p in run.model.named_parameters() if p.grad is not None}
    assert max((reference[k] - cached[k]).abs().max().item() for k in reference) < 1e-6
    _, other_seed = _gradients(run, indices, seed=4)
    assert max((other_seed[k] - cached[k]).abs().max().item() for k in cached) > 1e-4  # dropout is really on


# ---------------------------------------------------------------------------------------------------- batches and schedule


def test_distinct_batches_never_repeat_a_text():
    keys = [{0, 1}, {2, 1}, {3, 4}, {5, 6}, {0, 7}, {8, 9}, {1, 10}]  # text 1 in three examples, text 0 in two
    batches = distinct_batches(list(range(7)), keys, 3)
    assert sorted(i for b in batches for i in b) == list(range(7))
    for batch in batches:
        texts = [t for i in batch for t in keys[i]]
        assert len(texts) == len(set(texts))
    assert batches[0] == [0, 2, 3]


def greedy_passes(order: list[int], keys: list[set[int]], batch_size: int) -> list[list[int]]:
    """The definition `distinct_batches` follows (sentence-transformers' NoDuplicatesBatchSampler): each batch
    takes, in order, the examples not taken yet that fit it. Quadratic; an oracle for small inputs."""
    left, batches = list(order), []
    while left:
        batch, seen = [], set()
        for example in left:
            if len(batch) < batch_size and seen.isdisjoint(keys[example]):
                batch.append(example)
                seen |= keys[example]
        batches.append(batch)
        left = [e for e in left if e not in set(batch)]
    return batches


@pytest.mark.parametrize("seed", range(40))
def test_distinct_batches_are_the_greedy_passes(seed):
    import random

    rng = random.Random(seed)
    n, texts, size = rng.randint(1, 120), rng.randint(1, 60), rng.randint(1, 9)
    keys = [{rng.randrange(texts) for _ in range(rng.randint(1, 3))} for _ in range(n)]
    order = rng.sample(range(n), n)
    assert distinct_batches(order, keys, size) == greedy_passes(order, keys, size)


def test_distinct_batches_grow_linearly_with_the_rows():
    """20,000 rows whose anchors are 10 texts (or 1): 5.8 s (and 36 s) when each batch rescanned every waiting
    example; now well under a second (2 cores, 2026-12)."""
    import random
    import time

    rng = random.Random(0)
    for anchors in (10, 1):
        keys = [{rng.randrange(anchors), 1000 + i} for i in range(20_000)]
        started = time.perf_counter()
        batches = distinct_batches(rng.sample(range(20_000), 20_000), keys, 32)
        seconds = time.perf_counter() - started
        print(f"distinct_batches: 20,000 rows, {anchors} distinct anchor(s), batches of 32: {len(batches)} batches "
               f"in {seconds:.2f} s")
        assert seconds < 2.0, f"{seconds:.2f} s"
        assert anchors != 1 or len(batches) == 20_000  # one example a batch: every one holds the anchor


def test_the_schedule_spans_the_batches_without_repeated_texts(tiny, tmp_path):
    """12 questions sharing 2 passages: batches of 4 without a repeated passage hold 2 examples, so an epoch has 6
    steps, not 3, and the learning rate must not reach 0 before the last of them."""
    data_file = write_tsv(tmp_path / "shared.tsv", [(f"{A[i]} now", f"see {B[i % 2]}") for i in range(12)])
    run = _training(tiny, data_file, batch_size=4, epochs=2, warmup_ratio=0.0)
    assert [len(b) for epoch in run.plan for b in epoch] == [2] * 12
    assert run.total_steps == 12
    factor = run.stepper.scheduler.lr_lambdas[0]
    assert factor(11) > 0 and factor(12) == 0


def test_a_run_of_few_optimizer_steps_warns_as_fine_tuning_does(tiny, tmp_path, caplog):
    """`Finetuning`'s warning under `FEW_STEPS` optimizer steps, for the embedding trainer built on it."""
    import logging

    data_file = write_tsv(tmp_path / "few.tsv", [(f"{A[i]} now", f"see {B[i]}") for i in range(8)])
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        _training(tiny, data_file, batch_size=4, epochs=1)
    assert ("train-embeddings: only 2 optimizer steps (8 examples, batch 4, 1 epoch): the model will barely move "
            "from where it starts; use more rows, a smaller --batch-size, or more --epochs") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        _training(tiny, data_file, batch_size=2, epochs=3)  # 12 steps
    assert "optimizer step" not in caplog.text
