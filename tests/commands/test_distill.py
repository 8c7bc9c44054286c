"""`bertforge distill` (`bertforge.commands.distill`): a run through the command line with its options."""

import json

import pytest
import torch

import bertforge
from bertforge.cli import main
from tests.pretrain.test_distill import make_teacher

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def inputs(corpus_and_tokenizer):
    """(corpus, tokenizer dir) for tiny runs (`corpus_and_tokenizer`: a fixture of tests/conftest.py)."""
    corpus, tok, _ = corpus_and_tokenizer
    return corpus, tok


def test_distill_learns_and_transformers_loads_the_student(tmp_path, inputs, capsys):
    corpus, tok = inputs
    teacher_dir = make_teacher(tmp_path / "teacher", tok)
    out = tmp_path / "student"
    assert main(["distill", "--teacher", str(teacher_dir), "--corpus", str(corpus), "--out", str(out),
                 "--batch-size", "8", "--max-length", "32", "--max-steps", "30", "--warmup-steps", "3", "--lr", "2e-3",
                 "--log-every", "5", "--save-every", "15", "--temperature", "2", "--alpha-ce", "5", "--alpha-mlm", "2",
                 "--alpha-cos", "1", "--no-progress"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"ce_loss", "cos_loss", "mlm_loss"} <= set(rows[-1])
    assert rows[-1]["loss"] < rows[0]["loss"], [r["loss"] for r in rows]  # it learns
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["model_type"] == "distilbert" and config["n_layers"] == 2
    student, info = transformers.DistilBertForMaskedLM.from_pretrained(out / "model", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    hf_tok = transformers.AutoTokenizer.from_pretrained(out / "model")
    assert hf_tok.get_vocab() == transformers.AutoTokenizer.from_pretrained(teacher_dir).get_vocab()
    ours = bertforge.AutoModelForMaskedLM.from_pretrained(out / "model").eval()
    batch = hf_tok(["the cat sat", "a dog"], padding=True, return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        diff = (student.eval()(**batch).logits - ours(**batch).logits)[batch["attention_mask"].bool()]
    assert diff.abs().max() <= 1e-5


def test_run_config_replays_a_distillation_and_a_missing_teacher_is_one_line(tmp_path, monkeypatch, capsys):
    import dataclasses

    import bertforge.pretrain.distill as distill_module
    from bertforge.pretrain.distill import DistillArgs

    seen = []
    monkeypatch.setattr(distill_module, "distill", seen.append)
    recorded = dataclasses.asdict(DistillArgs(teacher="t", corpus=["c.txt"], temperature=3.0, max_steps=40))
    (tmp_path / "run_config.json").write_text(json.dumps(recorded))
    assert main(["distill", "--run-config", str(tmp_path), "--max-steps", "8", "--out", "again"]) == 0
    (args,) = seen
    assert (args.teacher, args.corpus, args.temperature, args.max_steps, args.out) == ("t", ["c.txt"], 3.0, 8, "again")
    monkeypatch.undo()
    assert main(["distill", "--corpus", "c.txt"]) == 2
    assert "--teacher is required" in capsys.readouterr().err
