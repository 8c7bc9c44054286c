"""BERT's member: the encoder as it is — no renaming, BERT's parts in its spec."""

from bertforge import BertConfig
from bertforge.model.families import BERT


def test_bert_keys_are_the_encoder_names_and_its_spec_is_bert():
    key = "bert.encoder.layer.0.attention.self.query.weight"
    assert BERT.to_internal(key) == key and BERT.to_hf(key) == key
    assert BERT.to_internal("encoder.layer.1.output.dense.bias") == "bert.encoder.layer.1.output.dense.bias"  # bare
    assert BERT.architecture("BertForMaskedLM") == "BertForMaskedLM"
    spec = BertConfig.preset("tiny").spec
    assert (spec.norm, spec.ffn, spec.positions, spec.relative, spec.final_norm, spec.init) == (
        "post", "dense", "absolute", None, False, "normal")
