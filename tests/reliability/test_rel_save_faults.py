"""Fault injection at save time (issue 46): each writer — a training checkpoint, a model (`save_pretrained`), a
tokenizer, the metrics log, an output file of `embed` — writes version after version of its target in a forked
process that is SIGKILLed at a random moment; separately, each faces a full disk at a random byte (RLIMIT_FSIZE:
the kernel refuses the write, so safetensors' own Rust writer sees it too). Afterwards the target holds one
complete version, all of its files from the same one (or, after a full disk, the version before, and one line
saying why); a run's checkpoints all load, and the newest is what a resume takes.

The writers are forked from this process (torch already imported, one thread), so a kill costs milliseconds and the
default suite can afford a few dozen; `-m slow` makes 250 kills (50 per writer).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import BertConfig, BertForPreTraining, BertforgeError
from bertforge.core.io import atomic_write
from bertforge.core.system import Runtime
from bertforge.tokenizer import Tokenizer
from bertforge.training.checkpoint import TrainingCheckpoints
from bertforge.training.log import MetricsLog
from bertforge.training.optim import warmup_decay
from bertforge.training.run_dir import list_checkpoints
from bertforge.training.step import TrainStep
from tests.helpers import TINY_CONFIG, WORDS
from tests.reliability.rel_helpers import one_torch_thread, report, stray_temporaries

resource = pytest.importorskip("resource")
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the writers are forked")


# ---------------------------------------------------------------------------------------------- the writers
# Each writer: `write(root, v)` writes version v of its target under root; `check(root)` returns the complete
# version the target holds (0: none yet) and raises AssertionError on anything half-written or mixed.


class ModelWriter:
    name = "model (save_pretrained)"

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = BertForPreTraining(BertConfig(**TINY_CONFIG))

    def write(self, root: Path, v: int) -> None:
        with torch.no_grad():
            for p in self.model.parameters():
                p.fill_(v / 1000)
        self.model.config.extra["fault_version"] = v
        self.model.save_pretrained(root / "model")

    def check(self, root: Path) -> int:
        if not (root / "model" / "config.json").exists():
            return 0
        loaded = BertForPreTraining.from_pretrained(root / "model")  # first: a reader finishes a killed save
        version = json.loads((root / "model" / "config.json").read_text())["fault_version"]
        assert not loaded.loading_info.missing_keys, loaded.loading_info
        assert all(torch.all(p == version / 1000) for p in loaded.parameters()), "weights of another version"
        return version


class TokenizerWriter:
    name = "tokenizer (save_pretrained)"

    def __init__(self) -> None:
        half = len(WORDS) // 2  # two vocabularies of other words, taking turns
        self.tokenizers = [Tokenizer.train(iter([" ".join(words)] * 3), vocab_size=200, min_frequency=1,
                                           show_progress=False) for words in (WORDS[:half], WORDS[half:])]
        assert self.tokenizers[0].get_vocab() != self.tokenizers[1].get_vocab()

    def write(self, root: Path, v: int) -> None:
        tok = self.tokenizers[v % 2]
        tok.model_max_length = 1000 + v
        tok.save_pretrained(root / "tokenizer")

    def check(self, root: Path) -> int:
        if not (root / "tokenizer" / "tokenizer_config.json").exists():
            return 0
        loaded = Tokenizer.from_pretrained(root / "tokenizer")  # first: a reader finishes a killed save
        version = json.loads((root / "tokenizer" / "tokenizer_config.json").read_text())["model_max_length"] - 1000
        want = self.tokenizers[version % 2]
        assert loaded.get_vocab() == want.get_vocab(), "tokenizer.json of another version"
        vocab_txt = (root / "tokenizer" / "vocab.txt").read_text(encoding="utf-8").splitlines()
        assert len(vocab_txt) == want.vocab_size, "vocab.txt of another version"
        return version


class CheckpointWriter:
    name = "training checkpoint"

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 3)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.1)
        self.model(torch.ones(1, 4)).sum().backward()
        self.optimizer.step()  # an optimizer with state
        self.stepper = TrainStep(self.model, self.optimizer, warmup_decay(self.optimizer, 0, 10**6, "constant"),
                                 device=torch.device("cpu"))
        self.rt = Runtime(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))

    def write(self, root: Path, v: int) -> None:
        with torch.no_grad():
            for p in self.model.parameters():
                p.fill_(v)
        self.stepper.step = v
        TrainingCheckpoints(root, self.rt, self.stepper, keep=2).save({"position": v}, {"version": v})

    def check(self, root: Path) -> int:
        found = list_checkpoints(root)
        if not found:
            return 0
        reader = TrainingCheckpoints(root, self.rt, self.stepper, keep=2)
        for step, path in found:  # every checkpoint listed loads whole, as a resume would read it
            loaded = reader.read(path, lambda loaded: None)
            assert loaded.trainer["version"] == step and loaded.data == {"position": step}, path
            assert all(torch.all(t == step) for t in loaded.weights.values()), f"{path}: weights of another step"
        newest = found[-1][0]
        resumed = reader.resume(lambda loaded: None)
        assert resumed is not None and resumed.step == newest
        return newest


class MetricsWriter:
    name = "metrics log (metrics.jsonl)"

    def write(self, root: Path, v: int) -> None:
        log = MetricsLog(root / "metrics.jsonl")
        log.write({"step": v, "loss": 1.0 / v, "padding": "x" * 2000})
        log.close()

    def check(self, root: Path) -> int:
        path = root / "metrics.jsonl"
        if not path.exists():
            return 0
        MetricsLog(path, resume_step=10**9).close()  # what a resume does: rows that do not parse are dropped
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)), "rows lost or repeated"
        return len(rows)


class EmbedOutputWriter:
    name = "embed's output (.npy)"

    def write(self, root: Path, v: int) -> None:  # as `bertforge embed` writes its output (commands/embed.py)
        vectors = np.full((64, 384), v, dtype=np.float32)

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as fh:
                np.save(fh, vectors)

        atomic_write(root / "vectors.npy", write)

    def check(self, root: Path) -> int:
        path = root / "vectors.npy"
        if not path.exists():
            return 0
        vectors = np.load(path)
        assert vectors.shape == (64, 384) and np.all(vectors == vectors[0, 0]), "a vector file of mixed versions"
        return int(vectors[0, 0])


WRITERS = [ModelWriter, TokenizerWriter, CheckpointWriter, MetricsWriter, EmbedOutputWriter]


# ---------------------------------------------------------------------------------------------- the faults


def killed_writer(writer, root: Path, first: int, delay: float) -> None:
    """Fork a child that writes versions first, first + 1, ... of the target until SIGKILLed after `delay` s."""
    pid = os.fork()
    if pid == 0:  # the child: writes until killed
        try:
            v = first
            while True:
                writer.write(root, v)
                v += 1
        finally:
            os._exit(1)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def full_disk_writer(writer, root: Path, v: int, limit: int) -> str | None:
    """Fork a child writing version v with files limited to `limit` bytes: the one-line error it raised, if any."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        message = ""
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
            writer.write(root, v)
        except BertforgeError as err:
            message = str(err)
        except OSError as err:  # a library call's own error; every command reports it in one line (test_rel_runs)
            message = f"OSError: {err}"
        except BaseException as err:  # anything else is a finding
            message = f"NOT ONE LINE: {type(err).__name__}: {err}"
        finally:
            os.write(write, message.encode()[:4000])
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        message = fh.read().decode()
    os.waitpid(pid, 0)
    return message or None


def campaign(tmp_path: Path, kills: int, disk_fulls: int, seed: int) -> None:
    rng = random.Random(seed)
    with one_torch_thread():
        for make in WRITERS:
            writer = make()
            root = tmp_path / make.__name__
            root.mkdir()
            start = time.perf_counter()
            writer.write(root, 1)
            one_write = time.perf_counter() - start
            last, advanced, stray = 1, 0, set()
            assert writer.check(root) == 1
            largest = max(p.stat().st_size for p in root.rglob("*") if p.is_file())  # a limit below it fails a write
            for _ in range(kills):  # SIGKILL at a random moment of a stream of writes
                killed_writer(writer, root, last + 1, rng.uniform(0, 3 * one_write))
                now = writer.check(root)
                assert now >= last, f"{writer.name}: version {now} after {last}: an older state came back"
                advanced += now > last
                stray.update(stray_temporaries(root))
                last = now
            left = stray_temporaries(root)  # what the last kills left: the next complete write removes it
            writer.write(root, last + 1)
            last += 1
            assert writer.check(root) == last
            assert not stray_temporaries(root), f"{writer.name}: {left} left, {stray_temporaries(root)} after a write"
            messages = []
            for _ in range(disk_fulls):  # a full disk at a random byte of one write
                message = full_disk_writer(writer, root, last + 1, rng.randrange(0, largest))
                now = writer.check(root)
                assert now in (last, last + 1), f"{writer.name}: version {now} after a failed write of {last + 1}"
                if now == last:  # refused: in one line, and nothing but the previous version is there
                    assert message is not None and "\n" not in message and "NOT ONE LINE" not in message, message
                    assert not stray_temporaries(root), stray_temporaries(root)
                    messages.append(message)
                last = now
            report(f"save faults, {writer.name}: {kills} SIGKILLs ({advanced} after a newer version was complete, "
                   f"{kills - advanced} before), 0 half-written or mixed, {len(stray)} temporary files left by kills "
                   f"(hidden, never loaded), {len(left)} there after the last kill, none after the next write; "
                   f"{disk_fulls} full disks: {len(messages)} refused in one line with the previous version intact, "
                   f"{disk_fulls - len(messages)} fitted")


def test_save_faults_fast(tmp_path):
    campaign(tmp_path, kills=8, disk_fulls=4, seed=0)


@pytest.mark.slow
def test_save_faults_250_kills(tmp_path):
    campaign(tmp_path, kills=50, disk_fulls=20, seed=1)
