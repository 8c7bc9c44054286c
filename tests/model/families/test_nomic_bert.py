"""NomicBERT beyond `test_family.py`'s checks for every family: both weight layouts (nomic-embed's fused `Wqkv` with
`fc11` / `fc12`, which `transformers` writes, and the separate projections it holds in memory), its rotary θ, and
the refusals."""

import pytest
import torch
from safetensors.torch import load_file, save_file

import bertforge
from bertforge import BertConfig, BertforgeError

from tests.model.families.families_helpers import assert_close, padded_batch

transformers = pytest.importorskip("transformers")


def hf_config(**kw):
    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40,
                max_position_embeddings=64, num_labels=3)
    return transformers.NomicBertConfig(**{**base, **kw})


def test_the_file_layout_is_nomic_embeds_and_gate_comes_from_fc12(tmp_path):
    torch.manual_seed(0)
    ref = transformers.NomicBertForMaskedLM(hf_config()).eval()
    ref.save_pretrained(tmp_path)
    ours = bertforge.AutoModelForMaskedLM.from_pretrained(tmp_path)
    file = load_file(tmp_path / "model.safetensors")
    dense = ours.bert.encoder.layer[1].intermediate.dense.weight
    assert torch.equal(dense[:40], file["nomic_bert.encoder.layers.1.mlp.fc12.weight"])  # the gate
    assert torch.equal(dense[40:], ref.nomic_bert.layers[1].mlp.up_proj.weight)
    ours.save_pretrained(tmp_path / "ours")
    assert sorted(load_file(tmp_path / "ours" / "model.safetensors")) == sorted(file)


def test_the_in_memory_layout_loads_the_same_model(tmp_path):
    """A file of `transformers`' module names (`layers.N.self_attn.q_proj`, `mlp.gate_proj`, ...) loads too."""
    torch.manual_seed(0)
    ref = transformers.NomicBertForSequenceClassification(hf_config(rope_parameters={"rope_type": "default",
                                                                                      "rope_theta": 500.0})).eval()
    ref.save_pretrained(tmp_path)
    state = {k: v.contiguous() for k, v in ref.state_dict().items()}
    assert "nomic_bert.layers.0.self_attn.q_proj.weight" in state
    save_file(state, tmp_path / "model.safetensors")
    ours = bertforge.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert ours.loading_info.missing_keys == [] and ours.loading_info.unexpected_keys == []
    assert ours.base_model.spec.layers[0].rope_theta == 500.0
    ids, mask = padded_batch()
    with torch.no_grad():
        assert_close(ref(input_ids=ids, attention_mask=mask), ours(ids, mask), mask)


def test_theta_default_and_the_refused_rotary_kinds():
    config = BertConfig.from_dict({"model_type": "nomic_bert", "vocab_size": 50, "hidden_size": 32,
                                   "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 40})
    assert {layer.rope_theta for layer in config.spec.layers} == {1000.0}
    assert config.spec.ffn == "gated" and not config.spec.attention_bias and not config.spec.mlp_bias
    with pytest.raises(BertforgeError, match="rope_type 'dynamic' is not supported"):
        BertConfig.from_dict({"model_type": "nomic_bert", "vocab_size": 50,
                              "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1000.0, "factor": 2.0}})
    with pytest.raises(BertforgeError, match="head_dim"):
        BertConfig.from_dict({"model_type": "nomic_bert", "vocab_size": 50, "hidden_size": 32,
                              "num_attention_heads": 4, "head_dim": 16})
