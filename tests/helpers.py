"""Helpers shared by the tests of every directory: `from tests.helpers import ...`.

Tiny vocabularies and tokenizer files, a tiny corpus, and the 2-layer, 32-wide BERT config most tests use.
Fixtures built from them are in `tests/conftest.py`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

#: The five BERT special tokens in their usual order (ids 0-4 in a vocabulary that starts with them).
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

#: The words of `make_corpus`.
WORDS = ("river stone light garden window morning letter winter castle forest ship market song "
         "quiet bright heavy ancient golden silver gentle walked opened carried watched found gave").split()

#: A 2-layer BERT 32 wide, with a 120-token vocabulary (the size `make_run_inputs` trains).
TINY_CONFIG = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                   max_position_embeddings=64)


def write_vocab(directory: Path, tokens: list[str]) -> Path:
    """`directory`/vocab.txt holding `tokens`, one a line (the directory is made if need be)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return directory


def write_uncased_tokenizer(directory: Path, tokens: list[str]) -> Path:
    """A WordPiece tokenizer in `directory`: vocab.txt and a tokenizer_config.json that lowercases."""
    write_vocab(directory, tokens)
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}), encoding="utf-8")
    return directory


def tiny_config(**overrides):
    """`TINY_CONFIG` as a `BertConfig`, with `overrides`."""
    from bertforge import BertConfig

    return BertConfig(**{**TINY_CONFIG, **overrides})


def make_corpus(path: Path, docs: int = 40, seed: int = 0, words: list[str] = WORDS) -> Path:
    """Documents of random `words`, one sentence a line, a blank line between documents."""
    rng = random.Random(seed)
    lines = []
    for _ in range(docs):
        for _ in range(rng.randint(3, 8)):
            lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) + " .")
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def make_run_inputs(root: Path, words: list[str] = WORDS) -> tuple[Path, Path, Path]:
    """(corpus.txt, tokenizer dir, config.json) for a tiny pretraining run: a corpus of `words`, a vocabulary of
    TINY_CONFIG's size trained on it, and TINY_CONFIG."""
    from bertforge.tokenizer import Tokenizer

    root.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(root / "corpus.txt", words=words)
    tok = Tokenizer.train([str(corpus)], vocab_size=TINY_CONFIG["vocab_size"], show_progress=False)
    tok.save_pretrained(root / "tok")
    config = root / "config.json"
    config.write_text(json.dumps(TINY_CONFIG))
    return corpus, root / "tok", config


def tiny_run_args(inputs: tuple[Path, Path, Path], out: Path, **settings):
    """`PretrainArgs` of a short run on `inputs` (`make_run_inputs`' corpus, tokenizer and config) into `out`:
    batches of 4 rows of 32 tokens, no progress bar, no demo; `settings` add to or replace these."""
    from bertforge.pretrain.args import PretrainArgs

    corpus, tok, config = inputs
    base = dict(corpus=[str(corpus)], tokenizer=str(tok), config=str(config), out=str(out), batch_size=4, max_length=32,
                progress=False, demo=False)
    return PretrainArgs(**{**base, **settings})


def count_graphs(monkeypatch, backend: str | None) -> list:
    """torch.compile with a backend that counts the graphs it gets, then hands them to `backend` (None: inductor)."""
    import torch

    real, graphs = torch.compile, []

    def counting(gm, example_inputs):
        graphs.append(gm)
        if backend is None:
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs)
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(backend)(gm, example_inputs)

    monkeypatch.setattr(torch, "compile", lambda model, **kw: real(model, backend=counting))
    torch._dynamo.reset()
    return graphs


class Stop(Exception):
    """Stands for a kill: raised right after a given optimizer step (`stopped_after`)."""


def stopped_after(monkeypatch, step: int, call) -> None:
    """`call()`, stopped (as if killed) right after optimizer step `step` of the one training step."""
    import pytest

    from bertforge.training.step import TrainStep

    real = TrainStep.run

    def run_then_stop(self, *a, **kw):
        outcome = real(self, *a, **kw)
        if self.step == step:
            raise Stop(step)
        return outcome

    with monkeypatch.context() as patch:
        patch.setattr(TrainStep, "run", run_then_stop)
        with pytest.raises(Stop):
            call()


def metrics_rows(out: Path) -> list[dict]:
    """OUT/metrics.jsonl's rows."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def same_run(a: Path, b: Path, weights: str = "model/model.safetensors") -> None:
    """Two trainer runs ended the same: bitwise the same weights (`weights` in each OUT), the same metrics rows and
    evaluation record (eval.json, the wall time aside)."""
    import torch
    from safetensors.torch import load_file

    wa, wb = (load_file(str(d / weights)) for d in (a, b))
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k].view(torch.uint8), wb[k].view(torch.uint8)) for k in wa), "weights differ"
    assert metrics_rows(a) == metrics_rows(b)
    ea, eb = (json.loads((d / "eval.json").read_text()) for d in (a, b))
    ea.pop("train_seconds"), eb.pop("train_seconds")
    assert ea == eb


def import_dotted(dotted: str) -> object:
    """The object `a.b.c` names: the longest prefix that imports as a module, then attributes; LookupError if none
    does (what the documentation tests check every name of the pages and ARCHITECTURE.md with)."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            raise LookupError(dotted) from None
        return obj
    raise LookupError(dotted)


# ------------------------------------------------------------------ processes a test run starts
# torchrun's workers outlive torchrun killed by a timeout or an interrupted run (they are its children, not the
# test's): the test process is made their reaper, so that they stay its descendants, and every descendant still
# running when the session ends (also on Ctrl-C, or SIGTERM, turned into an interrupt) is ended by its pid.
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux; elsewhere nothing, False)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """The pids of every process below `pid` (from /proc: the parent of each), children first."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parent = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def end_descendants(grace: float = 3.0) -> list[int]:
    """SIGTERM every descendant of this process, SIGKILL those left after `grace` seconds, reap them; returns the
    pids that were running."""
    import os
    import signal
    import time

    if not Path("/proc").is_dir():
        return []
    running = descendants(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in running:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(
                Path(f"/proc/{p}").exists() and _alive(p) for p in running):
            _reap()
            time.sleep(0.05)
    _reap()
    return running


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # a zombie has ended


def _reap() -> None:
    import os

    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
