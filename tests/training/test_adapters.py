"""Training with low-rank adapters: the shared settings, a LoRA fine-tune whose saved adapter `peft` loads with the
same logits (within 1e-5) and which bertforge's own loaders, `evaluate` included, read back; `merge` writing a
plain checkpoint of the same model; and the optimizer holding state for the adapters and the head only
(measured in bytes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import bertforge
from bertforge import BertforgeError, BertForSequenceClassification
from bertforge.finetune import FinetuneConfig, evaluate, finetune
from bertforge.model.lora import LoraSettings, add_adapters
from bertforge.training.adapters import LoraOptions
from bertforge.training.optim import make_optimizer
from tests.finetune.conftest import save_tiny_model, write_sentiment
from tests.helpers import tiny_config

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny_bert"))


RUN = dict(task="classification", epochs=2, batch_size=8, lr=1e-2, progress=False, seed=3)


def test_the_settings_say_what_trains_or_name_the_problem():
    assert LoraOptions().lora() is None
    assert LoraOptions(lora_rank=4, lora_targets=["query", "ffn_out"]).lora() == LoraSettings(
        rank=4, alpha=16.0, dropout=0.0, targets=("query", "ffn_out"))
    with pytest.raises(BertforgeError, match="merge is for adapters"):
        LoraOptions(merge=True).lora()
    with pytest.raises(BertforgeError, match="lora targets must name some of query, key, value"):
        LoraOptions(lora_rank=4, lora_targets=["qkv"]).lora()
    with pytest.raises(BertforgeError, match="lora_rank and freeze_backbone both say what trains"):
        FinetuneConfig(task="classification", model="m", train="t", dev="d", out="o", lora_rank=2,
                       freeze_backbone=True).validate()


def run_lora(tmp_path: Path, tiny_model: Path, name: str, **settings) -> Path:
    train = write_sentiment(tmp_path / "train.tsv", 24)
    out = tmp_path / name
    finetune(model=str(tiny_model), train=str(train), dev=str(train), out=str(out), **RUN, **settings)
    return out / "model"


def logits(model) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 60, (2, 7), generator=g)
    with torch.no_grad():
        out = model.eval()(input_ids=ids, attention_mask=torch.ones_like(ids))
    return out.logits


def test_a_lora_fine_tune_saves_an_adapter_peft_loads_with_the_same_logits(tmp_path, tiny_model):
    model_dir = run_lora(tmp_path, tiny_model, "lora", lora_rank=4, lora_alpha=8, lora_targets=["query", "value",
                                                                                                  "ffn_in"])
    assert not (model_dir / "model.safetensors").exists() and not (model_dir / "config.json").exists()
    config = json.loads((model_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_model) and config["r"] == 4
    ours = BertForSequenceClassification.from_pretrained(model_dir)  # the base found from adapter_config.json
    assert ours.config.id2label == {0: "neg", 1: "pos"}  # the labels, saved beside the adapter
    assert ours.loading_info.missing_keys == []
    base = transformers.BertForSequenceClassification.from_pretrained(tiny_model, num_labels=2)
    ref = peft.PeftModel.from_pretrained(base, model_dir)
    assert (logits(ours) - logits(ref)).abs().max() < 1e-5
    start = BertForSequenceClassification.from_pretrained(tiny_model, num_labels=2)
    assert (logits(ours) - logits(start)).abs().max() > 1e-3  # it learned something
    metrics = evaluate("classification", model_dir, tmp_path / "train.tsv", progress=False)
    assert metrics["accuracy"] >= 0.5

    merged_dir = run_lora(tmp_path, tiny_model, "merged", lora_rank=4, lora_alpha=8,
                          lora_targets=["query", "value", "ffn_in"], merge=True)
    assert not (merged_dir / "adapter_config.json").exists()
    merged = bertforge.AutoModelForSequenceClassification.from_pretrained(merged_dir)
    assert merged.loading_info.missing_keys == []
    assert (logits(merged) - logits(ours)).abs().max() < 1e-5  # the same run, folded into the weights


def test_a_run_from_an_adapter_directory_trains_its_adapters_on_and_keeps_their_base(tmp_path, tiny_model):
    first = run_lora(tmp_path, tiny_model, "first", lora_rank=2)
    train = tmp_path / "train.tsv"
    out = tmp_path / "second"
    finetune(model=str(first), train=str(train), dev=str(train), out=str(out), **{**RUN, "epochs": 1})
    config = json.loads((out / "model" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_model) and config["r"] == 2
    before, after = (BertForSequenceClassification.from_pretrained(d) for d in (first, out / "model"))
    assert (logits(before) - logits(after)).abs().max() > 1e-4  # they trained on


def optimizer_state_bytes(model, steps: int = 1) -> int:
    """Train `steps` AdamW steps and count the bytes of its state tensors."""
    optimizer = make_optimizer(model, "adamw", 1e-3, 0.01)
    ids = torch.randint(5, 90, (2, 8))
    for _ in range(steps):
        model.train()(ids, attention_mask=torch.ones_like(ids), labels=torch.tensor([0, 1])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return sum(t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
               if torch.is_tensor(t) and t.dim() > 0)


def test_the_optimizer_keeps_state_for_the_adapters_and_the_head_only():
    torch.manual_seed(0)
    config = tiny_config(vocab_size=99, num_labels=2)
    full = optimizer_state_bytes(BertForSequenceClassification(config))
    model = BertForSequenceClassification(config)
    add_adapters(model, LoraSettings(rank=4))
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    adapted = optimizer_state_bytes(model)
    assert adapted == 2 * trainable  # Adam's two moments, of the adapters and the classifier alone
    assert full == 2 * sum(p.numel() * p.element_size() for p in BertForSequenceClassification(config).parameters())
    assert adapted < full / 10


def test_train_embeddings_with_adapters_writes_a_directory_sentence_transformers_loads_alike(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    import numpy as np

    from bertforge.embeddings_train import train_embeddings
    from tests.embeddings_train.embeddings_train_helpers import DEV_TEMPLATES, make_model, pairs, write_toy_task

    base, (train, dev) = make_model(tmp_path / "tiny"), write_toy_task(tmp_path)
    out = tmp_path / "out"
    train_embeddings(model=str(base), train=str(train), dev=str(dev), out=str(out), epochs=1, batch_size=16,
                     lr=1e-2, max_length=16, progress=False, lora_rank=4, lora_targets=["query", "value"])
    assert (out / "adapter_model.safetensors").is_file() and (out / "modules.json").is_file()
    assert not (out / "model.safetensors").exists()
    texts = [a for a, _ in pairs(DEV_TEMPLATES)]
    ours = bertforge.pipeline("embed", model=out)(texts)
    assert np.abs(ours - bertforge.pipeline("embed", model=base)(texts)).max() > 1e-4  # the adapters changed it
    assert np.abs(ours - st.SentenceTransformer(str(out), device="cpu").encode(texts)).max() < 1e-5
