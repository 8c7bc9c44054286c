"""ELECTRA beyond `test_family.py`'s checks for every family: its names both ways, the presets' embedding width,
E = H without a projection (electra-base's shape) and `embedding_size` always written."""

import json

import pytest
import torch

import bertforge
from bertforge import BertConfig
from bertforge.model.families import ELECTRA

from tests.model.families.families_helpers import TASKS, assert_close, padded_batch

transformers = pytest.importorskip("transformers")


def test_electra_names_map_both_ways():
    pairs = {"electra.embeddings_project.weight": "bert.encoder.embedding_projection.weight",
             "discriminator_predictions.dense.bias": "mask_predictions.dense.bias",
             "discriminator_predictions.dense_prediction.weight": "mask_predictions.classifier.weight",
             "generator_predictions.LayerNorm.weight": "cls.predictions.transform.LayerNorm.weight",
             "generator_lm_head.bias": "cls.predictions.bias"}
    for hf, internal in pairs.items():
        assert ELECTRA.to_internal(hf) == internal and ELECTRA.to_hf(internal) == hf
    assert ELECTRA.to_internal("generator_lm_head.weight") is None  # tied to the word table
    assert ELECTRA.architecture("BertForReplacedTokenDetection") == "ElectraForPreTraining"
    assert ELECTRA.internal_architecture("ElectraForPreTraining") == "BertForReplacedTokenDetection"


def test_presets_narrow_the_embeddings_below_base_size_only():
    assert [BertConfig.preset(f"electra-{s}").embedding_size for s in ("tiny", "small", "base", "large")] == [
        64, 128, 768, 1024]
    assert BertConfig.preset("electra-base").spec.embedding_dim == 768  # E = H: no projection


@pytest.mark.parametrize("task", ["Model", "ForMaskedLM", "ForSequenceClassification"])
def test_embeddings_as_wide_as_the_hidden_states_have_no_projection(tmp_path, task):
    torch.manual_seed(0)
    hf_class = getattr(transformers, "Electra" + task)
    ref = hf_class(transformers.ElectraConfig(vocab_size=99, embedding_size=32, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=4, intermediate_size=40, num_labels=3,
                                              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    ref.save_pretrained(tmp_path)
    ours = TASKS[task].from_pretrained(tmp_path).eval()
    assert ours.base_model.encoder.embedding_projection is None
    ids, mask = padded_batch()
    with torch.no_grad():
        assert_close(ref(input_ids=ids, attention_mask=mask), ours(ids, mask), mask)
    ours.save_pretrained(tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["embedding_size"] == 32
    _, info = hf_class.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_a_config_without_embedding_size_is_written_with_it(tmp_path):
    config = BertConfig.from_dict({"model_type": "electra", "hidden_size": 64, "num_attention_heads": 4,
                                   "embedding_size": None})
    config.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["embedding_size"] == 64
    assert transformers.AutoConfig.from_pretrained(tmp_path).embedding_size == 64
    assert bertforge.AutoConfig.from_pretrained(tmp_path).embedding_dim == 64
