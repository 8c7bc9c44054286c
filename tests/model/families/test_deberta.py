"""DeBERTa-v2/v3 against `transformers` itself: relative attention with log buckets in its variants (shared keys or
separate position projections, c2p and/or p2c, absolute positions at the input or not, E < H projected before the
norm), both names of the MLM head, and the refusals."""

import pytest
import torch
from safetensors.torch import load_file, save_file

import bertforge
from bertforge import BertConfig, BertforgeError

from tests.model.families.families_helpers import TASKS, assert_close

transformers = pytest.importorskip("transformers")

V3 = dict(relative_attention=True, position_buckets=8, max_relative_positions=24, pos_att_type=["p2c", "c2p"],
          norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False)
VARIANTS = {
    "v3": {},
    "separate position projections": dict(share_att_key=False),
    "c2p only, no table norm": dict(pos_att_type=["c2p"], norm_rel_ebd="none"),
    "p2c string, no buckets": dict(pos_att_type="p2c", position_buckets=-1, max_relative_positions=6),
    "absolute positions too, token types": dict(position_biased_input=True, type_vocab_size=2),
    "E < H": dict(embedding_size=16),
}


def hf_config(num_labels=3, **kw):
    base = dict(vocab_size=99, max_position_embeddings=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-7,
                pad_token_id=0, num_labels=num_labels, **V3)
    base.update(kw)
    return transformers.DebertaV2Config(**base)


def batch(types: bool = False):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (3, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    mask[2, 4:] = 0
    extra = {"token_type_ids": (torch.arange(14) >= 7).long().expand(3, 14)} if types else {}
    return ids.masked_fill(mask == 0, 0), mask, extra



@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("task", list(TASKS))
def test_every_task_class_equals_transformers_and_saves_back(tmp_path, task, variant):
    torch.manual_seed(0)
    hf_class = getattr(transformers, "DebertaV2" + task)
    config = hf_config(2 if task == "ForQuestionAnswering" else 3, **VARIANTS[variant])
    ref = hf_class(config).eval()
    ref.save_pretrained(tmp_path / "hf")
    ours = TASKS[task].from_pretrained(tmp_path / "hf").eval()
    assert ours.loading_info.missing_keys == [] and ours.loading_info.unexpected_keys == []
    ids, mask, extra = batch(types=config.type_vocab_size > 0)
    with torch.no_grad():
        assert_close(ref(input_ids=ids, attention_mask=mask, **extra), ours(ids, mask, **extra), mask)
    ours.save_pretrained(tmp_path / "ours")
    back, info = hf_class.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    with torch.no_grad():
        assert_close(back.eval()(input_ids=ids, attention_mask=mask, **extra), ours(ids, mask, **extra), mask)


def test_the_mlm_head_loads_under_microsofts_names_too(tmp_path):
    """`lm_predictions.lm_head.*` (Microsoft's checkpoints, and transformers with legacy=False) loads as the MLM head;
    bertforge saves it under `cls.predictions.*` with legacy true, which transformers reads the same."""
    torch.manual_seed(0)
    ref = transformers.DebertaV2ForMaskedLM(hf_config()).eval()
    ref.save_pretrained(tmp_path / "hf")
    state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    renamed = {k.replace("cls.predictions.transform.", "lm_predictions.lm_head.")
               .replace("cls.predictions.bias", "lm_predictions.lm_head.bias"): v
               for k, v in state.items() if not k.startswith("cls.predictions.decoder")}
    assert any(k.startswith("lm_predictions.lm_head.") for k in renamed)
    save_file(renamed, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    ours = bertforge.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    assert ours.loading_info.missing_keys == [] and ours.loading_info.unexpected_keys == []
    ids, mask, _ = batch()
    with torch.no_grad():
        assert_close(ref(input_ids=ids, attention_mask=mask), ours(ids, mask), mask)
    ours.save_pretrained(tmp_path / "ours")
    assert any(k.startswith("cls.predictions.transform.") for k in load_file(str(tmp_path / "ours" / "model.safetensors")))


def test_a_preset_is_deberta_v3_shaped_and_transformers_loads_it(tmp_path):
    config = BertConfig.preset("deberta-v2-tiny", vocab_size=99)
    spec = config.spec
    assert spec.relative is not None and spec.relative.buckets == 256 and spec.positions == "none"
    assert spec.relative.terms == ("p2c", "c2p") and spec.relative.share_key and spec.zero_padding_embeddings
    model = bertforge.AutoModelForMaskedLM.from_config(config).eval()
    model.save_pretrained(tmp_path)
    ref, info = transformers.DebertaV2ForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids, mask, _ = batch()
    with torch.no_grad():
        assert_close(ref.eval()(input_ids=ids, attention_mask=mask), model(ids, mask), mask)


@pytest.mark.parametrize("size, shape", [("xsmall", (12, 384, 6, 1536)), ("small", (6, 768, 12, 3072)),
                                         ("base", (12, 768, 12, 3072)), ("large", (24, 1024, 16, 4096)),
                                         ("tiny", (2, 128, 2, 512))])
def test_deberta_v3_presets_have_v3s_sizes_and_parts(size, shape):
    config = BertConfig.preset(f"deberta-v3-{size}")
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.intermediate_size) == shape
    assert config.model_type == "deberta-v2" and config.family.recipe.objective == "rtd"
    assert config.to_dict() == BertConfig.preset(f"deberta-v2-{size}").to_dict()  # v3 is v2's architecture
    spec = config.spec
    assert spec.positions == "none" and spec.relative.buckets == 256 and spec.relative.share_key
    assert spec.relative.terms == ("p2c", "c2p") and spec.relative.norm and config.type_vocab_size == 0
    with pytest.raises(BertforgeError, match="deberta-v3 also xsmall, small, base, large"):
        BertConfig.preset("deberta-v3-huge")


@pytest.mark.parametrize("change, message", [
    (dict(conv_kernel_size=3), "conv_kernel_size 3"),
    (dict(pos_att_type=["c2p", "p2p"]), "pos_att_type"),
    (dict(relative_attention=True, pos_att_type=[]), "needs pos_att_type"),
])
def test_a_config_bertforge_cannot_follow_is_refused_in_one_line(change, message):
    data = {"model_type": "deberta-v2", "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 40, "relative_attention": True,
            "pos_att_type": ["c2p"], **change}
    with pytest.raises(BertforgeError, match=message):
        bertforge.AutoModel.from_config(BertConfig.from_dict(data))


def _large_activations(tmp_path, std: float):
    """A DeBERTa-v3 saved by transformers whose query and key weights are drawn with `std` (0.02 by default)."""
    torch.manual_seed(0)
    ref = transformers.DebertaV2Model(hf_config()).eval()
    with torch.no_grad():
        for layer in ref.encoder.layer:
            for dense in (layer.attention.self.query_proj, layer.attention.self.key_proj):
                dense.weight.normal_(0.0, std)
    ref.save_pretrained(tmp_path)
    return tmp_path


def _run_capturing_qkv(model, ids, mask, explicit: bool):
    qkv = []
    hooks = [layer.attention.self.register_forward_hook(lambda m, i, o: qkv.append(o)) for layer in model.encoder.layer]
    with torch.no_grad():
        out = model(ids, mask, output_attentions=explicit)
    for hook in hooks:
        hook.remove()
    return out, qkv


@pytest.mark.parametrize("explicit", [False, True], ids=["sdpa", "probabilities"])
def test_float16_scores_are_scaled_before_the_products_so_they_do_not_overflow(tmp_path, explicit):
    """Queries and keys ~100: q kᵀ (with c2p and p2c) reaches ~128,000, past float16's largest number (65,504), and
    becomes inf when computed unscaled and divided after (NaN after the softmax); scaled by 1/√(3·hd) first it is
    ~26,000. The float16 model stays finite and within float16's rounding of float32."""
    directory = _large_activations(tmp_path, std=20.0)
    ids, mask, _ = batch()
    ours = bertforge.AutoModel.from_pretrained(directory).eval()
    half = bertforge.AutoModel.from_pretrained(directory).to(torch.float16).eval()
    full, _ = _run_capturing_qkv(ours, ids, mask, explicit)
    out, qkv = _run_capturing_qkv(half, ids, mask, explicit)
    q, k, _ = (x.view(3, 14, 4, 8).transpose(1, 2) for x in qkv[0].chunk(3, dim=-1))  # layer 0, [B, nh, S, hd]
    assert (q @ k.transpose(-1, -2)).isinf().any()  # what post-scaling would compute: this test can fail
    real = mask[..., None].bool()
    assert out.last_hidden_state.isfinite().all()
    assert ((out.last_hidden_state.float() - full.last_hidden_state) * real).abs().max() < 1e-2
    if explicit:
        assert all(a.isfinite().all() for a in out.attentions)
        assert max((a.float() - b).abs().max() for a, b in zip(out.attentions, full.attentions)) < 1e-3


def test_bfloat16_with_large_activations_stays_within_its_rounding_of_float32(tmp_path):
    """bfloat16 has float32's range, so nothing overflows; scaled first or not, its scores carry its 8-bit
    mantissa: the outputs within that rounding of float32 (per-position probabilities may flip where logits of
    ~30,000 tie to within it, so the hidden states are compared)."""
    directory = _large_activations(tmp_path, std=20.0)
    ids, mask, _ = batch()
    full, _ = _run_capturing_qkv(bertforge.AutoModel.from_pretrained(directory).eval(), ids, mask, False)
    for explicit in (False, True):
        half = bertforge.AutoModel.from_pretrained(directory).to(torch.bfloat16).eval()
        out, _ = _run_capturing_qkv(half, ids, mask, explicit)
        assert out.last_hidden_state.isfinite().all()
        assert ((out.last_hidden_state.float() - full.last_hidden_state) * mask[..., None]).abs().max() < 0.1


def test_the_sequence_head_drops_out_at_pooler_dropout_then_cls_dropout(tmp_path):
    """transformers' ContextPooler drops token 0 out at `pooler_dropout` (default 0) before its dense layer, and the
    classifier's input at `cls_dropout`: two rates, read from config.json and saved back. With pooler_dropout 1 and
    cls_dropout 0, training-mode logits no longer depend on the input; with pooler_dropout 0 and cls_dropout 0 they
    equal evaluation's (to rounding; a head that used cls_dropout for both would fail either way round)."""
    def logits_of(pooler_dropout: float, cls_dropout: float, train: bool) -> torch.Tensor:
        torch.manual_seed(0)
        directory = tmp_path / f"{pooler_dropout}-{cls_dropout}"
        transformers.DebertaV2ForSequenceClassification(hf_config(pooler_dropout=pooler_dropout,
                                                                  cls_dropout=cls_dropout)).save_pretrained(directory)
        model = bertforge.AutoModelForSequenceClassification.from_pretrained(directory).train(train)
        assert model.config.extra["pooler_dropout"] == pooler_dropout
        model.save_pretrained(tmp_path / "back")
        assert transformers.DebertaV2Config.from_pretrained(tmp_path / "back").pooler_dropout == pooler_dropout
        ids, mask, _ = batch()
        with torch.no_grad():
            return model(ids, mask).logits

    dropped = logits_of(1.0, 0.0, train=True)
    assert torch.allclose(dropped, dropped[0].expand_as(dropped))  # token 0 dropped entirely: one answer for all rows
    assert not torch.allclose(logits_of(0.0, 0.0, train=False), logits_of(0.0, 0.0, train=False)[0].expand(3, 3))
    # (training mode attends by another path: equal to float32 rounding)
    assert torch.allclose(logits_of(0.0, 0.0, train=True), logits_of(0.0, 0.0, train=False), atol=1e-6)
    cls_on = logits_of(0.0, 0.5, train=True) - logits_of(0.0, 0.5, train=False)
    assert cls_on.abs().max() > 1e-4  # cls_dropout still on


def test_buckets_at_the_boundary_distance_follow_transformers_float32_log(tmp_path):
    """With 16 buckets and max_relative_positions 13, distance 12 sits on a bucket boundary (ln(12 / 8) / ln(12 / 8)
    is 1 up to rounding), where a float64 log of the scale gives one bucket and transformers' float32 log the next
    (outputs 8.7e-5 apart on this config). The bucket table and the outputs match transformers'."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    from bertforge.model.parts import relative_positions
    from bertforge.model.spec import RelativeAttention

    L = 14
    q = torch.zeros(1, L, 4)
    ref_buckets = build_relative_position(q, q, bucket_size=16, max_position=13)[0]
    span = RelativeAttention(buckets=16, max_distance=13).span
    assert torch.equal(relative_positions(L, RelativeAttention(buckets=16, max_distance=13)) - span,
                       (ref_buckets + span).clamp(0, 2 * span - 1) - span)
    torch.manual_seed(0)
    config = hf_config(position_buckets=16, max_relative_positions=13)
    ref = transformers.DebertaV2Model(config).eval()
    ref.save_pretrained(tmp_path / "hf")
    ours = bertforge.AutoModel.from_pretrained(tmp_path / "hf").eval()
    ids, mask, _ = batch()
    mask = torch.ones_like(mask)
    with torch.no_grad():
        assert_close(ref(input_ids=ids, attention_mask=mask), ours(ids, mask), mask)
