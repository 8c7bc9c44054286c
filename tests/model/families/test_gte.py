"""GTE beyond `test_family.py`'s checks for every family: no token types (gte-base-en-v1.5), dropout inside the
gated feed-forward, its fused `up_gate_proj` (up first) and the in-memory layout."""

import pytest
import torch
from safetensors.torch import load_file, save_file

import bertforge

from tests.model.families.families_helpers import TASKS, assert_close, padded_batch

transformers = pytest.importorskip("transformers")


def hf_config(**kw):
    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40,
                max_position_embeddings=64, hidden_dropout_prob=0.0, num_labels=3, pad_token_id=0)
    return transformers.GteConfig(**{**base, **kw})


@pytest.mark.parametrize("task", ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"])
def test_no_token_types_and_another_theta(tmp_path, task):
    torch.manual_seed(0)
    hf_class = getattr(transformers, "Gte" + task)
    ref = hf_class(hf_config(type_vocab_size=0, rope_parameters={"rope_type": "default", "rope_theta": 500.0})).eval()
    ref.save_pretrained(tmp_path)
    ours = TASKS[task].from_pretrained(tmp_path).eval()
    assert ours.base_model.embeddings.token_type_embeddings is None and ours.base_model.spec.layers[0].rope_theta == 500.0
    ids, mask = padded_batch()
    with torch.no_grad():
        assert_close(ref(input_ids=ids, attention_mask=mask), ours(ids, mask), mask)
    ours.save_pretrained(tmp_path / "ours")
    back, info = hf_class.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_up_gate_proj_holds_up_first_and_the_in_memory_layout_loads(tmp_path):
    torch.manual_seed(0)
    ref = transformers.GteForMaskedLM(hf_config()).eval()
    ref.save_pretrained(tmp_path)
    fused = load_file(tmp_path / "model.safetensors")["gte.encoder.layer.0.mlp.up_gate_proj.weight"]
    assert torch.equal(fused[:40], ref.gte.layers[0].mlp.up_proj.weight)
    ours = bertforge.AutoModelForMaskedLM.from_pretrained(tmp_path)
    assert torch.equal(ours.bert.encoder.layer[0].intermediate.dense.weight[:40], ref.gte.layers[0].mlp.gate_proj.weight)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items() if "decoder.weight" not in k},
              tmp_path / "model.safetensors")
    native = bertforge.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert native.loading_info.missing_keys == [] and native.loading_info.unexpected_keys == []
    ids, mask = padded_batch()
    with torch.no_grad():
        assert_close(ref(input_ids=ids, attention_mask=mask), native(ids, mask), mask)


def test_training_mode_drops_out_inside_the_gated_feed_forward():
    config = bertforge.BertConfig.from_dict({"model_type": "gte", "vocab_size": 50, "hidden_size": 32,
                                             "num_hidden_layers": 1, "num_attention_heads": 4,
                                             "intermediate_size": 40, "hidden_dropout_prob": 0.25})
    assert config.spec.ffn_inner_dropout == 0.25 and config.spec.ffn_out_bias and not config.spec.mlp_bias
