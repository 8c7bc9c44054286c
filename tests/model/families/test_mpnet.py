"""MPNet against `transformers` itself beyond what `test_family.py` checks for every family: its relative-position
buckets at every distance (past `max_distance`), long rows, both attention backends, and its config.json."""

import json

import pytest
import torch

import bertforge
from bertforge import BertConfig
from bertforge.model.parts import bias_buckets
from bertforge.model.spec import RelativeBias

from tests.model.families.families_helpers import assert_close

transformers = pytest.importorskip("transformers")
from transformers.models.mpnet.modeling_mpnet import MPNetEncoder  # noqa: E402


@pytest.mark.parametrize("L", [1, 2, 9, 40, 300])
def test_buckets_equal_transformers_at_every_distance(L):
    pos = torch.arange(L)
    reference = MPNetEncoder.relative_position_bucket(pos[None, :] - pos[:, None])  # key - query, as MPNet takes it
    assert torch.equal(bias_buckets(L, RelativeBias()), reference)


def test_buckets_change_where_the_formula_says():
    """Both directions apart, distances below 8 exact, then log buckets up to 15 in each half."""
    index = bias_buckets(300, RelativeBias())
    assert index[5, 0].item() == 5 and index[0, 5].item() == 16 + 5
    assert index[299, 0].item() == 15 and index[0, 299].item() == 31 and index.max().item() == 31


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_long_padded_rows_equal_transformers(tmp_path, attn):
    """Rows of 200 and 150 tokens: distances past MPNet's max_distance of 128 read the last bucket; bertforge's
    SDPA path (a float mask of bias and padding) and explicit path both give transformers' numbers."""
    torch.manual_seed(0)
    config = transformers.MPNetConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=37, max_position_embeddings=256, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0)
    ref = transformers.MPNetModel(config).eval()  # its attention is always the explicit one
    ref.save_pretrained(tmp_path)
    ours = bertforge.AutoModel.from_pretrained(tmp_path, attn_implementation=attn).eval()
    ids = torch.randint(5, 99, (2, 200), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 150:] = 0
    ids = ids.masked_fill(mask == 0, 1)
    with torch.no_grad():
        assert_close(ref(input_ids=ids, attention_mask=mask), ours(ids, mask), mask)


def test_config_json_keeps_the_table_size_and_no_token_types(tmp_path):
    config = BertConfig.preset("mpnet-tiny", vocab_size=60, extra={"relative_attention_num_buckets": 48})
    assert config.spec.relative_bias == RelativeBias(buckets=32, max_distance=128, table=48)
    assert config.spec.type_vocab_size == 0 and config.position_offset == 2
    bertforge.AutoModelForMaskedLM.from_config(config).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["relative_attention_num_buckets"] == 48 and written["architectures"] == ["MPNetForMaskedLM"]
    assert "type_vocab_size" not in written and written["pad_token_id"] == 1
    model = transformers.MPNetForMaskedLM.from_pretrained(tmp_path)
    assert model.mpnet.encoder.relative_attention_bias.weight.shape == (48, 2)
