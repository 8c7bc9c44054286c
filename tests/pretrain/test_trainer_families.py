"""Pretraining the MPNet, NomicBERT and GTE presets (`--config mpnet-tiny | nomicbert-tiny | gte-tiny`): each learns
on a small corpus with its family's recipe and tokenizer kind, and `transformers` reads OUT/model as that family
(its MLM class: no missing or unexpected weights, logits within 1e-5) with the same token ids as bertforge's
tokenizer, pairs included."""

import json

import pytest
import torch

from bertforge import AutoModelForMaskedLM, BertConfig
from bertforge.pretrain.args import PretrainArgs
from bertforge.pretrain.trainer import pretrain
from bertforge.tokenizer import Tokenizer
from tests.helpers import make_corpus

transformers = pytest.importorskip("transformers")

PRESETS = {"mpnet-tiny": ("MPNetForMaskedLM", "MPNetTokenizer"), "nomicbert-tiny": ("NomicBertForMaskedLM", "BertTokenizer"),
           "gte-tiny": ("GteForMaskedLM", "BertTokenizer")}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", docs=120)


def test_the_recipes_are_the_families():
    resolved = {name: PretrainArgs(config=name).for_family(BertConfig.preset(name)) for name in PRESETS}
    assert {name: (r.objective, r.mlm_probability) for name, r in resolved.items()} == {
        "mpnet-tiny": ("mlm", 0.15), "nomicbert-tiny": ("mlm", 0.3), "gte-tiny": ("mlm", 0.3)}
    assert resolved["mpnet-tiny"].adam_beta2 == 0.98


@pytest.mark.parametrize("preset", list(PRESETS))
def test_a_preset_learns_and_transformers_reads_what_it_writes(tmp_path, corpus, preset):
    hf_class, tokenizer_class = PRESETS[preset]
    out = pretrain(PretrainArgs(config=preset, corpus=[str(corpus)], out=str(tmp_path / "run"), vocab_size=400,
                                max_length=64, max_steps=40, batch_size=8, warmup_steps=4, lr=3e-3, log_every=5,
                                save_every=100, progress=False, demo=False))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["mlm_loss"] for r in rows if "mlm_loss" in r]
    assert losses[-1] < losses[0] - 0.5, losses
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [hf_class]
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == tokenizer_class
    hf_tok, ours_tok = transformers.AutoTokenizer.from_pretrained(out), Tokenizer.from_pretrained(out)
    lines = [line for line in corpus.read_text().splitlines() if line][:6]
    for text, pair in zip(lines[::2], lines[1::2]):
        assert ours_tok(text)["input_ids"] == hf_tok(text)["input_ids"]
        assert ours_tok(text, pair)["input_ids"] == hf_tok(text, pair)["input_ids"]
    reference, info = getattr(transformers, hf_class).from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ours = AutoModelForMaskedLM.from_pretrained(out).eval()
    batch = hf_tok(lines, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        expected = reference.eval()(**batch).logits
        got = ours(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")).logits
    real = batch["attention_mask"].bool()
    assert (expected - got)[real].abs().max() <= 1e-5
