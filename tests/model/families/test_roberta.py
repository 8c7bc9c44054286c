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


def test_the_lm_head_bias_is_read_and_written_under_lm_head_bias(tmp_path):
    """RoBERTa's MLM bias rule, directly: `lm_head.bias` is the vocabulary bias (cls.predictions.bias); the decoder's
    bias, tied to it in transformers and kept in older files, is dropped. transformers initialises the bias to zero,
    so a parity test on a fresh model cannot see the rule broken: here the bias is random, a file carrying the
    decoder's copy too loads the same, and what bertforge saves transformers reads back with that bias."""
    from safetensors.torch import load_file, save_file

    transformers = pytest.importorskip("transformers")
    assert ROBERTA.to_internal("lm_head.bias") == "cls.predictions.bias"
    assert ROBERTA.to_hf("cls.predictions.bias") == "lm_head.bias"
    assert ROBERTA.to_internal("lm_head.decoder.bias") is None
    config = transformers.RobertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                        intermediate_size=37, max_position_embeddings=40, pad_token_id=1)
    torch.manual_seed(0)
    ref = transformers.RobertaForMaskedLM(config).eval()
    with torch.no_grad():
        ref.lm_head.bias.normal_()
    ref.save_pretrained(tmp_path / "hf")
    state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    save_file({**state, "lm_head.decoder.bias": state["lm_head.bias"].clone()}, str(tmp_path / "hf" / "model.safetensors"),
              metadata={"format": "pt"})
    ours = bertforge.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    assert ours.loading_info.missing_keys == [] and ours.loading_info.unexpected_keys == []
    assert torch.equal(ours.cls.predictions.bias, ref.lm_head.bias)
    ids = torch.randint(3, 99, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids)["logits"], ref(input_ids=ids).logits, atol=1e-5, rtol=0)
    ours.save_pretrained(tmp_path / "ours")
    saved = load_file(str(tmp_path / "ours" / "model.safetensors"))
    assert torch.equal(saved["lm_head.bias"], ref.lm_head.bias) and "lm_head.decoder.bias" not in saved
    back = transformers.RobertaForMaskedLM.from_pretrained(tmp_path / "ours").eval()
    assert torch.equal(back.lm_head.bias, ref.lm_head.bias)
