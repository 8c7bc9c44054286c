"""`bertforge.model.config`: `BertConfig`'s presets, its validation naming the bad field, and config.json both ways."""

import pytest

from bertforge import BertConfig, BertforgeError

transformers = pytest.importorskip("transformers")


def test_presets():
    sizes = {name: (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size)
             for name in ("tiny", "mini", "small", "medium", "base", "large")
             for c in [BertConfig.preset(name)]}
    assert sizes["base"] == (12, 768, 12, 3072) and sizes["large"] == (24, 1024, 16, 4096)
    assert sizes["tiny"] == (2, 128, 2, 512) and sizes["mini"] == (4, 256, 4, 1024)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(hidden_size=100, num_attention_heads=3), "hidden_size"),
        (dict(vocab_size=-5), "vocab_size"),
        (dict(vocab_size=10**9), "vocab_size"),
        (dict(num_hidden_layers="12"), "num_hidden_layers"),
        (dict(hidden_act="swiglu"), "hidden_act"),
        (dict(hidden_dropout_prob=1.5), "hidden_dropout_prob"),
        (dict(pad_token_id=40000), "pad_token_id"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(BertforgeError, match=field):
        BertConfig(**kwargs)


def test_config_round_trip_and_transformers_reads_it(tmp_path):
    cfg = BertConfig.preset("mini", id2label={0: "neg", 1: "pos"})
    cfg.save_pretrained(tmp_path)
    again = BertConfig.from_pretrained(tmp_path)
    assert again == cfg
    hf = transformers.BertConfig.from_pretrained(tmp_path)
    assert hf.hidden_size == 256 and hf.id2label == {0: "neg", 1: "pos"}
    with pytest.raises(BertforgeError, match="unknown config preset"):
        BertConfig.preset("gigantic")


def test_check_sequence_length_names_the_real_limit():
    bert = BertConfig(max_position_embeddings=64)
    bert.check_sequence_length(64, "--max-length")
    with pytest.raises(BertforgeError, match=r"^--max-length 65 exceeds the longest sequence the model takes \(64, "
                                             r"from its max_position_embeddings 64\)$"):
        bert.check_sequence_length(65, "--max-length")
    roberta = BertConfig(model_type="roberta", max_position_embeddings=128, pad_token_id=1)
    roberta.check_sequence_length(126, "--max-length")
    with pytest.raises(BertforgeError, match=r"--max-length 127 exceeds .* \(126, from its max_position_embeddings 128 "
                                             r"less the 2 positions its family skips\)"):
        roberta.check_sequence_length(127, "--max-length")
