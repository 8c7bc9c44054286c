"""`EncoderSpec`: a bad choice is refused in one line naming it; BERT's families read their configs into specs
that differ exactly where the families do."""

import pytest

from bertforge import BertConfig, BertforgeError
from bertforge.model import EncoderSpec, LayerAttention, RelativeAttention

BASE = dict(vocab_size=50, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=64, activation="gelu",
            max_positions=64)


@pytest.mark.parametrize("change, message", [
    (dict(positions="rotary"), "positions 'rotary'"),
    (dict(norm="sandwich"), "norm 'sandwich'"),
    (dict(ffn="moe"), "ffn 'moe'"),
    (dict(init="xavier"), "init 'xavier'"),
    (dict(layers=(LayerAttention(),)), "1 layer attentions for 3 layers"),
    (dict(layers=(LayerAttention(), LayerAttention(window=0), LayerAttention())), "layer 1's window"),
    (dict(layers=(LayerAttention(rope_theta=-1.0),) * 3), "rope_theta must be positive"),
    (dict(hidden_size=36, num_heads=4, layers=(LayerAttention(rope_theta=1e4),) * 3), "even head size"),
    (dict(relative=RelativeAttention(terms=("c2p", "p2p"))), "relative terms"),
    (dict(relative=RelativeAttention(buckets=0, max_distance=0)), "position_buckets or max_relative_positions"),
])
def test_a_bad_spec_is_refused_naming_what_is_wrong(change, message):
    with pytest.raises(BertforgeError, match=message.replace("(", r"\(")):
        EncoderSpec(**{**BASE, **change})


def test_layer_kinds_and_the_sharing_schedule():
    spec = EncoderSpec(**BASE, layers=(LayerAttention(rope_theta=1e4), LayerAttention(window=8), LayerAttention()))
    assert spec.layer(1).window == 8 and spec.layer(0).rope_theta == 1e4
    assert EncoderSpec(**BASE).layer(2) == LayerAttention()  # no layers given: every block global
    assert EncoderSpec(**BASE).schedule == [0, 1, 2]
    assert EncoderSpec(**{**BASE, "num_layers": 6}, layer_groups=2).schedule == [0, 0, 0, 1, 1, 1]
    assert RelativeAttention(buckets=256).span == 256 and RelativeAttention(buckets=0, max_distance=128).span == 128


def test_each_family_reads_its_config_into_the_parts_it_changes():
    specs = {name: BertConfig.preset(name, vocab_size=100).spec
             for name in ("tiny", "roberta-tiny", "distilbert-tiny", "albert-tiny")}
    bert = specs["tiny"]
    assert (bert.positions, bert.norm, bert.ffn, bert.pooler, bert.type_vocab_size) == ("absolute", "post", "dense", True, 2)
    assert specs["roberta-tiny"].positions == "after-padding" and specs["roberta-tiny"].type_vocab_size == 1
    assert specs["distilbert-tiny"].pooler is False and specs["distilbert-tiny"].type_vocab_size == 0
    albert = specs["albert-tiny"]
    assert albert.layer_groups == 1 and albert.embedding_dim == 64 < albert.hidden_size
