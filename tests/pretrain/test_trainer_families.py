"""Pretraining RoBERTa, ALBERT, DistilBERT, MPNet, NomicBERT, GTE and ELECTRA with `--config FAMILY-SIZE`: each family's
recipe (objective, masking, AdamW's beta2, tokenizer kind), learning on a small corpus, and `transformers` loading
what comes out as that family with identical token ids and outputs; contradicting settings refused before anything
is written."""

import json
import math

import pytest
import torch

from bertforge import BertConfig
from bertforge.cli import main
from bertforge.pretrain.trainer import PretrainArgs, Pretrainer, pretrain
from tests.helpers import make_corpus

transformers = pytest.importorskip("transformers")

# the hidden sizes of tiny, small enough for a quick run; the family's own settings come from its preset
TINY = ["--batch-size", "8", "--max-length", "32", "--vocab-size", "400", "--max-steps", "40", "--warmup-steps", "4",
        "--lr", "2e-3", "--log-every", "5", "--save-every", "20", "--no-progress"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def write_corpus(directory):
    """`corpus` in `directory` (also the fixture of the command tests, `tests/commands/test_pretrain.py`)."""
    return make_corpus(directory / "corpus.txt", docs=120)


@pytest.mark.parametrize("family,objective,masking,beta2", [
    ("bert", "nsp", "token", 0.999), ("roberta", "mlm", "token", 0.98), ("xlm-roberta", "mlm", "token", 0.98),
    ("distilbert", "mlm", "token", 0.999), ("albert", "sop", "ngram", 0.999),
])
def test_auto_settings_follow_the_family_recipe(family, objective, masking, beta2):
    args = PretrainArgs(config=f"{family}-tiny")
    resolved = args.for_family(args.model_config())
    assert (resolved.objective, resolved.masking, resolved.adam_beta2) == (objective, masking, beta2)
    assert resolved.nsp == (objective == "nsp")
    assert args.for_family(BertConfig.preset(f"{family}-tiny")).objective == objective
    explicit = PretrainArgs(config=f"{family}-tiny", masking="token", adam_beta2=0.95, objective="mlm")
    assert explicit.for_family(BertConfig.preset(f"{family}-tiny")).adam_beta2 == 0.95


@pytest.mark.parametrize("argv,message", [
    (["--config", "roberta-tiny", "--objective", "nsp"], "--objective nsp contradicts --config roberta-tiny"),
    (["--config", "distilbert-tiny", "--objective", "sop"], "DistilBERT is pretrained with MLM only"),
    (["--config", "albert-tiny", "--objective", "nsp"], "sentence order"),
    (["--config", "tiny", "--no-nsp", "--objective", "sop"], "--no-nsp and --objective sop contradict"),
    (["--config", "gpt2-tiny"], "unknown config preset 'gpt2-tiny'"),
])
def test_contradicting_family_settings_are_refused_before_anything_is_written(tmp_path, corpus, capsys, argv, message):
    out = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(out), *argv, *TINY]) != 0
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("family", ["roberta", "albert"])
def test_family_pretraining_learns_and_transformers_loads_it(tmp_path, corpus, family):
    out = tmp_path / "run"
    argv = ["pretrain", "--config", f"{family}-tiny", "--corpus", str(corpus), "--out", str(out), *TINY]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["mlm_loss"] for r in rows if "mlm_loss" in r]
    assert losses[-1] < losses[0] - 0.5, losses  # it learns
    assert ("nsp_loss" in rows[-1]) == (family == "albert")  # ALBERT's sentence-order loss; RoBERTa has none
    model_dir = out / "model"
    config = json.loads((model_dir / "config.json").read_text())
    hf_class = {"roberta": "RobertaForMaskedLM", "albert": "AlbertForPreTraining"}[family]
    assert config["model_type"] == family and config["architectures"] == [hf_class]

    # the tokenizer: the family's kind, trained on the corpus, read by transformers as that family's
    hf_tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert type(hf_tok).__name__.startswith({"roberta": "Roberta", "albert": "Albert"}[family])
    from bertforge.tokenizer import Tokenizer

    ours_tok = Tokenizer.from_pretrained(model_dir)
    text = corpus.read_text().split("\n")[0]
    pair = corpus.read_text().split("\n")[1]
    assert ours_tok(text, pair)["input_ids"] == hf_tok(text, pair)["input_ids"]

    # the model: loaded by transformers' class of the family, with no missing or unexpected weights, same outputs
    reference, info = getattr(transformers, hf_class).from_pretrained(model_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    from bertforge import AutoModelForPreTraining

    ours = AutoModelForPreTraining.from_pretrained(model_dir).eval()
    batch = hf_tok([text, pair], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = reference.eval()(**batch)
        got = ours(**batch)
    expected_logits = expected.prediction_logits if family == "albert" else expected.logits
    real = batch["attention_mask"].bool()
    assert (expected_logits - got.prediction_logits)[real].abs().max() <= 1e-4


def test_roberta_pretraining_resumes_exactly(tmp_path, corpus):
    """The family's run keeps what BERT's has: a kill and --resume give the same weights as one run."""
    common = dict(corpus=[str(corpus)], config="roberta-tiny", batch_size=4, max_length=32, vocab_size=400, lr=1e-3,
                  warmup_steps=2, decay="constant", log_every=2, progress=False, demo=False)  # max_steps-free
    whole = pretrain(PretrainArgs(out=str(tmp_path / "whole"), max_steps=6, save_every=3, **common))
    tokenizer = str(tmp_path / "whole" / "tokenizer")  # tokenizers' trainers differ run to run: share one
    first = tmp_path / "parts"
    pretrain(PretrainArgs(out=str(first), max_steps=3, save_every=3, **{**common, "tokenizer": tokenizer}))
    resumed = pretrain(PretrainArgs(out=str(first), max_steps=6, save_every=3, resume=True,
                                    **{**common, "tokenizer": tokenizer}))
    from safetensors.torch import load_file

    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_albert_shares_its_layers_in_training(tmp_path, corpus):
    args = PretrainArgs(corpus=[str(corpus)], config="albert-mini", out=str(tmp_path / "run"), batch_size=2, max_length=32,
                        vocab_size=400, max_steps=1, progress=False, demo=False)
    trainer = Pretrainer(args)
    try:
        encoder = trainer.model.bert.encoder
        assert len(encoder.layer) == 1 and len(encoder.schedule) == 4  # 4 blocks, one set of weights
        assert trainer.model.bert.embeddings.word_embeddings.weight.shape[1] == 128 < trainer.config.hidden_size
        assert trainer.optimizer.param_groups[0]["betas"] == (0.9, 0.999)
        assert trainer.stream.collator.masking == "ngram" and trainer.stream.sentence_objective == "sop"
    finally:
        trainer.close()
    assert math.isfinite(trainer.train_step()["loss"])


def torchrun(*argv: str, timeout: float = 300) -> None:
    """`bertforge ARGV` under `torchrun --nproc-per-node 2` on CPU (gloo); a hang or a non-zero exit fails."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "bertforge",
           *argv, "--device", "cpu", "--no-progress"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun {' '.join(argv)} hung for {timeout} s")
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_albert_and_distillation_run_under_torchrun(tmp_path, corpus, mode):
    """ALBERT's recipe (shared layers, SOP, n-gram masking) and distillation under DDP and FSDP, two processes."""
    fsdp = ["--fsdp"] if mode == "fsdp" else []
    out = tmp_path / "albert"
    torchrun("pretrain", "--config", "albert-tiny", "--corpus", str(corpus), "--out", str(out), "--batch-size", "2",
             "--max-length", "32", "--vocab-size", "300", "--max-steps", "3", "--save-every", "3", *fsdp)
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == ["AlbertForPreTraining"]
    teacher = tmp_path / "teacher"
    torchrun("pretrain", "--config", "tiny", "--corpus", str(corpus), "--out", str(teacher), "--batch-size", "2",
             "--max-length", "32", "--vocab-size", "300", "--max-steps", "2", "--save-every", "2", "--no-nsp")
    student = tmp_path / "student"
    torchrun("distill", "--teacher", str(teacher / "model"), "--corpus", str(corpus), "--out", str(student),
             "--batch-size", "2", "--max-length", "32", "--max-steps", "3", "--save-every", "3", *fsdp)
    assert json.loads((student / "model" / "config.json").read_text())["architectures"] == ["DistilBertForMaskedLM"]


#: the embedding families' presets: their transformers MLM class and the tokenizer class their files name
EMBEDDERS = {"mpnet-tiny": ("MPNetForMaskedLM", "MPNetTokenizer"),
             "nomicbert-tiny": ("NomicBertForMaskedLM", "BertTokenizer"),
             "gte-tiny": ("GteForMaskedLM", "BertTokenizer"),
             "eurobert-tiny": ("EuroBertForMaskedLM", "PreTrainedTokenizerFast"),
             "jina-v3-tiny": ("JinaEmbeddingsV3ForMaskedLM", "XLMRobertaTokenizer")}


def test_the_embedding_families_recipes():
    resolved = {name: PretrainArgs(config=name).for_family(BertConfig.preset(name)) for name in EMBEDDERS}
    assert {name: (r.objective, r.mlm_probability) for name, r in resolved.items()} == {
        "mpnet-tiny": ("mlm", 0.15), "nomicbert-tiny": ("mlm", 0.3), "gte-tiny": ("mlm", 0.3),
        "eurobert-tiny": ("mlm", 0.5), "jina-v3-tiny": ("mlm", 0.15)}
    assert resolved["mpnet-tiny"].adam_beta2 == 0.98


@pytest.mark.parametrize("preset", list(EMBEDDERS))
def test_an_embedding_family_preset_learns_and_transformers_reads_what_it_writes(tmp_path, corpus, preset):
    """MPNet, NomicBERT, GTE, EuroBERT and jina-embeddings-v3: MLM loss down by more than 0.5 in 40 steps; OUT/model is the family's MLM class in
    transformers (no missing or unexpected weights, logits within 1e-5) with identical token ids, pairs too."""
    from bertforge import AutoModelForMaskedLM
    from bertforge.tokenizer import Tokenizer

    hf_class, tokenizer_class = EMBEDDERS[preset]
    out = pretrain(PretrainArgs(config=preset, corpus=[str(corpus)], out=str(tmp_path / "run"), vocab_size=400,
                                max_length=64, max_steps=40, batch_size=8, warmup_steps=4, lr=3e-3, log_every=5,
                                save_every=100, progress=False, demo=False))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["mlm_loss"] for r in rows if "mlm_loss" in r]
    assert losses[-1] < losses[0] - 0.5, losses
    assert json.loads((out / "config.json").read_text())["architectures"] == [hf_class]
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


def test_electras_recipe_is_the_papers_replaced_token_detection(tmp_path, corpus):
    """`--config electra-SIZE`: replaced-token detection at 15 % masking, λ 50, a generator as deep and a quarter as
    wide sharing the token and position tables."""
    args = PretrainArgs(config="electra-small")
    resolved = args.for_family(args.model_config())
    assert (resolved.objective, resolved.mlm_probability, resolved.rtd_weight) == ("rtd", 0.15, 50.0)
    trainer = Pretrainer(PretrainArgs(corpus=[str(corpus)], config="electra-tiny", out=str(tmp_path / "run"),
                                      batch_size=2, max_length=32, vocab_size=400, max_steps=1, progress=False,
                                      demo=False))
    try:
        generator, discriminator = trainer.model.generator, trainer.model.discriminator
        assert discriminator.config.hidden_size == 4 * generator.config.hidden_size == 128
        assert generator.config.num_hidden_layers == discriminator.config.num_hidden_layers == 2
        assert discriminator.bert.embeddings.word_embeddings.weight.shape[1] == 64 < 128  # E = H / 2
        assert discriminator.input_embeddings() is generator.input_embeddings()
        assert trainer.objective.weight == 50.0
    finally:
        trainer.close()
    assert math.isfinite(trainer.train_step()["loss"])


def test_electra_tiny_learns_and_transformers_reads_its_discriminator_and_generator(tmp_path, corpus):
    """40 steps of `pretrain --config electra-tiny`: the generator's MLM loss and the discriminator's replaced-token
    loss fall; OUT/model is an ElectraForPreTraining and OUT/generator an ElectraForMaskedLM in transformers (no
    missing or unexpected weights, logits within 1e-5), the tokenizer BERT's WordPiece with identical ids."""
    from bertforge import AutoModelForMaskedLM, AutoModelForPreTraining
    from bertforge.tokenizer import Tokenizer

    out = tmp_path / "run"
    pretrain(PretrainArgs(config="electra-tiny", corpus=[str(corpus)], out=str(out), vocab_size=400, max_length=64,
                          max_steps=40, batch_size=8, warmup_steps=4, lr=3e-3, log_every=5, save_every=100,
                          progress=False, demo=False))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    mlm, rtd = [r["mlm_loss"] for r in rows if "mlm_loss" in r], [r["rtd_loss"] for r in rows if "rtd_loss" in r]
    assert mlm[-1] < mlm[0] - 0.5 and rtd[-1] < rtd[0] - 0.05, (mlm, rtd)
    lines = [line for line in corpus.read_text().splitlines() if line][:6]
    for name, hf_class, ours_class in (("model", "ElectraForPreTraining", AutoModelForPreTraining),
                                       ("generator", "ElectraForMaskedLM", AutoModelForMaskedLM)):
        directory = out / name
        assert json.loads((directory / "config.json").read_text())["architectures"] == [hf_class]
        hf_tok, ours_tok = transformers.AutoTokenizer.from_pretrained(directory), Tokenizer.from_pretrained(directory)
        assert type(hf_tok).__name__.startswith("Bert")
        for text, pair in zip(lines[::2], lines[1::2]):
            assert ours_tok(text, pair)["input_ids"] == hf_tok(text, pair)["input_ids"]
        reference, info = getattr(transformers, hf_class).from_pretrained(directory, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
        ours = ours_class.from_pretrained(directory).eval()
        batch = hf_tok(lines, padding=True, truncation=True, max_length=64, return_tensors="pt")
        with torch.no_grad():
            expected = reference.eval()(**batch).logits
            got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
        real = batch["attention_mask"].bool()
        assert (expected - got)[real].abs().max() <= 1e-5, name


def test_an_electra_run_resumes_bitwise_and_init_from_continues_both_networks(tmp_path, corpus, monkeypatch):
    """The tied tables through a checkpoint: a run stopped after step 2 and resumed ends bitwise where one run does;
    --init-from its OUT/model continues the discriminator with the generator beside it, both reading one table."""
    from safetensors.torch import load_file

    common = dict(corpus=[str(corpus)], config="electra-tiny", batch_size=4, max_length=32, vocab_size=400, lr=1e-3,
                  warmup_steps=1, log_every=1, max_steps=4, save_every=2, progress=False, demo=False)
    straight = tmp_path / "straight"
    pretrain(PretrainArgs(out=str(straight), **common))
    tokenizer = str(straight / "tokenizer")  # tokenizers' trainers differ run to run: share one
    broken = tmp_path / "broken"
    real_step = Pretrainer.train_step

    def step(self):
        if self.step == 3:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(Pretrainer, "train_step", step)
    with pytest.raises(KeyboardInterrupt):
        pretrain(PretrainArgs(out=str(broken), tokenizer=tokenizer, **common))
    monkeypatch.setattr(Pretrainer, "train_step", real_step)
    pretrain(PretrainArgs(out=str(broken), tokenizer=tokenizer, resume=True, **common))
    whole = tmp_path / "whole"  # the same tokenizer, one run
    pretrain(PretrainArgs(out=str(whole), tokenizer=tokenizer, **common))
    for name in ("model", "generator"):
        a, b = (load_file(str(out / name / "model.safetensors")) for out in (whole, broken))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name

    rest = {k: v for k, v in common.items() if k not in ("config", "vocab_size")}
    trainer = Pretrainer(PretrainArgs(init_from=str(whole / "model"), out=str(tmp_path / "more"),
                                      **{**rest, "max_steps": 1}))
    try:
        words = load_file(str(whole / "model" / "model.safetensors"))["electra.embeddings.word_embeddings.weight"]
        assert torch.equal(trainer.model.discriminator.input_embeddings(), words)
        assert trainer.model.discriminator.input_embeddings() is trainer.model.generator.input_embeddings()
        assert trainer.model.generator.config.hidden_size == 32  # the generator beside it, continued
    finally:
        trainer.close()
