"""`bertforge.model.memory`: the parameter count matches the real models of every family, the activation estimate's
shape, and `check_training_fits` refuses a run that cannot fit with a batch size that would."""

from __future__ import annotations

import pytest
import torch

from bertforge import AutoModelForPreTraining, BertConfig, BertForPreTraining, BertForSequenceClassification
from bertforge.core.errors import BertforgeError
from bertforge.model.memory import (
    BYTES_PER_PARAMETER,
    activation_bytes_per_sequence,
    available_memory,
    check_fits,
    check_training_fits,
    estimate_training_memory,
    parameter_count,
)
from bertforge.core.system import SKIP_MEMORY_CHECK, Switches, apply_switches, read_switches
from bertforge.model import BertForMaskedLM

FAMILY_PRESETS = ["tiny", "roberta-tiny", "xlm-roberta-tiny", "albert-tiny", "distilbert-tiny"]


def real_count(cls, config) -> int:
    with torch.device("meta"):  # no storage: the count is all we need
        model = cls(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_pretraining_count_is_the_pretraining_class_of_the_family(preset):
    config = BertConfig.preset(preset, vocab_size=1000)
    cls = AutoModelForPreTraining.model_class(config)
    assert cls is (BertForPreTraining if config.family.sentence_head else BertForMaskedLM)
    assert parameter_count(config, "pretraining") == real_count(cls, config)


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
@pytest.mark.parametrize("num_labels", [2, 7])
def test_classification_count_is_the_sequence_classifier(preset, num_labels):
    config = BertConfig.preset(preset, vocab_size=1000, num_labels=num_labels)
    assert parameter_count(config, "classification") == real_count(BertForSequenceClassification, config)
    other = BertConfig.preset(preset, vocab_size=1000)
    assert parameter_count(other, "classification", num_labels=num_labels) == parameter_count(config, "classification")


def test_albert_counts_shared_layers_once_and_the_embedding_projection():
    one = BertConfig.preset("albert-tiny", vocab_size=1000)
    deeper = BertConfig.preset("albert-tiny", vocab_size=1000, num_hidden_layers=6)
    assert one.embedding_dim != one.hidden_size  # E -> H projection present
    assert parameter_count(deeper, "pretraining") == parameter_count(one, "pretraining")  # layers shared
    assert parameter_count(deeper) == real_count(BertForPreTraining, deeper)
    bert = BertConfig.preset("tiny", vocab_size=1000, num_hidden_layers=6)
    assert parameter_count(bert) > parameter_count(BertConfig.preset("tiny", vocab_size=1000))


def test_distilbert_has_no_token_types_and_no_pooler():
    config = BertConfig.preset("distilbert-tiny", vocab_size=1000)
    with torch.device("meta"):
        model = BertForMaskedLM(config)
    names = [n for n, _ in model.named_parameters()]
    assert not any("token_type" in n or "pooler" in n for n in names)
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())


def test_activation_estimate_grows_with_the_sequence_and_checkpointing_saves():
    config = BertConfig.preset("mini", vocab_size=1000)
    short, long = activation_bytes_per_sequence(config, 64), activation_bytes_per_sequence(config, 128)
    assert long > 2 * short  # the S² attention term
    assert activation_bytes_per_sequence(config, 128, gradient_checkpointing=True) < long
    assert activation_bytes_per_sequence(config, 128, head="classification") < long  # no MLM logits
    est = estimate_training_memory(config, 8, 128)
    assert est.state_bytes == est.parameters * BYTES_PER_PARAMETER
    assert est.total == est.state_bytes + 8 * est.per_sequence
    assert estimate_training_memory(config, 8, 128, shards=4).state_bytes == est.state_bytes // 4


def test_check_training_fits_refuses_an_absurd_batch_naming_one_that_fits(monkeypatch):
    """The host's free memory is fixed here (8 GiB): read twice from the machine, it changed in between on a loaded
    host, and the batch size named as fitting by the first read did not fit the second (a flaky test)."""
    from bertforge.model import memory

    monkeypatch.delenv(SKIP_MEMORY_CHECK, raising=False)
    monkeypatch.setattr(memory, "available_memory", lambda device: (8 << 30, "host"))
    config = BertConfig.preset("tiny", vocab_size=1000)
    est = check_training_fits(config, 2, 64, "cpu")  # a tiny run fits on any host
    assert est.batch_size == 2
    with pytest.raises(BertforgeError) as info:
        check_training_fits(config, 10**9, 512, "cpu")
    message = str(info.value)
    assert "--batch-size" in message and SKIP_MEMORY_CHECK in message
    fit = int(message.split("--batch-size ")[1].split()[0])
    assert 1 <= fit < 10**9
    # the named batch size does fit: the same numbers, that batch, pass
    big = estimate_training_memory(config, 10**9, 512)
    available, where = memory.available_memory("cpu")
    check_fits(estimate_training_memory(config, fit, 512), available, where, "training")
    assert big.total > available
    with pytest.raises(BertforgeError):  # the largest: one more does not fit
        check_fits(estimate_training_memory(config, fit + 1, 512), available, where, "training")


def test_available_memory_reads_the_host():
    available, where = available_memory("cpu")
    assert where.startswith("host") and (available is None or available > 0)


def test_check_fits_hints_and_skip(monkeypatch):
    monkeypatch.delenv(SKIP_MEMORY_CHECK, raising=False)
    config = BertConfig.preset("tiny", vocab_size=1000)
    est = estimate_training_memory(config, 64, 128)
    room = est.state_bytes + 10 * est.per_sequence  # room for 10 sequences
    with pytest.raises(BertforgeError, match=r"--batch-size 10 .*--gradient-checkpointing"):
        check_fits(est, room, "GPU cuda:0", "pretraining")
    with pytest.raises(BertforgeError, match="parameters alone do not fit"):
        check_fits(est, est.state_bytes // 2, "GPU cuda:0", "pretraining")
    check_fits(est, None, "host", "pretraining")  # unknown memory: no refusal
    check_fits(est, est.total, "host", "pretraining")  # exactly enough
    monkeypatch.setenv(SKIP_MEMORY_CHECK, "1")
    try:
        apply_switches(read_switches())  # what setup_runtime does with the environment
        check_fits(est, 1, "host", "pretraining")
    finally:
        apply_switches(Switches())
