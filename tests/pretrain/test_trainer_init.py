"""Continued pretraining (`pretrain --init-from DIR`): from a bertforge checkpoint and from a `transformers`
BertForMaskedLM (no NSP head), its config and tokenizer kept, contradicting options refused, with resume and static
masking."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertforge import BertforgeError
from bertforge.pretrain.trainer import PretrainArgs, Pretrainer, pretrain
from bertforge.training.run_dir import list_checkpoints
from tests.helpers import TINY_CONFIG, tiny_config

# corpus_and_tokenizer, the tiny corpus, tokenizer and config.json: a fixture of tests/conftest.py


def init_args(corpus_and_tokenizer, out: Path, init_from: Path, **kw) -> PretrainArgs:
    """A short run continuing `init_from`: no --config, no --tokenizer (the checkpoint brings both)."""
    corpus, _, _ = corpus_and_tokenizer
    base = dict(corpus=[str(corpus)], init_from=str(init_from), out=str(out), batch_size=4, max_length=32, max_steps=8,
                lr=1e-3, warmup_steps=2, save_every=4, log_every=2, progress=False, demo=False)
    return PretrainArgs(**{**base, **kw})


@pytest.fixture(scope="module")
def bertforge_checkpoint(corpus_and_tokenizer, tmp_path_factory) -> Path:
    """A tiny BertForPreTraining (every head) saved by bertforge, with the run's tokenizer."""
    return save_bertforge_checkpoint(corpus_and_tokenizer, tmp_path_factory.mktemp("bertforge_ckpt"))


def save_bertforge_checkpoint(corpus_and_tokenizer, directory: Path) -> Path:
    """`bertforge_checkpoint` in `directory` (also a fixture of the command tests, `tests/commands/test_pretrain.py`)."""
    from bertforge import BertForPreTraining
    from bertforge.tokenizer import Tokenizer

    torch.manual_seed(123)
    BertForPreTraining(tiny_config()).save_pretrained(directory)
    Tokenizer.from_pretrained(corpus_and_tokenizer[1]).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def hf_mlm_checkpoint(corpus_and_tokenizer, tmp_path_factory) -> Path:
    """A tiny `transformers.BertForMaskedLM` (no pooler, no NSP head) from save_pretrained, with a vocabulary of
    128 rows: more than its tokenizer's 120 ids (a padded embedding, as published checkpoints often have)."""
    return save_hf_mlm_checkpoint(corpus_and_tokenizer, tmp_path_factory.mktemp("hf_mlm_ckpt"))


def save_hf_mlm_checkpoint(corpus_and_tokenizer, directory: Path) -> Path:
    """`hf_mlm_checkpoint` in `directory` (also a fixture of the command tests, `tests/commands/test_pretrain.py`)."""
    transformers = pytest.importorskip("transformers")
    from bertforge.tokenizer import Tokenizer

    config = transformers.BertConfig(**{**TINY_CONFIG, "vocab_size": 128})
    torch.manual_seed(7)
    transformers.BertForMaskedLM(config).save_pretrained(directory)
    Tokenizer.from_pretrained(corpus_and_tokenizer[1]).save_pretrained(directory)
    return directory


def fresh_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "newly initialised" in r.getMessage()]


def test_init_from_a_bertforge_checkpoint_starts_from_its_weights(corpus_and_tokenizer, bertforge_checkpoint, tmp_path,
                                                                    caplog):
    saved = load_file(str(bertforge_checkpoint / "model.safetensors"))
    trainer = Pretrainer(init_args(corpus_and_tokenizer, tmp_path / "run", bertforge_checkpoint))
    own = trainer.model.state_dict()
    for key, tensor in saved.items():
        assert torch.equal(own[key], tensor), key
    assert not fresh_warnings(caplog)  # every head was in the checkpoint
    trainer.run()
    after = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    assert not torch.equal(after["bert.encoder.layer.0.attention.self.query.weight"],
                           saved["bert.encoder.layer.0.attention.self.query.weight"])  # trained on
    assert json.loads((tmp_path / "run" / "run_config.json").read_text())["init_from"] == str(bertforge_checkpoint)


def test_init_from_a_transformers_masked_lm_names_the_missing_heads_once(corpus_and_tokenizer, hf_mlm_checkpoint,
                                                                        tmp_path, caplog):
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForMaskedLM.from_pretrained(hf_mlm_checkpoint).state_dict()
    caplog.set_level(logging.INFO)
    trainer = Pretrainer(init_args(corpus_and_tokenizer, tmp_path / "run", hf_mlm_checkpoint))
    warnings = fresh_warnings(caplog)
    assert len(warnings) == 1, warnings
    for head in ("bert.pooler.dense.weight", "bert.pooler.dense.bias", "cls.seq_relationship.weight",
                 "cls.seq_relationship.bias"):
        assert head in warnings[0]
    assert "encoder" not in warnings[0] and "cls.predictions" not in warnings[0]
    own = trainer.model.state_dict()
    for key in ("bert.embeddings.word_embeddings.weight", "bert.encoder.layer.1.output.dense.weight",
                "cls.predictions.transform.dense.weight", "cls.predictions.bias"):
        assert torch.equal(own[key], hf[key]), key
    # the checkpoint's config is kept: its 128-row vocabulary, not the tokenizer's 120
    assert trainer.config.vocab_size == 128 and trainer.tokenizer.vocab_size == 120
    trainer.run()
    model, info = transformers.BertForPreTraining.from_pretrained(tmp_path / "run" / "model", output_loading_info=True)
    assert not info["missing_keys"] and model.config.vocab_size == 128


def test_init_from_heads_are_initialised_from_the_seed(corpus_and_tokenizer, hf_mlm_checkpoint, tmp_path):
    """The heads a checkpoint lacks start the same in every run (and on every rank) with one --seed."""
    one = Pretrainer(init_args(corpus_and_tokenizer, tmp_path / "a", hf_mlm_checkpoint)).model.state_dict()
    two = Pretrainer(init_args(corpus_and_tokenizer, tmp_path / "b", hf_mlm_checkpoint)).model.state_dict()
    other = Pretrainer(init_args(corpus_and_tokenizer, tmp_path / "c", hf_mlm_checkpoint, seed=5)).model.state_dict()
    key = "cls.seq_relationship.weight"
    assert torch.equal(one[key], two[key]) and not torch.equal(one[key], other[key])


@pytest.mark.parametrize("change, flag", [
    (dict(config="mini"), "--config"),
    (dict(tokenizer="some/tokenizer"), "--tokenizer"),
    (dict(vocab_size=500), "--vocab-size"),
    (dict(tokenizer_sample_mb=1.0), "--tokenizer-sample-mb"),
    (dict(lowercase=False), "--cased"),
])
def test_init_from_refuses_options_that_contradict_the_checkpoint(corpus_and_tokenizer, bertforge_checkpoint, tmp_path,
                                                                  change, flag):
    with pytest.raises(BertforgeError, match=f"--init-from contradicts {flag} "):
        pretrain(init_args(corpus_and_tokenizer, tmp_path / "run", bertforge_checkpoint, **change))
    assert not (tmp_path / "run").exists()


def test_init_from_a_directory_without_a_checkpoint_is_refused(corpus_and_tokenizer, tmp_path):
    with pytest.raises(BertforgeError, match="--init-from .*no config.json"):
        pretrain(init_args(corpus_and_tokenizer, tmp_path / "run", tmp_path / "nothing"))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static-masking"])
def test_init_from_resumes_from_its_own_checkpoint_bitwise(corpus_and_tokenizer, hf_mlm_checkpoint, tmp_path,
                                                         monkeypatch, static):
    """Killed after its step-4 checkpoint and resumed: the same weights as an uninterrupted run. The resumed run
    takes its weights from its own checkpoint, never from --init-from again: the checkpoint's weights file is
    damaged before the resume, and the resume does not notice."""
    import shutil

    from tests.pretrain.test_trainer import crash_after_seven

    source = tmp_path / "source"
    shutil.copytree(hf_mlm_checkpoint, source)
    extra = dict(static_masking=True, dupe_factor=2) if static else {}
    straight = tmp_path / "straight"
    pretrain(init_args(corpus_and_tokenizer, straight, source, **extra))
    broken = tmp_path / "broken"
    crash_after_seven(monkeypatch, init_args(corpus_and_tokenizer, broken, source, **extra))
    assert [s for s, _ in list_checkpoints(broken)] == [4]
    (source / "model.safetensors").write_bytes(b"damaged")
    pretrain(init_args(corpus_and_tokenizer, broken, source, resume=True, **extra))
    a = load_file(str(straight / "model" / "model.safetensors"))
    b = load_file(str(broken / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_torchrun_fsdp_continues_a_checkpoint_and_evaluates_as_one_process(corpus_and_tokenizer, hf_mlm_checkpoint,
                                                                          tmp_path):
    """FSDP over two processes from a transformers checkpoint (every rank loads it and initialises the missing heads
    alike, then shards): the step-0 held-out numbers equal one process's, with the evaluation's extra forward on
    the rank that has one batch fewer; the final model is complete."""
    from tests.pretrain.test_trainer import assert_loadable_model
    from tests.pretrain.test_eval import assert_same_evaluation, eval_args, rows, torchrun_eval

    eval_text = corpus_and_tokenizer[0]  # the training text itself will do: only the numbers' agreement matters
    two = torchrun_eval(corpus_and_tokenizer, tmp_path / "two", eval_text, "--fsdp", init_from=hf_mlm_checkpoint)
    single = tmp_path / "one"
    pretrain(eval_args(corpus_and_tokenizer, single, eval_text, batch_size=2, max_steps=2, eval_max_instances=10,
                       device="cpu", init_from=str(hf_mlm_checkpoint), tokenizer=None,
                       config=PretrainArgs().config))
    one = rows(single, "eval")[0]
    assert_same_evaluation(two, one)
    assert_loadable_model(tmp_path / "two" / "model")


def test_eval_loss_of_a_continued_checkpoint_equals_transformers_on_the_same_masks(corpus_and_tokenizer,
                                                                                 hf_mlm_checkpoint, tmp_path):
    """The held-out numbers at step 0 of a run continuing a transformers BertForMaskedLM: that model's own MLM loss
    and accuracy (transformers, dense logits) on the evaluation set's batches."""
    import torch.nn.functional as F

    transformers = pytest.importorskip("transformers")
    trainer = Pretrainer(init_args(corpus_and_tokenizer, tmp_path / "run", hf_mlm_checkpoint, nsp=False,
                                   eval_corpus=[str(corpus_and_tokenizer[0])], eval_max_instances=24))
    got = trainer.evaluation.evaluate(trainer.model)
    hf = transformers.BertForMaskedLM.from_pretrained(hf_mlm_checkpoint).eval()
    total = correct = count = 0
    with torch.no_grad():
        for batch in trainer.evaluation.batches:
            logits = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch["token_type_ids"]).logits
            keep = batch["labels"] != -100
            total += F.cross_entropy(logits[keep], batch["labels"][keep], reduction="sum").item()
            correct += int((logits[keep].argmax(-1) == batch["labels"][keep]).sum())
            count += int(keep.sum())
    assert got["eval_loss"] == pytest.approx(total / count, rel=1e-5)
    assert got["eval_mlm_accuracy"] == correct / count and "eval_nsp_accuracy" not in got
