"""jina-embeddings-v3 beyond `test_family.py`'s checks for every family: its own fused layout (`mixer.Wqkv`, what
`transformers` writes) and the in-memory one both load, another θ, and positions that start at 0 whatever the
padding id (no RoBERTa offset)."""

import pytest
import torch
from safetensors.torch import load_file, save_file

import bertforge

from tests.model.families.families_helpers import TASKS, assert_close, padded_batch

transformers = pytest.importorskip("transformers")


def hf_config(**kw):
    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40,
                max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)
    return transformers.JinaEmbeddingsV3Config(**{**base, **kw})


@pytest.mark.parametrize("task", ["Model", "ForMaskedLM", "ForSequenceClassification"])
def test_another_theta_and_positions_from_zero(tmp_path, task):
    torch.manual_seed(0)
    hf_class = getattr(transformers, "JinaEmbeddingsV3" + task)
    ref = hf_class(hf_config(rope_parameters={"rope_type": "default", "rope_theta": 500.0})).eval()
    ref.save_pretrained(tmp_path)
    ours = TASKS[task].from_pretrained(tmp_path).eval()
    spec = ours.base_model.spec
    assert spec.layers[0].rope_theta == 500.0 and spec.position_offset == 0 and spec.pad_token_id == 1
    ids, mask = padded_batch(pad=1)
    with torch.no_grad():
        assert_close(ref(input_ids=ids, attention_mask=mask), ours(ids, mask), mask)
    ours.save_pretrained(tmp_path / "ours")
    back, info = hf_class.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_its_fused_layout_is_written_and_the_in_memory_layout_loads(tmp_path):
    torch.manual_seed(0)
    ref = transformers.JinaEmbeddingsV3ForMaskedLM(hf_config()).eval()
    ref.save_pretrained(tmp_path)
    fused = load_file(tmp_path / "model.safetensors")["roberta.encoder.layers.0.mixer.Wqkv.weight"]
    assert torch.equal(fused[32:64], ref.roberta.layers[0].self_attn.k_proj.weight)
    ours = bertforge.AutoModelForMaskedLM.from_pretrained(tmp_path)
    ours.save_pretrained(tmp_path / "ours")
    assert torch.equal(load_file(tmp_path / "ours" / "model.safetensors")["roberta.encoder.layers.0.mixer.Wqkv.weight"],
                       fused)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items() if "decoder" not in k},
              tmp_path / "model.safetensors")
    native = bertforge.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert native.loading_info.missing_keys == [] and native.loading_info.unexpected_keys == []
    ids, mask = padded_batch(pad=1)
    with torch.no_grad():
        assert_close(ref(input_ids=ids, attention_mask=mask), native(ids, mask), mask)


def test_the_preset_alias_and_recipe():
    config = bertforge.BertConfig.preset("jina-v3-tiny")
    assert config.model_type == "jina_embeddings_v3" and config.spec.position_kind.table is False
    assert config.family.tokenizer_kind == "xlm-roberta" and config.to_dict()["rope_parameters"]["rope_theta"] == 20000.0
