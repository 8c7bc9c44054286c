"""Pretraining end to end on tiny generated corpora: outputs, exact resume, skipped steps, bad input."""

import dataclasses
import json
import logging
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertforge import BertforgeError
from bertforge.pretrain.trainer import PretrainArgs, Pretrainer, pretrain
from bertforge.core.state import load_state
from bertforge.model import BertForPreTraining
from bertforge.training.loop import Interrupted
from bertforge.training.run_dir import list_checkpoints
from tests.helpers import tiny_run_args

# corpus_and_tokenizer, the tiny corpus, tokenizer and config.json: a fixture of tests/conftest.py


def args(corpus_and_tokenizer, out, **kw) -> PretrainArgs:
    return tiny_run_args(corpus_and_tokenizer, out, **{"max_steps": 12, "lr": 1e-3, "warmup_steps": 2,
                                                       "save_every": 4, "log_every": 2, **kw})


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model" / "model.safetensors"))


def test_run_writes_everything_transformers_can_load(corpus_and_tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "run"
    pretrain(args(corpus_and_tokenizer, out, keep_checkpoints=2))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6, 8, 10, 12]
    for key in ("loss", "mlm_loss", "nsp_loss", "lr", "grad_norm", "tokens_per_s", "mlm_accuracy"):
        assert all(math.isfinite(r[key]) for r in rows), key
    assert (out / "training_curves.png").stat().st_size > 1000
    assert any((out / "tensorboard").iterdir())
    assert [s for s, _ in list_checkpoints(out)] == [8, 12]  # keep_checkpoints=2
    hf, info = transformers.BertForPreTraining.from_pretrained(out / "model", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    hf_tok = transformers.AutoTokenizer.from_pretrained(out / "model")
    assert hf_tok("river stone")["input_ids"][0] == hf_tok.cls_token_id


def test_loss_starts_near_ln_vocab_and_falls(corpus_and_tokenizer, tmp_path):
    out = tmp_path / "run"
    pretrain(args(corpus_and_tokenizer, out, max_steps=60, log_every=1, save_every=60, warmup_steps=5))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert abs(rows[0]["mlm_loss"] - math.log(120)) < 0.7
    first = sum(r["mlm_loss"] for r in rows[:5]) / 5
    last = sum(r["mlm_loss"] for r in rows[-5:]) / 5
    assert last < first - 0.3, (first, last)  # a random-word corpus: the floor is about ln(len(helpers.WORDS))


def test_lamb_pretraining_loss_falls(corpus_and_tokenizer, tmp_path):
    from bertforge.training.optim import Lamb

    out = tmp_path / "run"
    trainer = Pretrainer(args(corpus_and_tokenizer, out, optimizer="lamb", lr=3e-2, max_steps=60, log_every=1,
                              save_every=60, warmup_steps=5))
    assert isinstance(trainer.optimizer, Lamb)
    trainer.run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in rows) and rows[-1]["skipped_steps"] == 0
    first = sum(r["mlm_loss"] for r in rows[:5]) / 5
    last = sum(r["mlm_loss"] for r in rows[-5:]) / 5
    assert last < first - 0.3, (first, last)


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_logged_learning_rate_follows_warmup_then_decay(corpus_and_tokenizer, tmp_path, decay):
    """The lr column of metrics.jsonl is the rate each step ran at: step s (1-based) is optimizer step t = s - 1,
    which runs at peak x (t + 1) / warmup during warmup, then peak x (1 - p) (linear) or peak x (1 + cos(pi p)) / 2
    (cosine) with p = (t - warmup) / (max_steps - warmup). Checked at every step, warmup and decay boundaries
    included; the run's own lr values are never the expectation."""
    peak, warmup, total = 2e-3, 3, 11  # the decay spans steps t = 3..11: its middle is t = 7 (logged step 8)
    out = tmp_path / "run"
    pretrain(args(corpus_and_tokenizer, out, lr=peak, warmup_steps=warmup, max_steps=total, decay=decay, log_every=1,
                  save_every=total, nsp=False))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, total + 1))
    for row in rows:
        t = row["step"] - 1
        if t < warmup:
            want = peak * (t + 1) / warmup
        else:
            p = (t - warmup) / (total - warmup)
            want = peak * (1 - p) if decay == "linear" else peak * (1 + math.cos(math.pi * p)) / 2
        assert row["lr"] == pytest.approx(want, rel=1e-9), (row["step"], row["lr"], want)
    by_step = {r["step"]: r["lr"] for r in rows}
    assert by_step[1] == pytest.approx(peak / 3) and by_step[3] == pytest.approx(peak) and by_step[4] == pytest.approx(peak)
    assert by_step[8] == pytest.approx(peak / 2)  # the middle of the decay, for both kinds
    assert by_step[5] == pytest.approx(peak * (0.875 if decay == "linear" else (1 + math.cos(math.pi / 8)) / 2))


class Interrupt(Exception):
    pass


def crash_after_seven(monkeypatch, settings: PretrainArgs) -> None:
    """Run `settings` until the eighth step starts, then stop it with an exception (a crash mid-run)."""
    real_step = Pretrainer.train_step

    def step(self):
        if self.step == 7:
            raise Interrupt()
        return real_step(self)

    monkeypatch.setattr(Pretrainer, "train_step", step)
    with pytest.raises(Interrupt):
        pretrain(settings)
    monkeypatch.setattr(Pretrainer, "train_step", real_step)


@pytest.mark.parametrize("nsp, static", [(True, False), (False, False), (True, True)],
                         ids=["nsp", "no-nsp", "nsp-static-masking"])
def test_interrupted_and_resumed_run_is_bitwise_identical(corpus_and_tokenizer, tmp_path, monkeypatch, nsp, static):
    extra = dict(static_masking=True, dupe_factor=2) if static else {}
    straight = tmp_path / "straight"
    pretrain(args(corpus_and_tokenizer, straight, nsp=nsp, **extra))

    broken = tmp_path / "broken"
    crash_after_seven(monkeypatch, args(corpus_and_tokenizer, broken, nsp=nsp, **extra))
    assert [s for s, _ in list_checkpoints(broken)] == [4]
    shards = sorted((broken / "static_shards").rglob("*"))
    stamps = [(p, p.stat().st_mtime_ns) for p in shards]
    pretrain(args(corpus_and_tokenizer, broken, nsp=nsp, resume=True, **extra))
    assert [(p, p.stat().st_mtime_ns) for p in shards] == stamps  # the resumed run reads the shards, never rewrites them
    if static:
        data = load_state(broken / "checkpoints" / "step-12", "data")
        assert set(data[0]) >= {"epoch", "shard_pos", "row_pos"}  # the shard reader's position, saved and restored

    a, b = weights(straight), weights(broken)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rows_a = (straight / "metrics.jsonl").read_text().splitlines()
    rows_b = (broken / "metrics.jsonl").read_text().splitlines()
    strip = lambda rows: [{k: v for k, v in json.loads(r).items() if k != "tokens_per_s"} for r in rows]  # noqa: E731
    assert strip(rows_a) == strip(rows_b)


def test_ctrl_c_leaves_a_model_and_curves_and_the_resumed_run_is_bitwise_the_straight_one(corpus_and_tokenizer,
                                                                                          tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    pretrain(args(corpus_and_tokenizer, straight))
    real_step = Pretrainer.train_step

    def ctrl_c_in_step_seven(self):
        result = real_step(self)
        if self.step == 7:
            os.kill(os.getpid(), signal.SIGINT)  # a terminal's Ctrl-C, mid-step
        return result

    stopped = tmp_path / "stopped"
    monkeypatch.setattr(Pretrainer, "train_step", ctrl_c_in_step_seven)
    with pytest.raises(Interrupted) as interrupted:
        pretrain(args(corpus_and_tokenizer, stopped))
    assert interrupted.value.step == 7 and interrupted.value.exit_status == 130
    assert [s for s, _ in list_checkpoints(stopped)] == [4, 7]  # the step-4 mark, then where the signal stopped it
    assert (stopped / "training_curves.png").stat().st_size > 1000
    model = BertForPreTraining.from_pretrained(stopped / "model")  # the model after 7 steps, usable
    seven = load_file(str(stopped / "checkpoints" / "step-7" / "model.safetensors"))
    assert seven.keys() <= model.state_dict().keys()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in seven.items())
    monkeypatch.setattr(Pretrainer, "train_step", real_step)
    pretrain(args(corpus_and_tokenizer, stopped, resume=True))
    a, b = weights(straight), weights(stopped)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_wall_time_checkpoint_exports_the_model_as_it_stands(corpus_and_tokenizer, tmp_path, caplog):
    caplog.set_level(logging.INFO, "bertforge")
    out = tmp_path / "run"
    pretrain(args(corpus_and_tokenizer, out, save_every_minutes=1e-6))  # a mark passed at every step
    snapshots = [line for line in caplog.text.splitlines() if "steps is in" in line]
    assert len(snapshots) == 11 and "the model after 1 of 12 steps is in" in snapshots[0], snapshots  # not at the end


def test_metrics_rows_after_a_resume_average_the_same_steps(corpus_and_tokenizer, tmp_path, monkeypatch):
    """log_every (5) off the checkpoint grid (4): the rows logged after a resume, from a crash or from a run
    extended past its max_steps, equal an uninterrupted run's (the partial window is checkpointed)."""
    settings = dict(nsp=False, log_every=5, decay="constant")  # a schedule that does not depend on max_steps
    strip = lambda out: {r["step"]: {k: v for k, v in r.items() if k != "tokens_per_s"}  # noqa: E731
                         for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    straight = tmp_path / "straight"
    pretrain(args(corpus_and_tokenizer, straight, **settings))
    expected = strip(straight)
    assert sorted(expected) == [5, 10, 12]

    crashed = tmp_path / "crashed"
    crash_after_seven(monkeypatch, args(corpus_and_tokenizer, crashed, **settings))
    pretrain(args(corpus_and_tokenizer, crashed, resume=True, **settings))  # from step 4, mid-window
    assert strip(crashed) == expected

    extended = tmp_path / "extended"
    pretrain(args(corpus_and_tokenizer, extended, max_steps=6, **settings))  # a last row at 6, off the grid
    pretrain(args(corpus_and_tokenizer, extended, resume=True, **settings))
    rows = strip(extended)
    assert sorted(rows) == [5, 6, 10, 12]
    assert {step: rows[step] for step in (5, 10, 12)} == expected


def static_rows(directory: Path) -> list[tuple[tuple, tuple, int]]:
    """Every row of a static shard directory as (unmasked sequence with token types, masked labels, NSP label)."""
    rows = []
    for info in json.loads((directory / "index.json").read_text())["shards"]:
        arrays = load_file(str(directory / info["file"]))
        for i in range(info["count"]):
            n = int(arrays["lengths"][i])
            ids, labels = arrays["input_ids"][i, :n].long(), arrays["labels"][i, :n].long()
            original = torch.where(labels != -100, labels, ids)
            types = arrays["token_type_ids"][i, :n].long()
            nsp = int(arrays["next_sentence_label"][i]) if "next_sentence_label" in arrays else -1
            rows.append(((tuple(original.tolist()), tuple(types.tolist()), nsp), tuple(labels.tolist())))
    return rows


def test_static_masking_masks_each_instance_dupe_factor_ways(corpus_and_tokenizer, tmp_path):
    from collections import Counter, defaultdict

    from bertforge.data import StaticShardReader

    out = tmp_path / "run"
    stale = out / "static_shards" / ".rank-00000-of-00001.tmp"  # the remains of a killed write: replaced
    stale.mkdir(parents=True)
    (stale / "shard-00000.safetensors").write_bytes(b"junk")
    settings = args(corpus_and_tokenizer, out, max_steps=6, static_masking=True, dupe_factor=3, resume=True)
    (out / "run_config.json").write_text(json.dumps(dataclasses.asdict(settings)))  # written before the killed write
    trainer = Pretrainer(settings)
    assert isinstance(trainer.stream, StaticShardReader)
    trainer.run()
    assert not stale.exists()
    directory = out / "static_shards" / "rank-00000-of-00001"
    index = json.loads((directory / "index.json").read_text())
    assert index["dupe_factor"] == 3 and index["nsp"] and index["max_seq_length"] == 32
    rows = static_rows(directory)
    assert len(rows) == index["total"] and index["total"] % 3 == 0
    masks = defaultdict(list)
    for instance, labels in rows:
        masks[instance].append(labels)
    # every instance is there dupe_factor times (a multiple, should the corpus repeat one), masked differently
    assert all(len(m) % 3 == 0 for m in masks.values())
    assert sum(len(m) for m in masks.values()) == len(rows) and len(masks) >= len(rows) // 3 - 2
    differently = sum(len(set(m)) == len(m) for m in masks.values())
    assert differently >= 0.9 * len(masks), (differently, len(masks))
    # static: reading the shards again gives back the very same masked rows (the masks recur, epoch after epoch)
    reader = StaticShardReader(directory, batch_size=64, seed=5, max_epochs=2)
    seen = Counter()
    for batch in reader:
        for ids, labels, n in zip(batch["input_ids"], batch["labels"], batch["attention_mask"].sum(1)):
            seen[tuple(torch.where(labels[:n] != -100, labels[:n], ids[:n]).tolist()), tuple(labels[:n].tolist())] += 1
    assert seen == Counter([(instance[0], labels) for instance, labels in rows] * 2)
    # a second, separately written run with the same settings writes the same shards
    again = tmp_path / "again"
    Pretrainer(args(corpus_and_tokenizer, again, max_steps=1, static_masking=True, dupe_factor=3))  # writes them
    assert static_rows(again / "static_shards" / "rank-00000-of-00001") == rows


def test_non_finite_loss_is_skipped_and_counted(corpus_and_tokenizer, tmp_path, monkeypatch):
    real = Pretrainer.forward_backward

    def poison_step_three(self, batch, scale):
        stats = real(self, batch, scale)
        if self.step == 2:  # the third step
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
            stats["loss"] = torch.tensor(float("nan"))
        return stats

    monkeypatch.setattr(Pretrainer, "forward_backward", poison_step_three)
    trainer = Pretrainer(args(corpus_and_tokenizer, tmp_path / "run", max_steps=5, save_every=5))
    trainer.run()
    assert trainer.skipped_steps == 1
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    state = trainer.optimizer.state_dict()["state"]
    assert all(torch.isfinite(t).all() for s in state.values() for t in s.values() if torch.is_tensor(t))


def test_corrupt_newest_checkpoint_falls_back_to_previous(corpus_and_tokenizer, tmp_path, caplog):
    out = tmp_path / "run"
    pretrain(args(corpus_and_tokenizer, out, max_steps=8))
    newest = out / "checkpoints" / "step-8" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:100])
    trainer = Pretrainer(args(corpus_and_tokenizer, out, max_steps=8, resume=True))
    trainer.resume()
    assert trainer.step == 4
    assert "step-8" in caplog.text and "unusable" in caplog.text


def test_refuses_an_output_dir_holding_another_run(corpus_and_tokenizer, tmp_path):
    out = tmp_path / "run"
    pretrain(args(corpus_and_tokenizer, out, max_steps=2))
    with pytest.raises(BertforgeError, match="--resume .* --overwrite"):
        pretrain(args(corpus_and_tokenizer, out, max_steps=2))
    pretrain(args(corpus_and_tokenizer, out, max_steps=2, overwrite=True))
    with pytest.raises(BertforgeError, match="differ.*max_length"):
        pretrain(args(corpus_and_tokenizer, out, max_steps=4, max_length=48, resume=True))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(max_length=100), "max_position_embeddings"),
        (dict(corpus=["/nonexistent/corpus.txt"]), "does not exist"),
        (dict(batch_size=0), "batch-size"),
        (dict(config="gigantic"), "neither a preset"),
    ],
)
def test_bad_settings_get_clear_errors(corpus_and_tokenizer, tmp_path, change, message):
    with pytest.raises(BertforgeError, match=message):
        pretrain(args(corpus_and_tokenizer, tmp_path / "run", **change))
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_misspelt_linear_backend_is_refused_before_anything_is_written(corpus_and_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("BERTFORGE_LINEAR", "onednnn")  # read by the run's setup_runtime
    with pytest.raises(BertforgeError, match="BERTFORGE_LINEAR must be one of .*'onednnn'"):
        pretrain(args(corpus_and_tokenizer, tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_tokenizer_without_mask_token_is_refused(corpus_and_tokenizer, tmp_path):
    _, tok, _ = corpus_and_tokenizer
    bad = tmp_path / "badtok"
    bad.mkdir()
    vocab = [t for t in (Path(tok) / "vocab.txt").read_text().splitlines() if t != "[MASK]"]
    (bad / "vocab.txt").write_text("\n".join(vocab) + "\n")
    with pytest.raises(BertforgeError, match=r"\[MASK\]"):
        pretrain(args(corpus_and_tokenizer, tmp_path / "run", tokenizer=str(bad)))


def test_single_document_corpus_with_nsp_is_refused(corpus_and_tokenizer, tmp_path):
    single = tmp_path / "one.txt"
    single.write_text("river stone light .\ngarden window morning .\nletter winter castle .\n")
    with pytest.raises(BertforgeError, match="(?i)document"):
        pretrain(args(corpus_and_tokenizer, tmp_path / "run", corpus=[str(single)]))


def torchrun_pretrain(corpus_and_tokenizer, out: Path, *extra: str, timeout: float = 240, init_from: Path | None = None):
    """`bertforge pretrain` under `torchrun --nproc-per-node 2` on CPU (gloo); fails the test on a non-zero exit or a
    hang (a collective that one rank alone enters never returns: the timeout turns that into a failure). The
    model is the tiny config with its tokenizer, or `init_from`'s."""
    import os
    import subprocess
    import sys

    corpus, tok, config = corpus_and_tokenizer
    model = ["--init-from", str(init_from)] if init_from else ["--tokenizer", str(tok), "--config", str(config)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "bertforge", "pretrain", "--corpus", str(corpus), *model,
           "--out", str(out), "--batch-size", "2", "--max-length", "32", "--no-progress", "--device", "cpu", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as err:
        tail = (err.stderr or b"")[-3000:]
        pytest.fail(f"torchrun {' '.join(extra)} hung for {timeout} s:\n{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}")
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def assert_loadable_model(model_dir: Path) -> None:
    """A full Hugging Face-layout checkpoint: every weight present, loads here (and in transformers when installed)."""
    from bertforge import BertForPreTraining

    model = BertForPreTraining.from_pretrained(model_dir)
    assert sum(p.numel() for p in model.parameters()) > 0
    assert all(torch.isfinite(p).all() for p in model.parameters())
    try:
        import transformers
    except ImportError:
        return
    _, info = transformers.BertForPreTraining.from_pretrained(model_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


@pytest.mark.parametrize("nsp, static", [(True, False), pytest.param(False, False, marks=pytest.mark.slow), (True, True)],
                         ids=["nsp", "no-nsp", "nsp-static-masking"])
def test_torchrun_two_cpu_processes_train_on_different_data(corpus_and_tokenizer, tmp_path, nsp, static):
    """DDP over gloo: both ranks step together, rank 0 writes, and each rank's data position is its own (with
    --static-masking each rank writes and reads the shards of its own share of the documents)."""
    out = tmp_path / "ddp"
    torchrun_pretrain(corpus_and_tokenizer, out, "--max-steps", "4", "--save-every", "4", *([] if nsp else ["--no-nsp"]),
                      *(["--static-masking", "--dupe-factor", "2"] if static else []))
    if static:
        ranks = sorted(d.name for d in (out / "static_shards").iterdir())
        assert ranks == ["rank-00000-of-00002", "rank-00001-of-00002"]
        assert static_rows(out / "static_shards" / ranks[0]) != static_rows(out / "static_shards" / ranks[1])
    (step, ckpt), = list_checkpoints(out)
    assert step == 4
    data = load_state(ckpt, "data")
    # each rank's own position; with static masking, the position in its own shards (the rows differ, above), which
    # may be the same numbers on both ranks
    assert len(data) == 2 and (static or data[0] != data[1])
    assert_loadable_model(out / "model")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len({r["step"] for r in rows}) == len(rows)  # rank 0 alone logs


def test_torchrun_fsdp_trains_resumes_and_exports(corpus_and_tokenizer, tmp_path):
    """FSDP2 over gloo with the CLI's demo predictions on: every rank must enter the same collectives (rank 0 alone
    running a forward or gathering the state dict hung forever). Then a resume from a checkpoint written under FSDP
    ends bitwise where the uninterrupted run did, and OUT/model is a full Hugging Face checkpoint."""
    import shutil

    common = ["--fsdp", "--save-every", "2", "--keep-checkpoints", "3", "--log-every", "2", "--lr", "1e-2",
              "--warmup-steps", "1", "--decay", "constant"]
    straight = tmp_path / "straight"
    torchrun_pretrain(corpus_and_tokenizer, straight, "--max-steps", "6", *common)
    assert [s for s, _ in list_checkpoints(straight)] == [2, 4, 6]
    assert_loadable_model(straight / "model")
    final = weights(straight)
    ckpt = load_file(str(straight / "checkpoints" / "step-6" / "model.safetensors"))
    assert final.keys() == ckpt.keys() and all(torch.equal(final[k], ckpt[k]) for k in final)
    assert not torch.equal(final["cls.predictions.bias"], torch.zeros_like(final["cls.predictions.bias"]))  # trained

    # the same run killed after its step-4 checkpoint: resume it and finish
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-6")
    shutil.rmtree(resumed / "model")
    done = torchrun_pretrain(corpus_and_tokenizer, resumed, "--max-steps", "6", "--resume", *common)
    assert "resumed from" in done.stdout + done.stderr
    again = weights(resumed)
    assert again.keys() == final.keys()
    for k in final:
        assert torch.equal(again[k], final[k]), k
    rows = lambda out: [{k: v for k, v in json.loads(r).items() if k != "tokens_per_s"}  # noqa: E731
                        for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows(resumed) == rows(straight)


def word_masking_counts(trainer: Pretrainer, tokens: list[str], batches: int) -> tuple[int, int, int]:
    """(words with some piece labelled, of them words only partly labelled, multi-piece words seen) over
    `batches` batches of the trainer's own stream. A word is a piece not starting with "##" and the "##" pieces
    after it; [CLS], [SEP] and padding stand alone."""
    labelled_words = partly = multi_piece = 0
    for _ in range(batches):
        batch = next(trainer.stream)
        for ids, labels, n in zip(batch["input_ids"], batch["labels"], batch["attention_mask"].sum(1).tolist()):
            chosen = (labels[:n] != -100).tolist()
            original = torch.where(labels[:n] != -100, labels[:n], ids[:n]).tolist()
            words: list[list[int]] = []
            for pos, token_id in enumerate(original):
                piece = tokens[token_id]
                if piece.startswith("##") and words and not tokens[original[pos - 1]].startswith("["):
                    words[-1].append(pos)
                else:
                    words.append([pos])
            for word in words:
                multi_piece += len(word) > 1
                flags = {chosen[p] for p in word}
                if True in flags:
                    labelled_words += 1
                    partly += len(flags) == 2
    return labelled_words, partly, multi_piece


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_whole_word_masking_through_pretraining_labels_every_piece_of_a_word(corpus_and_tokenizer, tmp_path, static):
    """--whole-word-mask: the trainer's stream (its "##" continuation map built from the tokenizer's vocabulary)
    labels all pieces of a word or none; without it, the same data has words labelled in part."""
    from bertforge.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(corpus_and_tokenizer[1])
    tokens = tok.convert_ids_to_tokens(list(range(tok.vocab_size)))
    assert sum(t.startswith("##") for t in tokens) >= 20  # a WordPiece vocabulary with continuation pieces
    settings = dict(batch_size=16, nsp=False, static_masking=static, dupe_factor=2)
    whole = Pretrainer(args(corpus_and_tokenizer, tmp_path / "wwm", whole_word_mask=True, **settings))
    labelled, partly, multi_piece = word_masking_counts(whole, tokens, 10)
    assert multi_piece > 500 and labelled > 300, (multi_piece, labelled)  # measured 894-905 and 572-583
    assert partly == 0
    pieces = Pretrainer(args(corpus_and_tokenizer, tmp_path / "pieces", whole_word_mask=False, **settings))
    labelled, partly, multi_piece = word_masking_counts(pieces, tokens, 10)
    assert partly > 100, (partly, labelled)  # measured 336 (dynamic) and 352 (static) of 680-701


def test_pretraining_clips_gradients_at_norm_1_as_bert_did(corpus_and_tokenizer, tmp_path):
    """The threshold is BERT's (google-research/bert optimization.py: clip_by_global_norm 1.0); a mutation changing
    it failed no default test. The default and what the run's step uses are read here; fine-tuning's too."""
    from bertforge.finetune import trainer as finetune_trainer

    assert PretrainArgs.__dataclass_fields__["max_grad_norm"].default == 1.0
    run = Pretrainer(args(corpus_and_tokenizer, tmp_path / "run"))
    try:
        assert run.stepper.max_grad_norm == 1.0
    finally:
        run.close()
    assert finetune_trainer.MAX_GRAD_NORM == 1.0
