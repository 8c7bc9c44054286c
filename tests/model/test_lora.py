"""Low-rank adapters against `peft` itself on tiny random `transformers` models: an adapter written here loads in
`peft` onto the family's `transformers` class with the same logits, and `peft`'s load here, both within 1e-5, for
BERT and the families whose files or modules fuse projections (ModernBERT's Wqkv, NomicBERT's and GTE's separate
in-memory projections); merging, freezing, PEFT's layout on disk, and the refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import bertforge
from bertforge import BertforgeError
from bertforge.model import lora

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

SIZES = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40,
             max_position_embeddings=64)
FAMILIES = {  # name: (config class, config fields, class prefix, PEFT target_modules of every projection)
    "bert": ("BertConfig", {}, "Bert", ["query", "key", "value", "attention.output.dense", "intermediate.dense",
                                        "output.dense"]),
    "modernbert": ("ModernBertConfig", dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                            sep_token_id=2, local_attention=4), "ModernBert", ["Wqkv", "Wo", "Wi"]),
    "nomic_bert": ("NomicBertConfig", {}, "NomicBert", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                        "up_proj", "down_proj"]),
    "gte": ("GteConfig", {}, "Gte", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "roberta": ("RobertaConfig", dict(pad_token_id=1, max_position_embeddings=66), "Roberta",
                ["query", "value", "intermediate.dense"]),
    "distilbert": ("DistilBertConfig", dict(dim=32, n_layers=2, n_heads=4, hidden_dim=40), "DistilBert",
                   ["q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2"]),
    "albert": ("AlbertConfig", dict(embedding_size=16), "Albert", ["query", "value", "ffn", "ffn_output"]),
    "deberta-v2": ("DebertaV2Config", dict(relative_attention=True, position_buckets=8, max_relative_positions=24,
                                           pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True,
                                           position_biased_input=False), "DebertaV2",
                   ["query_proj", "key_proj", "value_proj", "attention.output.dense"]),
    "mpnet": ("MPNetConfig", {}, "MPNet", ["q", "k", "v", "o", "intermediate.dense"]),
    "eurobert": ("EuroBertConfig", dict(num_key_value_heads=2, pad_token_id=0, mask_token_id=3), "EuroBert",
                 ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "electra": ("ElectraConfig", dict(embedding_size=16), "Electra", ["query", "key", "value", "attention.output.dense",
                                                                     "intermediate.dense", "output.dense"]),
    "jina_embeddings_v3": ("JinaEmbeddingsV3Config", dict(pad_token_id=0), "JinaEmbeddingsV3",
                           ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"]),
}


def hf_base(tmp_path, family: str, task: str = "ForSequenceClassification"):
    """A tiny random `transformers` model of `family` saved in tmp_path/base; returns (its class, the path)."""
    config_class, fields, prefix, _ = FAMILIES[family]
    torch.manual_seed(0)
    cls = getattr(transformers, prefix + task)
    cls(getattr(transformers, config_class)(**{**SIZES, **fields}, num_labels=3)).save_pretrained(tmp_path / "base")
    return cls, tmp_path / "base"


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 99, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 2:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def perturbed(adapters):
    """Adapters as after training: B is zero when made, which would hide a mistake in it."""
    with torch.no_grad():
        for a in adapters:
            a.lora_B.normal_(std=0.3)
    return adapters


def peft_logits(cls, base, adapter_dir):
    ref = peft.PeftModel.from_pretrained(cls.from_pretrained(base), adapter_dir).eval()
    ids, mask = batch()
    with torch.no_grad():
        return ref(input_ids=ids, attention_mask=mask).logits


def our_logits(model):
    ids, mask = batch()
    with torch.no_grad():
        return model.eval()(ids, attention_mask=mask).logits


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_adapter_saved_here_loads_in_peft_with_the_same_logits(tmp_path, family):
    cls, base = hf_base(tmp_path, family)
    model = bertforge.AutoModelForSequenceClassification.from_pretrained(base)
    made = perturbed(lora.add_adapters(model, lora.LoraSettings(rank=4, alpha=8, targets=lora.ROLES)))
    torch.nn.init.normal_(model.classifier.weight if hasattr(model.classifier, "weight")
                          else model.classifier.out_proj.weight)  # the head trains too: PEFT must load it
    lora.save_adapter(model, tmp_path / "adapter", base=str(base))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base) and config["task_type"] == "SEQ_CLS"
    assert any(m.startswith("classifier") for m in config["modules_to_save"])  # the modules holding the head
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert sum(k.endswith(".lora_A.weight") for k in saved) == len(made) == len({a.name for a in made})
    ref = peft.PeftModel.from_pretrained(cls.from_pretrained(base), tmp_path / "adapter")
    assert sum(isinstance(m, peft.tuners.lora.LoraLayer) for m in ref.modules()) == len(made)  # each one adapted
    assert (our_logits(model) - peft_logits(cls, base, tmp_path / "adapter")).abs().max() < 1e-5


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_adapter_peft_wrote_loads_here_with_the_same_logits(tmp_path, family):
    cls, base = hf_base(tmp_path, family)
    ref = peft.get_peft_model(cls.from_pretrained(base), peft.LoraConfig(
        task_type="SEQ_CLS", r=4, lora_alpha=16, target_modules=FAMILIES[family][3]))
    with torch.no_grad():
        for name, param in ref.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                param.normal_(std=0.3)
    ref.save_pretrained(tmp_path / "peft")
    model = lora.load_adapter(bertforge.AutoModelForSequenceClassification.from_pretrained(base), tmp_path / "peft")
    assert (our_logits(model) - peft_logits(cls, base, tmp_path / "peft")).abs().max() < 1e-5
    lora.save_adapter(model, tmp_path / "again")  # and back: the same tensors under the same names (and
    mine, theirs = (load_file(tmp_path / d / "adapter_model.safetensors") for d in ("again", "peft"))
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)  # the head's parts PEFT leaves frozen, which train
    assert {k.split(".")[2] for k in set(mine) - set(theirs)} <= {"head", "pooler", "dense"}  # here: ModernBERT's,
    # DeBERTa's, EuroBERT's)


def test_the_fused_layer_of_modernbert_shares_one_adapter_cut_by_rows(tmp_path):
    _, base = hf_base(tmp_path, "modernbert")
    model = bertforge.AutoModelForSequenceClassification.from_pretrained(base)
    made = lora.add_adapters(model, lora.LoraSettings(rank=2, targets=("query", "key", "value")))
    assert [a.name for a in made] == ["model.layers.0.attn.Wqkv", "model.layers.1.attn.Wqkv"]
    assert made[0].lora_B.shape == (96, 2)
    self_attention = model.bert.encoder.layer[0].attention.self
    assert [p.source for p in self_attention.key.pieces] == [slice(32, 64)]
    assert self_attention.key.pieces[0].lora is self_attention.query.adapters[0]
    with pytest.raises(BertforgeError, match=r"fuse key, query, value into one layer \(model.layers.0.attn.Wqkv\)"):
        lora.add_adapters(bertforge.AutoModelForSequenceClassification.from_pretrained(base),
                          lora.LoraSettings(targets=("query", "value")))


def test_merging_gives_the_same_outputs_with_plain_dense_layers(tmp_path):
    _, base = hf_base(tmp_path, "gte")  # GTE's gated layer: its file's halves are in the other order
    model = bertforge.AutoModelForSequenceClassification.from_pretrained(base)
    perturbed(lora.add_adapters(model, lora.LoraSettings(rank=3, targets=lora.ROLES)))
    before = our_logits(model)
    lora.merge_adapters(model)
    assert not lora.has_adapters(model) and not lora.adapters(model)
    assert (our_logits(model) - before).abs().max() < 1e-5
    model.save_pretrained(tmp_path / "merged")  # a plain checkpoint again
    assert (our_logits(bertforge.AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged"))
            - before).abs().max() < 1e-5


def test_only_the_adapters_and_the_head_train(tmp_path):
    _, base = hf_base(tmp_path, "bert")
    model = bertforge.AutoModelForSequenceClassification.from_pretrained(base)
    lora.add_adapters(model, lora.LoraSettings(rank=2))
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == ["bert.encoder.layer.0.attention.self.query.adapters.0.lora_A",
                         "bert.encoder.layer.0.attention.self.query.adapters.0.lora_B",
                         "bert.encoder.layer.0.attention.self.value.adapters.0.lora_A",
                         "bert.encoder.layer.0.attention.self.value.adapters.0.lora_B",
                         "bert.encoder.layer.1.attention.self.query.adapters.0.lora_A",
                         "bert.encoder.layer.1.attention.self.query.adapters.0.lora_B",
                         "bert.encoder.layer.1.attention.self.value.adapters.0.lora_A",
                         "bert.encoder.layer.1.attention.self.value.adapters.0.lora_B",
                         "classifier.bias", "classifier.weight"]
    ids, mask = batch()
    model.train()(ids, attention_mask=mask, labels=torch.tensor([0, 1, 2])).loss.backward()
    assert all((p.grad is not None) == p.requires_grad for p in model.parameters())
    assert model.bert.encoder.layer[0].attention.self.query.adapters[0].lora_B.grad.abs().sum() > 0


def test_a_bare_encoder_takes_adapters_without_a_head(tmp_path):
    _, base = hf_base(tmp_path, "bert", task="Model")
    model = bertforge.BertModel.from_pretrained(base)
    perturbed(lora.add_adapters(model, lora.LoraSettings(rank=2, targets=("ffn_in", "ffn_out"))))
    lora.save_adapter(model, tmp_path / "adapter", base=str(base))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["task_type"] == "FEATURE_EXTRACTION" and config["modules_to_save"] is None
    assert config["target_modules"] == [f"encoder.layer.{n}.{m}" for n in (0, 1)  # "output.dense" would match the
                                        for m in ("intermediate.dense", "output.dense")]  # attention's too: full names
    ref = peft.PeftModel.from_pretrained(transformers.BertModel.from_pretrained(base), tmp_path / "adapter").eval()
    ids, mask = batch()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).last_hidden_state
        got = model.eval()(ids, attention_mask=mask).last_hidden_state
    assert (got - want).abs().max() < 1e-5


def test_refusals_name_the_problem(tmp_path):
    _, base = hf_base(tmp_path, "bert")
    model = bertforge.AutoModelForSequenceClassification.from_pretrained(base)
    with pytest.raises(BertforgeError, match="lora targets must name some of query"):
        lora.LoraSettings(targets=("attention",))
    with pytest.raises(BertforgeError, match="lora rank must be a positive integer"):
        lora.LoraSettings(rank=0)
    lora.add_adapters(model, lora.LoraSettings())
    with pytest.raises(BertforgeError, match="has low-rank adapters"):
        model.save_pretrained(tmp_path / "full")
    lora.save_adapter(model, tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(BertforgeError, match="use_dora=True is not supported"):
        lora.read_adapter(tmp_path / "adapter")
    _, other = hf_base(tmp_path / "other", "modernbert")
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(BertforgeError, match="adapts 'bert.encoder.layer.0.attention.self.query', which is no "
                                             "projection of this ModernBERT model"):
        lora.load_adapter(bertforge.AutoModelForSequenceClassification.from_pretrained(other), tmp_path / "adapter")
