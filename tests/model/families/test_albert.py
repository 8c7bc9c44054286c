"""ALBERT's parts: factorised embeddings and one shared layer group, named as ALBERT's files name them."""

from bertforge import BertConfig
from bertforge.model.families import ALBERT


def test_albert_group_names_map_both_ways():
    hf = "albert.encoder.albert_layer_groups.0.albert_layers.0.attention.query.weight"
    assert ALBERT.to_internal(hf) == "bert.encoder.layer.0.attention.self.query.weight"
    assert ALBERT.to_hf("bert.encoder.layer.0.attention.self.query.weight") == hf
    assert ALBERT.to_internal("albert.encoder.embedding_hidden_mapping_in.bias") == (
        "bert.encoder.embedding_projection.bias")


def test_albert_spec_shares_layers_and_narrows_embeddings():
    spec = BertConfig.preset("albert-base", vocab_size=100, num_hidden_layers=6).spec
    assert spec.schedule == [0] * 6 and spec.embedding_dim == 128 < spec.hidden_size
