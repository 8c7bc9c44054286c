"""Pretraining ModernBERT (`--config modernbert-SIZE`): its recipe (30 % masking, documents packed and attended
within themselves, warmup-stable-decay with a 1 - sqrt decay, beta2 0.98, byte-level BPE with [CLS] … [SEP]),
learning on a small corpus with StableAdamW, `transformers` loading what comes out as ModernBERT with identical
token ids and logits, and `--init-from` continuing it at a longer context with the global rotary θ raised."""

import json

import pytest
import torch

from bertforge import BertConfig
from bertforge.cli import main
from bertforge.model.families.modernbert import GLOBAL, LOCAL, rope_thetas
from bertforge.pretrain.args import PretrainArgs
from bertforge.pretrain.trainer import pretrain
from tests.helpers import make_corpus

transformers = pytest.importorskip("transformers")

RUN = ["--batch-size", "8", "--vocab-size", "400", "--warmup-steps", "4", "--lr", "3e-3", "--log-every", "5",
       "--save-every", "100", "--no-progress", "--optimizer", "stable-adamw"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", docs=120)


def test_the_recipe_is_modernberts_and_explicit_settings_win():
    args = PretrainArgs(config="modernbert-tiny")
    resolved = args.for_family(args.model_config())
    assert (resolved.objective, resolved.mlm_probability, resolved.packing, resolved.decay, resolved.adam_beta2) == (
        "mlm", 0.3, "documents", "wsd-sqrt", 0.98)
    explicit = PretrainArgs(config="modernbert-tiny", mlm_probability=0.2, packing="stream", decay="linear")
    assert (lambda r: (r.mlm_probability, r.packing, r.decay))(explicit.for_family(explicit.model_config())) == (
        0.2, "stream", "linear")
    bert = PretrainArgs(config="tiny").for_family(BertConfig.preset("tiny"))
    assert (bert.mlm_probability, bert.packing, bert.decay) == (0.15, "stream", "linear")  # BERT's, unchanged


@pytest.mark.parametrize("argv,message", [
    (["--config", "tiny", "--packing", "documents"], "--packing documents needs MLM alone"),
    (["--config", "modernbert-tiny", "--objective", "nsp"], "ModernBERT is pretrained with MLM only"),
    (["--config", "roberta-tiny", "--global-rope-theta", "10000"], "(RoBERTa) has no rotary positions"),
    (["--config", "modernbert-tiny", "--global-rope-theta", "-1"], "--global-rope-theta must be a positive number"),
    (["--config", "tiny", "--decay-ratio", "0.2"], "--decay-ratio applies to --decay wsd or wsd-sqrt only"),
])
def test_contradicting_settings_are_refused_before_anything_is_written(tmp_path, corpus, capsys, argv, message):
    out = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "2", *argv, *RUN]) != 0
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def losses(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["mlm_loss"] for r in rows if "mlm_loss" in r]


def assert_transformers_loads_it(model_dir, corpus):
    """transformers' ModernBertForMaskedLM and AutoTokenizer read OUT/model: no missing or unexpected weights, the
    same token ids as bertforge's tokenizer (the [CLS] … [SEP] template, pairs included), logits within 1e-5."""
    from bertforge import AutoModelForMaskedLM
    from bertforge.tokenizer import Tokenizer

    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["architectures"] == ["ModernBertForMaskedLM"]
    hf_tok, ours_tok = transformers.AutoTokenizer.from_pretrained(model_dir), Tokenizer.from_pretrained(model_dir)
    lines = [line for line in corpus.read_text().splitlines() if line][:4]
    for text, pair in zip(lines[::2], lines[1::2]):
        assert ours_tok(text)["input_ids"] == hf_tok(text)["input_ids"]
        assert ours_tok(text, pair)["input_ids"] == hf_tok(text, pair)["input_ids"]
    assert hf_tok(lines[0])["input_ids"][0] == hf_tok.cls_token_id and hf_tok(lines[0])["input_ids"][-1] == hf_tok.sep_token_id
    # config.json names the run's own special ids, as transformers' ModernBERT configs do
    assert (config["cls_token_id"], config["sep_token_id"]) == (hf_tok.cls_token_id, hf_tok.sep_token_id)
    reference, info = transformers.ModernBertForMaskedLM.from_pretrained(model_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ours = AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    batch = hf_tok(lines, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = reference.eval()(**batch).logits
        got = ours(batch["input_ids"], batch["attention_mask"]).logits
    real = batch["attention_mask"].bool()
    assert (expected - got)[real].abs().max() <= 1e-5
    return config


def short_config(directory):
    """modernbert-tiny's config.json with 64 positions: a model pretrained at 64 tokens, as ModernBERT's first phase
    (1,024) before its context extension."""
    short = BertConfig.preset("modernbert-tiny").to_dict() | {"max_position_embeddings": 64}
    (directory / "config.json").write_text(json.dumps(short))
    return str(directory / "config.json")


def two_phases(tmp_path, corpus, first_steps, second_steps, **common):
    """Phase 1 at 64 tokens with global θ 10,000; phase 2 --init-from it at 128 tokens with θ 160,000."""
    settings = dict(corpus=[str(corpus)], batch_size=8, warmup_steps=4, lr=3e-3, log_every=5, save_every=100,
                    optimizer="stable-adamw", progress=False) | common
    first = pretrain(PretrainArgs(config=short_config(tmp_path), out=str(tmp_path / "short"), vocab_size=400, max_length=64,
                                  max_steps=first_steps, global_rope_theta=10000.0, **settings))
    second = pretrain(PretrainArgs(init_from=str(first), out=str(tmp_path / "long"), max_length=128,
                                   max_steps=second_steps, global_rope_theta=160000.0, **settings))
    return first, second


def test_init_from_continues_at_a_longer_context_with_the_global_theta_raised(tmp_path, corpus):
    """A few steps of each phase: what each writes loads in transformers as ModernBERT (same ids, same logits);
    phase 2's config has max_position_embeddings 128 and global θ 160,000 (the local θ unchanged), and it started
    from phase 1's weights (the heads and body it loaded, nothing newly initialised)."""
    first, second = two_phases(tmp_path, corpus, 3, 2, demo=False, log_every=1)
    config = assert_transformers_loads_it(first, corpus)
    assert config["max_position_embeddings"] == 64 and config["global_rope_theta"] == 10000.0
    config = assert_transformers_loads_it(second, corpus)
    assert config["max_position_embeddings"] == 128
    assert json.loads((second / "tokenizer_config.json").read_text())["model_max_length"] == 128
    assert rope_thetas(BertConfig.from_pretrained(second)) == {GLOBAL: 160000.0, LOCAL: 10000.0}
    assert transformers.AutoConfig.from_pretrained(second).rope_parameters[GLOBAL]["rope_theta"] == 160000.0
    rows = [json.loads(line) for line in (tmp_path / "long" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "mlm_loss" in r] == [1, 2]


@pytest.mark.slow
def test_modernbert_learns_and_init_from_continues_where_it_ended(tmp_path, corpus):
    """40 steps of phase 1 lower the MLM loss by more than 0.5; phase 2 (--init-from, longer context, θ raised)
    starts well below phase 1's start: it continues the model rather than starting over."""
    first, second = two_phases(tmp_path, corpus, 40, 10)
    start, more = losses(tmp_path / "short"), losses(tmp_path / "long")
    assert start[-1] < start[0] - 0.5, start  # it learns
    assert more[0] < start[0] - 0.5, (start, more)
    assert_transformers_loads_it(second, corpus)


def test_init_from_continues_a_checkpoint_transformers_wrote(tmp_path, corpus):
    """A ModernBertForMaskedLM saved by transformers itself (its config.json spelling, its weight names, fused Wqkv)
    beside a ModernBERT tokenizer: --init-from loads every weight of it (no head newly initialised), trains at its
    θ, and what comes out loads back in transformers."""
    from bertforge.tokenizer import Tokenizer, kind_by_name

    tokenizer = Tokenizer.train(str(corpus), vocab_size=300, kind=kind_by_name("modernbert"), show_progress=False)
    source = tmp_path / "hf"
    hf_config = transformers.ModernBertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=2, max_position_embeddings=64, local_attention=8, global_attn_every_n_layers=3,
        pad_token_id=tokenizer.pad_token_id, cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id)
    torch.manual_seed(0)
    transformers.ModernBertForMaskedLM(hf_config).save_pretrained(source)
    tokenizer.save_pretrained(source)
    out = pretrain(PretrainArgs(init_from=str(source), corpus=[str(corpus)], out=str(tmp_path / "run"), max_length=64,
                                batch_size=4, max_steps=2, warmup_steps=1, log_every=1, progress=False, demo=False))
    config = assert_transformers_loads_it(out, corpus)
    assert (config["num_hidden_layers"], config["local_attention"], config["max_position_embeddings"]) == (3, 8, 64)
    before = transformers.ModernBertForMaskedLM.from_pretrained(source).state_dict()
    after = transformers.ModernBertForMaskedLM.from_pretrained(out).state_dict()
    assert before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed and all((before[k] - after[k]).abs().max() < 0.05 for k in before)  # trained from it, a little
