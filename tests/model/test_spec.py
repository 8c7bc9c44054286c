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


def test_every_kind_of_part_is_a_registry_whose_names_are_the_specs():
    """A kind is a Literal of the spec and an entry of the registry beside its part, under the same names."""
    from typing import get_args

    from bertforge.model import encoder, parts, spec

    pairs = [(spec.NormName, parts.NORMS), (spec.FFNName, encoder.FEED_FORWARDS), (spec.RotaryName, parts.ROTARIES),
             (spec.InitName, parts.INIT_RULES), (spec.PositionName, spec.POSITIONS),
             (spec.PlacementName, spec.PLACEMENTS), (spec.ProjectionName, spec.PROJECTION_KINDS),
             (spec.SequenceHeadName, spec.SEQUENCE_KINDS)]
    for names, registry in pairs:
        assert set(get_args(names)) == set(registry), (names, sorted(registry))
    from bertforge.core.constants import POOLINGS
    from bertforge.model import heads, pooling

    assert set(pooling.POOLERS) == set(POOLINGS) and set(heads.PADDED_POOLERS) == set(spec.POOLINGS)


def test_the_encoder_and_the_models_never_compare_a_kind():
    """The encoder assembles its parts by looking each kind up: no `spec.KIND == "..."` in its modules."""
    import re
    from pathlib import Path

    import bertforge.model as model_package

    kinds = "positions|norm|norm_kind|ffn|projection|init|rotary|heads\\.sequence|heads\\.pooling"
    pattern = re.compile(rf"spec\.({kinds})\s*(==|!=|in\b)")
    root = Path(model_package.__file__).parent
    for name in ("encoder.py", "models.py", "parts.py", "attention.py", "heads.py"):
        text = (root / name).read_text()
        assert not pattern.search(text), (name, pattern.search(text))


@pytest.mark.parametrize("change, message", [
    (dict(norm_kind="batchnorm"), "norm_kind 'batchnorm'"),
    (dict(rotary="complex"), "rotary 'complex'"),
    (dict(norm_kind="rmsnorm"), "a rmsnorm norm has no bias"),
])
def test_a_bad_kind_of_part_is_refused(change, message):
    with pytest.raises(BertforgeError, match=message):
        EncoderSpec(**BASE, **change)
