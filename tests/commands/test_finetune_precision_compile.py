"""`bertforge finetune --precision` and `--compile` on the CPU: fp16 (with its loss scaler) and bf16 fine-tuning
runs train through the shared step with fp32 weights; a compiled run goes through torch.compile's graphs and
follows the eager run (backend eager: dynamo's graphs run as they are, ~13 s on this 2-core machine; slow:
aot_eager, AOTAutograd's forward and backward graphs with eager kernels, ~20 s, and inductor's generated code,
minutes)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertforge import BertModel
from bertforge.cli import main
from bertforge.finetune import trainer
from tests.finetune.conftest import vocabulary, write_sentiment
from tests.helpers import count_graphs, tiny_config, write_uncased_tokenizer

# tiny_model, the tiny BERT of the fine-tuning tests: a fixture of tests/commands/conftest.py

FAST = ["--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--no-progress", "--log-every", "1", "--device", "cpu"]


def run(capsys, model: Path, tmp_path: Path, name: str, *extra: str, examples: int = 24) -> Path:
    train = write_sentiment(tmp_path / "train.tsv", examples)
    dev = write_sentiment(tmp_path / "dev.tsv", 8)
    out = tmp_path / name
    rc = main(["finetune", "--task", "classification", "--model", str(model), "--train", str(train), "--dev", str(dev),
               "--out", str(out), *FAST, *extra])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    return out


def losses(out: Path) -> list[float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["type"] == "train"]


@pytest.fixture
def steppers(monkeypatch) -> list[trainer.TrainStep]:
    """Every TrainStep fine-tuning builds, kept for a look after the run."""
    made = []

    class Watched(trainer.TrainStep):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(trainer, "TrainStep", Watched)
    return made


@pytest.mark.parametrize("precision, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_finetune_half_precision_trains_with_fp32_weights(tiny_model, tmp_path, capsys, steppers, precision, dtype):
    out = run(capsys, tiny_model, tmp_path, precision, "--precision", precision)
    (stepper,) = steppers
    assert stepper.precision is dtype and stepper.scaler.is_enabled() == (precision == "fp16")
    assert stepper.step == 3 and stepper.skipped_steps == 0
    assert all(p.dtype == torch.float32 for p in stepper.model.parameters())
    assert len(losses(out)) == 3 and all(math.isfinite(x) for x in losses(out))
    saved = load_file(str(out / "model" / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in saved.values())
    assert json.loads((out / "finetune_config.json").read_text())["precision"] == precision
    if precision == "fp16":
        assert stepper.scaler.get_scale() == 2.0**16  # three clean steps: never halved


def test_finetune_refuses_an_unknown_precision_in_a_saved_config(tiny_model, tmp_path, capsys):
    out = run(capsys, tiny_model, tmp_path, "first")
    config = json.loads((out / "finetune_config.json").read_text())
    assert config["precision"] == "auto" and config["compile"] is False
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**config, "precision": "fp8", "out": str(tmp_path / "second")}))
    assert main(["finetune", "--run-config", str(bad)]) != 0
    assert "precision must be one of auto, fp32, bf16, fp16, got 'fp8'" in capsys.readouterr().err
    assert not (tmp_path / "second").exists()


@pytest.fixture(scope="module")
def no_dropout_model(tmp_path_factory) -> Path:
    """The tiny BERT without dropout: a compiled run draws its random masks its own way."""
    directory = tmp_path_factory.mktemp("no_dropout")
    vocab = vocabulary()
    write_uncased_tokenizer(directory, vocab)
    torch.manual_seed(0)
    config = tiny_config(vocab_size=len(vocab), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    BertModel(config).save_pretrained(directory)
    return directory


EPOCHS = ["--epochs", "3"]  # of one batch (8 examples): the shapes repeat, so each graph is compiled once


@pytest.mark.parametrize("backend", ["eager", pytest.param("aot_eager", marks=pytest.mark.slow),
                                     pytest.param(None, marks=pytest.mark.slow, id="inductor")])
def test_finetune_compile_follows_eager(no_dropout_model, tmp_path, capsys, monkeypatch, steppers, backend):
    """The training steps run the compiled module (its graphs reach the backend) and lose what the eager steps
    lose. Without dropout (the batches are the seed's either way). The bar, 1e-5 on losses of 0.7,
    is fp32 reordering's; a step that skipped the model or compiled something else would be far off."""
    eager = run(capsys, no_dropout_model, tmp_path, "eager", *EPOCHS, examples=8)
    graphs = count_graphs(monkeypatch, backend)
    compiled = run(capsys, no_dropout_model, tmp_path, "compiled", "--compile", *EPOCHS, examples=8)
    assert len(graphs) >= 1
    assert all(not hasattr(s.model, "_orig_mod") for s in steppers)  # the step clips the plain module's weights
    gap = max(abs(a - b) for a, b in zip(losses(compiled), losses(eager)))
    print(f"finetune --compile ({backend or 'inductor'}): {len(graphs)} graphs, loss gap {gap:.2e}")
    assert len(losses(compiled)) == len(losses(eager)) == 3 and gap <= 1e-5, (losses(compiled), losses(eager))
    a, b = (load_file(str(d / "model" / "model.safetensors")) for d in (eager, compiled))
    assert a.keys() == b.keys()  # saved under the plain names, no _orig_mod. prefix
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-4
