"""ModernBERT against `transformers` itself (eager and SDPA, biases on and off, cls and mean pooling), both
`config.json` spellings, its fused query/key/value weight, its init and its refusals."""

import json

import pytest
import torch
from safetensors.torch import load_file

import bertforge
from bertforge import BertConfig, BertforgeError
from bertforge.model.families.modernbert import GLOBAL, LOCAL

from tests.model.families.families_helpers import TASKS, assert_close

transformers = pytest.importorskip("transformers")

VARIANTS = {
    "defaults": {},
    "biases, mean pooling, no decoder bias": dict(attention_bias=True, mlp_bias=True, norm_bias=True,
                                                  classifier_bias=True, decoder_bias=False, classifier_pooling="mean",
                                                  classifier_activation="silu", hidden_activation="gelu_pytorch_tanh"),
}


def hf_config(num_labels=3, **kw):
    base = dict(vocab_size=99, max_position_embeddings=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                intermediate_size=40, local_attention=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                cls_token_id=1, sep_token_id=2, num_labels=num_labels)
    base.update(kw)
    return transformers.ModernBertConfig(**base)


def batch():
    """Rows of 16, 11 and 3 tokens, padded: every row longer than the window of 4 but the last."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (3, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    mask[2, 3:] = 0
    return ids.masked_fill(mask == 0, 0), mask



@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("task", list(TASKS))
def test_every_task_class_equals_transformers_and_saves_back(tmp_path, task, attn, variant):
    torch.manual_seed(0)
    hf_class = getattr(transformers, "ModernBert" + task)
    labels = 2 if task == "ForQuestionAnswering" else 3
    ref = hf_class(hf_config(labels, **VARIANTS[variant])).eval()
    ref.config._attn_implementation = attn
    ref.save_pretrained(tmp_path / "hf")
    ours = TASKS[task].from_pretrained(tmp_path / "hf").eval()
    assert ours.loading_info.missing_keys == [] and ours.loading_info.unexpected_keys == []
    ids, mask = batch()
    with torch.no_grad():
        assert_close(ref(input_ids=ids, attention_mask=mask), ours(ids, mask), mask)
    ours.save_pretrained(tmp_path / "ours")
    back, info = hf_class.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    back.config._attn_implementation = attn
    with torch.no_grad():
        assert_close(back.eval()(input_ids=ids, attention_mask=mask), ours(ids, mask), mask)


def test_the_4_48_spelling_loads_the_same_model_and_both_spellings_are_written(tmp_path):
    torch.manual_seed(0)
    ref = transformers.ModernBertModel(hf_config(layer_types=None)).eval()
    ref.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    new_style = bertforge.AutoModel.from_pretrained(tmp_path).eval()
    for key in ("layer_types", "rope_parameters"):
        data.pop(key, None)
    data.update(global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0)
    (tmp_path / "config.json").write_text(json.dumps(data))
    old_style = bertforge.AutoModel.from_pretrained(tmp_path).eval()
    assert old_style.spec == new_style.spec
    assert [layer.window for layer in old_style.spec.layers] == [None, 4, 4, None]
    ids, mask = batch()
    with torch.no_grad():
        assert torch.equal(old_style(ids, mask).last_hidden_state, new_style(ids, mask).last_hidden_state)
    old_style.save_pretrained(tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["layer_types"] == [GLOBAL, LOCAL, LOCAL, GLOBAL] and written["global_attn_every_n_layers"] == 3
    assert written["rope_parameters"][LOCAL]["rope_theta"] == written["local_rope_theta"] == 10000.0
    assert "type_vocab_size" not in written and "position_embedding_type" not in written


def test_layer_types_that_no_every_n_rule_gives_load_and_are_written_in_5x_spelling_only(tmp_path):
    types = [GLOBAL, LOCAL, GLOBAL, GLOBAL]
    config = BertConfig.from_dict({"model_type": "modernbert", "vocab_size": 50, "hidden_size": 32,
                                   "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 40,
                                   "layer_types": types, "local_attention": 8, "pad_token_id": 0})
    assert [layer.window for layer in config.spec.layers] == [None, 8, None, None]
    written = config.to_dict()
    assert written["layer_types"] == types and "global_attn_every_n_layers" not in written


def test_the_file_holds_fused_query_key_value():
    torch.manual_seed(0)
    config = BertConfig.preset("modernbert-tiny", vocab_size=50)
    model = bertforge.AutoModelForMaskedLM.from_config(config)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        keys = load_file(f"{tmp}/model.safetensors")
    assert keys["model.layers.1.attn.Wqkv.weight"].shape == (3 * 128, 128)
    assert not any(".Wq." in k or "query" in k for k in keys) and "model.layers.0.attn_norm.weight" not in keys
    q = model.bert.encoder.layer[1].attention.self.query.weight
    assert torch.equal(keys["model.layers.1.attn.Wqkv.weight"][:128], q.detach())


def test_scaled_truncated_init():
    torch.manual_seed(0)
    config = BertConfig.preset("modernbert-small", vocab_size=1000, initializer_range=0.02)
    model = bertforge.AutoModelForSequenceClassification.from_config(config)
    layer = model.bert.encoder.layer[0]
    w_in, w_out = layer.attention.self.query.weight, layer.attention.output.dense.weight
    assert w_in.abs().max() <= 0.04 + 1e-7  # cut off at 2σ
    out_std = 0.02 / (2 * config.num_hidden_layers) ** 0.5
    assert w_out.abs().max() <= 2 * out_std + 1e-7 and w_out.std() < w_in.std() / 2
    assert abs(model.classifier.weight.std().item() - 0.88 * 512 ** -0.5) < 0.01  # 1/√H, truncated at 2σ


@pytest.mark.parametrize("change, message", [
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e4}}}, "rope_type 'yarn'"),
    ({"layer_types": ["full_attention"]}, "must list 2"),
    ({"local_attention": 0}, "local_attention"),
    ({"classifier_pooling": "max"}, "classifier_pooling"),
])
def test_a_config_bertforge_cannot_follow_is_refused_in_one_line(change, message):
    data = {"model_type": "modernbert", "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 40, "pad_token_id": 0, **change}
    with pytest.raises(BertforgeError, match=message):
        bertforge.AutoModel.from_config(BertConfig.from_dict(data))


def test_presets_are_modernberts_sizes():
    base, large = BertConfig.preset("modernbert-base"), BertConfig.preset("modernbert-large")
    assert (base.num_hidden_layers, base.hidden_size, base.num_attention_heads, base.intermediate_size) == (22, 768, 12, 1152)
    assert (large.num_hidden_layers, large.hidden_size, large.intermediate_size) == (28, 1024, 2624)
    tiny = BertConfig.preset("modernbert-tiny", vocab_size=100)
    assert tiny.intermediate_size == 192 and tiny.spec.ffn == "gated" and tiny.max_position_embeddings == 8192
    assert [layer.window for layer in base.spec.layers[:4]] == [None, 128, 128, None]


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_packed_classification_pools_as_the_config_says(tmp_path, pooling):
    """The pipelines' packed path: each sequence's mean (or token 0) of packed rows gives the padded logits."""
    from bertforge.model import pack

    torch.manual_seed(0)
    transformers.ModernBertForSequenceClassification(hf_config(classifier_pooling=pooling)).save_pretrained(tmp_path)
    model = bertforge.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    ids, mask = batch()
    rows = [row[: int(m.sum())].tolist() for row, m in zip(ids, mask)]
    order = sorted(range(3), key=lambda i: -len(rows[i]))
    packed_batch = pack([rows[i] for i in order])
    with torch.no_grad():
        logits = model.packed_logits(model.bert.forward_packed(packed_batch), packed_batch)
        assert (logits - model(ids, mask).logits[order]).abs().max() <= 1e-5


def test_a_new_model_names_no_special_id_outside_its_vocabulary():
    written = BertConfig.preset("modernbert-tiny", vocab_size=300).to_dict()
    assert all(written[name] is None for name in ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"))
    kept = BertConfig.from_dict({**written, "cls_token_id": 1, "sep_token_id": 2}).to_dict()
    assert (kept["cls_token_id"], kept["sep_token_id"], kept["bos_token_id"]) == (1, 2, None)


def test_a_checkpoint_whose_parts_cannot_be_followed_is_refused_naming_its_file(tmp_path):
    config = BertConfig.preset("modernbert-tiny", vocab_size=50)
    bertforge.AutoModel.from_config(config).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["rope_parameters"]["sliding_attention"]["rope_type"] = "yarn"
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(BertforgeError, match=r"config\.json: config field 'rope_parameters': rope_type 'yarn'"):
        bertforge.AutoModel.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------- the ladders


@pytest.mark.parametrize("preset, params", [
    ("ettin-17m", 17e6), ("ettin-32m", 32e6), ("ettin-68m", 68e6), ("ettin-150m", 150e6), ("ettin-400m", 400e6),
    ("ettin-1b", 1e9), ("mmbert-small", 140e6), ("mmbert-base", 307e6)])
def test_the_ladders_build_their_published_sizes(preset, params):
    """Ettin's and mmBERT's presets: the parameter counts their names and model cards give (embeddings included)."""
    config = BertConfig.preset(preset)
    with torch.device("meta"):
        n = bertforge.BertModel(config).num_parameters()
    assert abs(n - params) / params < 0.05, n
    assert config.model_type == "modernbert" and config.max_position_embeddings == 8192


def test_the_ladders_recipes_thetas_and_unknown_sizes():
    from bertforge.pretrain.args import PretrainArgs

    ettin = PretrainArgs(config="ettin-17m").for_family(BertConfig.preset("ettin-17m"))
    assert (ettin.mlm_probability, ettin.decay, ettin.packing) == (0.3, "wsd-sqrt", "documents")  # ModernBERT's
    mm = PretrainArgs(config="mmbert-small").for_family(BertConfig.preset("mmbert-small"))
    assert (mm.mlm_probability, mm.decay) == (0.3, "wsd")
    thetas = {layer.rope_theta for layer in BertConfig.preset("mmbert-base").spec.layers}
    assert thetas == {160_000.0} and BertConfig.preset("mmbert-base").vocab_size == 256_000
    assert {layer.rope_theta for layer in BertConfig.preset("ettin-68m").spec.layers} == {160_000.0, 10_000.0}
    first = BertConfig.preset("mmbert-small")
    first.extra["local_rope_theta"] = 1.0  # a config's fields are its own, not the ladder's
    assert BertConfig.preset("mmbert-small").extra["local_rope_theta"] == 160_000.0
    from bertforge.model.families import MODERNBERT, tokenizer_kind

    assert tokenizer_kind("mmbert-small", MODERNBERT) == "mmbert"  # Gemma's byte-fallback BPE
    assert tokenizer_kind("ettin-17m", MODERNBERT) == tokenizer_kind("modernbert-tiny", MODERNBERT) == "modernbert"
    with pytest.raises(BertforgeError, match="ettin has the sizes 17m, 32m, 68m, 150m, 400m, 1b"):
        BertConfig.preset("ettin-3m")


def test_local_layers_rotate_with_the_local_theta_and_global_layers_with_the_global_one():
    """Directly (a mutant giving the local layers the global θ was caught end to end only): in the spec and in the
    encoder each block builds, a local layer has the window and θ = local_rope_theta, a global one neither window
    nor that θ; the rotary tables are those of each θ."""
    config = BertConfig.from_dict({"model_type": "modernbert", "vocab_size": 50, "hidden_size": 32,
                                   "num_hidden_layers": 6, "num_attention_heads": 4, "intermediate_size": 40,
                                   "global_attn_every_n_layers": 3, "global_rope_theta": 160_000.0,
                                   "local_rope_theta": 10_000.0, "local_attention": 8, "pad_token_id": 0})
    kinds = [GLOBAL, LOCAL, LOCAL, GLOBAL, LOCAL, LOCAL]
    want = {GLOBAL: (None, 160_000.0), LOCAL: (8, 10_000.0)}
    assert [(layer.window, layer.rope_theta) for layer in config.spec.layers] == [want[k] for k in kinds]
    model = bertforge.BertModel(config)
    encoder = next(m for m in model.modules() if hasattr(m, "scores"))
    head_dim = 32 // 4
    for kind, scores in zip(kinds, encoder.scores):
        window, theta = want[kind]
        assert scores.window == window and scores.rotary.theta == theta
        exponents = torch.arange(0, head_dim, 2).float() / head_dim
        torch.testing.assert_close(scores.rotary.inv_freq, 1.0 / theta**exponents)
