"""`bertforge.model.auto`: the Auto classes dispatch on the config's `model_type`, build the family's parts, pass config
overrides and loader options through `from_pretrained`, and refuse an unsupported family naming the supported ones."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from bertforge import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertforge.core.errors import BertforgeError
from bertforge.model.families import FAMILIES

SMALL = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


def preset(model_type: str, **overrides) -> BertConfig:
    return BertConfig.preset("tiny" if model_type == "bert" else f"{model_type}-tiny", **{**SMALL, **overrides})


@pytest.mark.parametrize("model_type, cls", [("bert", BertForPreTraining), ("albert", BertForPreTraining),
                                             ("roberta", BertForMaskedLM), ("xlm-roberta", BertForMaskedLM),
                                             ("distilbert", BertForMaskedLM)])
def test_pretraining_class_follows_the_family(model_type, cls):
    config = preset(model_type)
    assert AutoModelForPreTraining.model_class(config) is cls
    model = AutoModelForPreTraining.from_config(config)
    assert type(model) is cls and model.config.model_type == model_type


@pytest.mark.parametrize("auto, cls", [(AutoModel, BertModel), (AutoModelForMaskedLM, BertForMaskedLM),
                                       (AutoModelForSequenceClassification, BertForSequenceClassification),
                                       (AutoModelForTokenClassification, BertForTokenClassification),
                                       (AutoModelForQuestionAnswering, BertForQuestionAnswering)])
def test_task_classes_are_one_class_for_every_family(auto, cls):
    for model_type in FAMILIES:
        assert auto.model_class(preset(model_type)) is cls


def test_from_config_builds_the_family_parts():
    names = {t: {n for n, _ in AutoModel.from_config(preset(t)).named_parameters()} for t in FAMILIES}
    assert any("token_type" in n for n in names["bert"]) and any("pooler" in n for n in names["bert"])
    assert not any("token_type" in n for n in names["distilbert"])
    assert not any("pooler" in n for n in names["distilbert"])
    albert = AutoModel.from_config(preset("albert", embedding_size=16))
    assert albert.embeddings.word_embeddings.weight.shape == (100, 16)  # E -> H factorisation
    assert any(tuple(p.shape) == (32, 16) for p in albert.parameters())  # the projection
    assert sum(p.numel() for p in albert.parameters()) < sum(p.numel() for p in AutoModel.from_config(
        preset("bert")).parameters())  # one shared layer group
    roberta = AutoModel.from_config(preset("roberta"))
    assert roberta.config.position_offset == roberta.config.pad_token_id + 1


def test_auto_config_for_model_and_from_pretrained(tmp_path):
    config = AutoConfig.for_model("roberta", **SMALL)
    assert config.model_type == "roberta" and config.hidden_size == 32
    assert config.family is FAMILIES["roberta"]
    AutoModelForMaskedLM.from_config(config).save_pretrained(tmp_path)
    again = AutoConfig.from_pretrained(tmp_path, num_labels=4)
    assert again.model_type == "roberta" and again.num_labels == 4 and again.hidden_size == 32


@pytest.mark.parametrize("model_type", ["bert", "roberta", "distilbert", "albert"])
def test_from_pretrained_round_trip_and_overrides(tmp_path, model_type, caplog):
    torch.manual_seed(0)
    saved = AutoModelForMaskedLM.from_config(preset(model_type)).eval()
    saved.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == model_type

    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is BertForMaskedLM and loaded.config.model_type == model_type
    ids = torch.randint(5, 100, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, saved(ids).logits)

    with caplog.at_level(logging.WARNING, logger="bertforge"):
        clf = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3, quiet=True)
    assert type(clf) is BertForSequenceClassification and clf.config.num_labels == 3
    assert clf.loading_info.missing_keys and "newly initialised" not in caplog.text  # quiet passed to the loader
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    assert "newly initialised" in caplog.text


def test_ignore_mismatched_sizes_reaches_the_loader(tmp_path):
    AutoModelForSequenceClassification.from_config(preset("bert", num_labels=2)).save_pretrained(tmp_path)
    with pytest.raises(BertforgeError, match="ignore_mismatched_sizes"):
        AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=5, ignore_mismatched_sizes=True,
                                                              quiet=True)
    assert model.config.num_labels == 5 and model.loading_info.mismatched_keys


def test_unsupported_model_type_is_refused_naming_the_supported(tmp_path):
    with pytest.raises(BertforgeError) as info:
        AutoConfig.for_model("gpt2")
    assert "'gpt2'" in str(info.value) and all(t in str(info.value) for t in FAMILIES)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deberta", **SMALL}))
    with pytest.raises(BertforgeError) as info:
        AutoModelForMaskedLM.from_pretrained(tmp_path)
    assert "'deberta'" in str(info.value) and all(t in str(info.value) for t in FAMILIES)


@pytest.mark.parametrize("model_type", ["bert", "roberta", "distilbert"])
def test_multiple_choice_loads_from_and_saves_to_transformers_auto_class(tmp_path, model_type):
    """`AutoModelForMultipleChoice` reads what `transformers`' AutoModelForMultipleChoice writes, and the other way
    round, with no missing keys and the same logits [B, C] (weights drawn wide, so that the logits differ)."""
    import transformers

    from bertforge import AutoModelForMultipleChoice
    from tests.model.families.test_family import hf_config, inputs

    torch.manual_seed(0)
    theirs = transformers.AutoModelForMultipleChoice.from_config(hf_config(model_type, 2)).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    theirs.save_pretrained(tmp_path / "hf")
    ours = AutoModelForMultipleChoice.from_pretrained(tmp_path / "hf").eval()
    assert ours.loading_info.missing_keys == [] and ours.loading_info.unexpected_keys == []
    ids, mask = inputs(ours.config)
    ids, mask = torch.cat([ids, ids.flip(0)]).view(2, 3, -1), torch.cat([mask, mask.flip(0)]).view(2, 3, -1)
    ours.save_pretrained(tmp_path / "ours")
    back, info = transformers.AutoModelForMultipleChoice.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert type(back) is type(theirs) and not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
        again = back.eval()(input_ids=ids, attention_mask=mask).logits
    assert got.shape == (2, 3) and float(expected.std()) > 0.1
    assert (expected - got).abs().max().item() <= 1e-5 and (again - got).abs().max().item() <= 1e-5
