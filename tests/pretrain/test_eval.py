"""Held-out evaluation of pretraining: the fixed masked set, its numbers against an independent computation, the
rows in metrics.jsonl / TensorBoard / the curves, OUT/best, early stopping, and determinism across resume and
across process counts; evaluating never changes what is trained."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from bertforge import BertforgeError
from bertforge.pretrain.trainer import PretrainArgs, Pretrainer, pretrain
from bertforge.training.run_dir import list_checkpoints
from bertforge.pretrain.eval import HeldOutEvaluation, build_eval_set
from tests.helpers import make_corpus, tiny_run_args

# corpus_and_tokenizer, the tiny corpus, tokenizer and config.json: a fixture of tests/conftest.py


@pytest.fixture(scope="module")
def eval_text(tmp_path_factory) -> Path:
    """Held-out documents of the same words, other sentences."""
    return write_eval_text(tmp_path_factory.mktemp("eval"))


def write_eval_text(directory: Path) -> Path:
    """`eval_text` in `directory` (also the fixture of the command tests, `tests/commands/test_pretrain.py`)."""
    return make_corpus(directory / "eval.txt", docs=12, seed=99)


def eval_args(corpus_and_tokenizer, out: Path, eval_text: Path | None = None, **kw) -> PretrainArgs:
    settings = dict(max_steps=8, lr=1e-3, warmup_steps=2, save_every=4, log_every=2, eval_every=2,
                    eval_max_instances=18, keep_checkpoints=10)
    if eval_text is not None:
        settings["eval_corpus"] = [str(eval_text)]
    return tiny_run_args(corpus_and_tokenizer, out, **{**settings, **kw})


def rows(out: Path, kind: str | None = None) -> list[dict]:
    found = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in found if r.get("type") == kind] if kind else found


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_eval_rows_best_model_tensorboard_and_curves(corpus_and_tokenizer, eval_text, tmp_path):
    transformers = pytest.importorskip("transformers")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    pretrain(eval_args(corpus_and_tokenizer, out, eval_text, max_steps=9, eval_every=4))
    evals = rows(out, "eval")
    assert [r["step"] for r in evals] == [0, 4, 8, 9]  # at the start, every --eval-every steps and at the end
    for r in evals:
        assert set(r) == {"type", "step", "eval_loss", "eval_perplexity", "eval_mlm_accuracy", "eval_nsp_accuracy"}
        assert r["eval_perplexity"] == pytest.approx(math.exp(r["eval_loss"]))
        assert 0 <= r["eval_mlm_accuracy"] <= 1 and 0 <= r["eval_nsp_accuracy"] <= 1
    assert abs(evals[0]["eval_loss"] - math.log(120)) < 0.7  # random weights: about a uniform guess
    best = min(evals, key=lambda r: r["eval_loss"])
    info = json.loads((out / "best" / "eval.json").read_text())
    assert info == {k: v for k, v in best.items() if k != "type"}
    card = (out / "best" / "README.md").read_text(encoding="utf-8")  # the model card states the run and its result
    assert "pipeline_tag: fill-mask" in card and "`bertforge pretrain`" in card and "- max_steps: `9`" in card
    assert f"| eval_loss | {info['eval_loss']:.4f} |" in card
    if best["step"] in (4, 8):  # the best model is the checkpoint of its step
        assert same_weights(weights(out / "best"), weights(out / "checkpoints" / f"step-{best['step']}"))
    _, loading = transformers.BertForPreTraining.from_pretrained(out / "best", output_loading_info=True)
    assert not loading["missing_keys"]
    assert transformers.AutoTokenizer.from_pretrained(out / "best")("river")["input_ids"][0] == 2  # [CLS]
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/eval_loss")] == [0, 4, 8, 9]
    assert (out / "training_curves.png").stat().st_size > 1000


def test_evaluation_trains_exactly_the_same_weights(corpus_and_tokenizer, eval_text, tmp_path):
    """Evaluating (its own streams and generator, eval mode) draws nothing from the training RNGs."""
    plain, evaluated = tmp_path / "plain", tmp_path / "evaluated"
    pretrain(eval_args(corpus_and_tokenizer, plain, eval_every=None))
    pretrain(eval_args(corpus_and_tokenizer, evaluated, eval_text, eval_every=1))
    assert len(rows(evaluated, "eval")) == 9
    assert same_weights(weights(plain / "model"), weights(evaluated / "model"))
    strip = lambda out: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in rows(out) if "type" not in r]  # noqa: E731
    assert strip(plain) == strip(evaluated)


def test_the_eval_set_is_fixed_whatever_the_seed(corpus_and_tokenizer, eval_text, tmp_path):
    from bertforge.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(corpus_and_tokenizer[1])
    a = build_eval_set(eval_args(corpus_and_tokenizer, tmp_path, eval_text), [], tok)
    b = build_eval_set(eval_args(corpus_and_tokenizer, tmp_path, eval_text, seed=17), [], tok)
    assert len(a) == 5 and sum(len(batch["input_ids"]) for batch in a) == 18  # 4 + 4 + 4 + 4 + 2
    assert all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b))
    assert all((batch["labels"] != -100).any() for batch in a)


def test_eval_numbers_match_a_dense_computation(corpus_and_tokenizer, eval_text, tmp_path):
    """eval_loss, accuracies: recomputed here with the dense MLM head (every position projected, the mean taken
    by F.cross_entropy over all the set's targets at once), not the sparse path the evaluation uses."""
    trainer = Pretrainer(eval_args(corpus_and_tokenizer, tmp_path / "run", eval_text))
    got = trainer.evaluation.evaluate(trainer.model)
    assert trainer.model.training  # put back in training mode
    logits, targets, nsp_right, nsp_count = [], [], 0, 0
    trainer.model.eval()
    with torch.no_grad():
        for batch in trainer.evaluation.batches:
            out = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                token_type_ids=batch["token_type_ids"], sparse_mlm=False)
            keep = batch["labels"] != -100
            logits.append(out.prediction_logits[keep])
            targets.append(batch["labels"][keep])
            nsp_right += int((out.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]).sum())
            nsp_count += len(batch["next_sentence_label"])
    logits, targets = torch.cat(logits), torch.cat(targets)
    assert got["eval_loss"] == pytest.approx(F.cross_entropy(logits, targets).item(), rel=1e-5)
    assert got["eval_mlm_accuracy"] == pytest.approx((logits.argmax(-1) == targets).double().mean().item(), rel=1e-12)
    assert got["eval_nsp_accuracy"] == nsp_right / nsp_count
    again = trainer.evaluation.evaluate(trainer.model)
    assert again == got  # the same masks, the same numbers


def loss_of_the_weights(real):
    """An eval loss that goes up and down as training goes on: a function of the weights alone, so that a resumed
    run sees the very same sequence."""

    def evaluate(self, model):
        result = real(self, model)
        total = sum(p.double().sum().item() for p in model.parameters())
        result["eval_loss"] = 3.0 + math.sin(total * 1e4)
        return result

    return evaluate


def test_resumed_run_evaluates_and_decides_as_an_uninterrupted_one(corpus_and_tokenizer, eval_text, tmp_path,
                                                                  monkeypatch):
    from tests.pretrain.test_trainer import crash_after_seven

    monkeypatch.setattr(HeldOutEvaluation, "evaluate", loss_of_the_weights(HeldOutEvaluation.evaluate))
    settings = dict(eval_every=1, early_stop_patience=50, max_steps=12)
    straight = tmp_path / "straight"
    pretrain(eval_args(corpus_and_tokenizer, straight, eval_text, **settings))
    broken = tmp_path / "broken"
    crash_after_seven(monkeypatch, eval_args(corpus_and_tokenizer, broken, eval_text, **settings))
    pretrain(eval_args(corpus_and_tokenizer, broken, eval_text, resume=True, **settings))
    state = lambda out: json.loads((out / "checkpoints" / "step-12" / "trainer_state.json").read_text())["evaluation"]  # noqa: E731
    assert state(broken) == state(straight)
    assert rows(broken, "eval") == rows(straight, "eval")
    # the record is not trivial: the loss went up at least once, so "evaluations since the best" counted (the
    # final count may be 0 when the last evaluation happens to be the best: the fake loss is chaotic in the weights)
    losses = [row["eval_loss"] for row in rows(straight, "eval")]
    assert any(later > earlier for earlier, later in zip(losses, losses[1:]))
    assert same_weights(weights(broken / "best"), weights(straight / "best"))
    assert (broken / "best" / "eval.json").read_text() == (straight / "best" / "eval.json").read_text()


def test_early_stopping_ends_the_run_cleanly_and_a_resume_does_not_train_on(corpus_and_tokenizer, eval_text,
                                                                            tmp_path, monkeypatch, caplog):
    losses = iter([5.0, 4.0, 4.5, 4.0, 4.2] + [1.0] * 20)  # best 4.0 at step 2; no lower at 4, 6, 8: stop at 8

    def scripted(self, model):
        return {"eval_loss": next(losses), "eval_perplexity": 1.0, "eval_mlm_accuracy": 0.0}

    monkeypatch.setattr(HeldOutEvaluation, "evaluate", scripted)
    caplog.set_level(logging.INFO, logger="bertforge")  # whatever level an earlier test left the logger at
    out = tmp_path / "run"
    settings = dict(max_steps=20, early_stop_patience=3, save_every=5)
    trainer = Pretrainer(eval_args(corpus_and_tokenizer, out, eval_text, **settings))
    trainer.run()
    assert trainer.step == 8
    assert [r["step"] for r in rows(out, "eval")] == [0, 2, 4, 6, 8]
    assert [s for s, _ in list_checkpoints(out)] == [5, 8]  # a checkpoint where it stopped
    assert json.loads((out / "best" / "eval.json").read_text())["step"] == 2
    assert (out / "model" / "model.safetensors").is_file()
    assert "early stop at step 8" in caplog.text
    resumed = Pretrainer(eval_args(corpus_and_tokenizer, out, eval_text, resume=True, **settings))
    resumed.run()
    assert resumed.step == 8 and [s for s, _ in list_checkpoints(out)] == [5, 8]


def test_eval_fraction_holds_out_whole_documents_the_same_on_every_rank(tmp_path):
    """The split is by document number: disjoint, covering, about the fraction, and the same documents whatever the
    number of ranks (each rank's share of the training side comes from the same documents)."""
    from bertforge.data import CorpusReader, DocumentSplit

    corpus = make_corpus(tmp_path / "c.txt", docs=2000)
    def numbers(held_out: bool, rank: int = 0, world: int = 1) -> set[int]:
        reader = CorpusReader([corpus], cycle=False, rank=rank, world_size=world, split=DocumentSplit(0.1, held_out))
        return {doc.index for doc in reader}

    held, kept = numbers(True), numbers(False)
    assert not held & kept and held | kept == set(range(2000))
    assert abs(len(held) - 200) < 4 * math.sqrt(2000 * 0.1 * 0.9)
    assert numbers(False, 0, 2) | numbers(False, 1, 2) == kept
    assert numbers(True) == held  # the same documents again


def test_eval_fraction_run_trains_on_the_rest(corpus_and_tokenizer, tmp_path):
    trainer = Pretrainer(eval_args(corpus_and_tokenizer, tmp_path / "run", eval_fraction=0.2, eval_max_instances=8))
    split = trainer.stream.reader.split
    assert (split.fraction, split.held_out) == (0.2, False)
    assert sum(len(b["input_ids"]) for b in trainer.evaluation.batches) == 8
    trainer.run()
    assert [r["step"] for r in rows(tmp_path / "run", "eval")] == [0, 2, 4, 6, 8]


@pytest.mark.parametrize("change, message", [
    (dict(eval_every=5), "--eval-every needs held-out text"),
    (dict(early_stop_patience=2), "--early-stop-patience needs held-out text"),
    (dict(eval_fraction=1.5), "--eval-fraction must be in"),
    (dict(eval_fraction=0.1, eval_corpus=["x.txt"]), "--eval-fraction contradicts --eval-corpus"),
    (dict(eval_corpus=["/nonexistent/eval.txt"]), "does not exist"),
    (dict(eval_fraction=0.001), "--eval-fraction 0.001 holds out: .*no document left to read: 0 of its 40"),
    (dict(eval_fraction=0.1, eval_max_instances=0), "--eval-max-instances must be a positive integer"),
])
def test_bad_eval_settings_are_refused_before_anything_is_written(corpus_and_tokenizer, tmp_path, change, message):
    with pytest.raises(BertforgeError, match=message):
        pretrain(eval_args(corpus_and_tokenizer, tmp_path / "run", **{"eval_every": None, **change}))
    assert not (tmp_path / "run").exists()


def torchrun_eval(corpus_and_tokenizer, out: Path, eval_text: Path, *extra: str, init_from: Path | None = None) -> dict:
    """The step-0 evaluation of a 2-process run (5 batches of 2 sequences, split 3 + 2 over the ranks)."""
    from tests.pretrain.test_trainer import torchrun_pretrain

    torchrun_pretrain(corpus_and_tokenizer, out, "--max-steps", "2", "--eval-corpus", str(eval_text),
                      "--eval-every", "2", "--eval-max-instances", "10", *extra, init_from=init_from)
    return rows(out, "eval")[0]


def assert_same_evaluation(two: dict, one: dict) -> None:
    assert two["step"] == one["step"] == 0
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-6)
    assert two["eval_mlm_accuracy"] == one["eval_mlm_accuracy"]
    assert two["eval_nsp_accuracy"] == one["eval_nsp_accuracy"]


def test_two_ddp_processes_report_the_eval_loss_of_one(corpus_and_tokenizer, eval_text, tmp_path):
    """Step 0 (the same initial weights whatever the process count): each rank evaluates its batches, the sums are
    all-reduced; one process evaluates all 5. (FSDP: tests/pretrain/test_trainer_init.py, from a checkpoint.)"""
    two = torchrun_eval(corpus_and_tokenizer, tmp_path / "two", eval_text)
    single = tmp_path / "one"
    pretrain(eval_args(corpus_and_tokenizer, single, eval_text, batch_size=2, max_steps=2, eval_max_instances=10,
                       device="cpu"))
    assert_same_evaluation(two, rows(single, "eval")[0])


@pytest.mark.parametrize("objective", ["nsp", "mlm"])
def test_the_eval_fraction_set_reads_no_training_document(corpus_and_tokenizer, tmp_path, objective):
    """Every document is one word repeated, so each token of a sequence names its document: the documents the
    held-out set's sequences come from (read back from its batches, masked tokens from their labels) and those the
    training stream's sequences come from are disjoint, and both are non-empty."""
    from bertforge.pretrain.data import pretraining_stream
    from bertforge.tokenizer import Tokenizer
    from tests.helpers import WORDS

    tok = Tokenizer.from_pretrained(corpus_and_tokenizer[1])
    word_of = {}
    for word in WORDS:
        ids = tok.encode_ids([word])[0]
        if len(ids) == 1:
            word_of[ids[0]] = word
    words = sorted(word_of.values())
    assert len(words) >= 12
    corpus = tmp_path / "one-word-documents.txt"
    corpus.write_text("\n\n".join("\n".join(" ".join([w] * (4 + (i + j) % 5)) + " ." for j in range(4))
                                  for i, w in enumerate(words)) + "\n", encoding="utf-8")
    args = eval_args(corpus_and_tokenizer, tmp_path / "run", corpus=[str(corpus)], eval_fraction=0.4,
                     eval_max_instances=200, objective=objective, eval_every=None)
    specials = {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id}

    def documents(ids) -> set[str]:
        found = {word_of.get(int(t)) for t in ids if int(t) not in specials}
        found.discard(None)  # the "." of every sentence
        return found

    held = set()
    for batch in build_eval_set(args, [str(corpus)], tok):
        original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
        for row in original:
            held |= documents(row)
    stream = pretraining_stream(args, [str(corpus)], tok, 0, 1, args.batch_size, max_epochs=1)
    try:
        trained = set()
        for instance in stream.next_instances(10_000):
            trained |= documents(instance.input_ids)
    finally:
        stream.close()
    assert held and trained
    assert not held & trained, f"held-out set built from training documents: {sorted(held & trained)}"
    assert held | trained <= set(words)
