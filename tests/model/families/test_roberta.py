"""RoBERTa's own part: positions counted after the padding id; its names for the MLM head."""

import pytest
import torch

import bertforge
from bertforge import BertConfig
from bertforge.model.families import ROBERTA, XLM_ROBERTA


def test_roberta_positions_skip_padding():
    """RoBERTa counts positions from pad_token_id + 1 over the real tokens; padding keeps pad_token_id."""
    config = BertConfig.preset("roberta-tiny", vocab_size=50)
    model = bertforge.AutoModel.from_config(config).eval()
    ids = torch.tensor([[0, 7, 8, 2, 1, 1]])
    from bertforge.model import padded_position_ids

    assert padded_position_ids(ids, 1).tolist() == [[2, 3, 4, 5, 1, 1]]
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.full((1, 513), 5))  # 513 tokens need positions up to 514: one more than the table holds


def test_the_lm_head_names_map_both_ways_and_the_tied_decoder_is_dropped():
    assert ROBERTA.to_internal("lm_head.dense.weight") == "cls.predictions.transform.dense.weight"
    assert ROBERTA.to_hf("cls.predictions.transform.LayerNorm.bias") == "lm_head.layer_norm.bias"
    assert ROBERTA.to_internal("roberta.encoder.layer.3.output.dense.weight") == "bert.encoder.layer.3.output.dense.weight"
    assert XLM_ROBERTA.to_internal("lm_head.decoder.weight") is None
