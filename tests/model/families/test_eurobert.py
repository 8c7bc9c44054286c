"""EuroBERT beyond `test_family.py`'s checks for every family: each `classifier_pooling`, a tied decoder, biases
(`attention_bias`, `mlp_bias`), no grouped-query attention, its separate gate and up projections, the presets and
what it refuses."""

import pytest
import torch
from safetensors.torch import load_file

import bertforge
from bertforge import BertConfig, BertforgeError
from bertforge.model.attention import pack

from tests.model.families.families_helpers import TASKS, assert_close, padded_batch

transformers = pytest.importorskip("transformers")


def hf_config(**kw):
    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=40, max_position_embeddings=64, num_labels=3, pad_token_id=0, mask_token_id=3)
    return transformers.EuroBertConfig(**{**base, **kw})


def round_trip(tmp_path, hf_class, config, packed: bool = False):
    """`transformers`' model saved, loaded here with the same outputs, saved back with no key missing or unexpected."""
    torch.manual_seed(0)
    ref = hf_class(config).eval()
    ref.save_pretrained(tmp_path)
    ours = TASKS[hf_class.__name__.removeprefix("EuroBert")].from_pretrained(tmp_path).eval()
    assert ours.loading_info.missing_keys == [] and ours.loading_info.unexpected_keys == []
    ids, mask = padded_batch()
    with torch.no_grad():
        assert_close(ref(input_ids=ids, attention_mask=mask), ours(ids, mask), mask)
        if packed:
            rows = [row[: int(m.sum())].tolist() for row, m in zip(ids, mask)]
            batch = pack(rows)
            logits = ours.packed_logits(ours.bert.forward_packed(batch), batch)
            assert (logits - ref(input_ids=ids, attention_mask=mask).logits).abs().max() <= 1e-5
    ours.save_pretrained(tmp_path / "ours")
    back, info = hf_class.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return ours


@pytest.mark.parametrize("pooling", ["bos", "mean", "late"])
def test_every_classifier_pooling_padded_and_packed(tmp_path, pooling):
    ours = round_trip(tmp_path, transformers.EuroBertForSequenceClassification, hf_config(classifier_pooling=pooling),
                      packed=True)
    assert ours.bert.spec.heads.pooling == {"bos": "cls", "mean": "mean", "late": "late"}[pooling]
    assert ours.head_transform.LayerNorm is None  # dense → GELU, no norm


@pytest.mark.parametrize("task", ["ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"])
def test_biases_and_every_head_attending_its_own_key(tmp_path, task):
    ours = round_trip(tmp_path, getattr(transformers, "EuroBert" + task),
                      hf_config(attention_bias=True, mlp_bias=True, num_key_value_heads=4))
    assert ours.bert.spec.kv_heads == 4 and ours.bert.spec.attention_bias and ours.bert.spec.mlp_bias


def test_a_tied_decoder_is_the_word_embeddings(tmp_path):
    ours = round_trip(tmp_path, transformers.EuroBertForMaskedLM, hf_config(tie_word_embeddings=True))
    assert ours.cls.predictions.decoder is None
    assert "lm_head.weight" not in load_file(tmp_path / "ours" / "model.safetensors")


def test_an_untied_decoder_is_its_own_weight_and_gate_comes_first(tmp_path):
    ours = round_trip(tmp_path, transformers.EuroBertForMaskedLM, hf_config())
    ref = transformers.EuroBertForMaskedLM.from_pretrained(tmp_path)
    assert torch.equal(ours.cls.predictions.decoder, ref.lm_head.weight)
    assert ours.cls.predictions.transform is None and ours.cls.predictions.bias is None
    gated = ours.bert.encoder.layer[0].intermediate.dense.weight
    assert torch.equal(gated[:40], ref.model.layers[0].mlp.gate_proj.weight)
    assert torch.equal(gated[40:], ref.model.layers[0].mlp.up_proj.weight)
    assert ours.bert.embeddings.LayerNorm is None and ours.bert.encoder.final_norm is not None


def test_config_json_is_transformers_spelling(tmp_path):
    config = BertConfig.preset("eurobert-tiny", vocab_size=99)
    config.save_pretrained(tmp_path)
    ref = transformers.EuroBertConfig.from_pretrained(tmp_path)
    assert ref.rope_parameters["rope_theta"] == 250_000.0 and ref.rms_norm_eps == 1e-5
    assert ref.num_key_value_heads == ref.num_attention_heads == config.num_attention_heads
    assert not ref.tie_word_embeddings and ref.classifier_pooling == "late" and ref.bos_token_id is None


def test_the_published_shapes():
    """The base model's parameters (as the names count them) with EuroBERT's 128,256-token vocabulary."""
    for size, params in (("210m", 210e6), ("610m", 610e6), ("2.1b", 2.1e9)):
        config = BertConfig.preset(f"eurobert-{size}", vocab_size=128256)
        with torch.device("meta"):
            n = bertforge.BertModel(config).num_parameters()
        assert abs(n - params) / params < 0.03, (size, n)
    assert BertConfig.preset("eurobert-610m").spec.kv_heads == 6
    assert BertConfig.preset("eurobert-210m").spec.kv_heads == 12


@pytest.mark.parametrize("field, value, message", [
    ("classifier_pooling", "max", "classifier_pooling"),
    ("num_key_value_heads", 3, "num_key_value_heads"),
    ("head_dim", 16, "head_dim"),
    ("pretraining_tp", 2, "pretraining_tp"),
])
def test_settings_it_cannot_follow_are_refused_by_name(field, value, message):
    data = {"model_type": "eurobert", "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 40, "pad_token_id": 0, field: value}
    with pytest.raises(BertforgeError, match=message):
        BertConfig.from_dict(data)
