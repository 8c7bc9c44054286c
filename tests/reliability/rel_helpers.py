"""Shared pieces of the reliability tests: a tiny corpus, tokenizer, config and model, and a one-thread guard.

The tests run on small shared CPU machines: every subprocess gets OMP_NUM_THREADS=1 (two busy cores and an
oversubscribed OpenMP pool make a 20-step run take 20 s instead of 2 s), and in-process training uses one thread
through `one_torch_thread()`, which restores the previous setting.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

# The tiny corpus, tokenizer and config are shared with the other test directories; named here as before.
from tests.helpers import TINY_CONFIG, WORDS, make_corpus, make_run_inputs  # noqa: F401


def make_model_dir(root: Path, tokenizer_dir: Path | None = None, seed: int = 0) -> Path:
    """A tiny BertForPreTraining in Hugging Face layout (config.json + model.safetensors [+ tokenizer files])."""
    from bertforge import BertConfig, BertForPreTraining
    from bertforge.tokenizer import Tokenizer

    torch.manual_seed(seed)
    model = BertForPreTraining(BertConfig(**TINY_CONFIG))
    model.save_pretrained(root)
    if tokenizer_dir is not None:
        Tokenizer.from_pretrained(tokenizer_dir).save_pretrained(root)
    return root


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.pop("PYTHONWARNINGS", None)
    return env


def bertforge_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertforge", *args]


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def tensors_differ(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names whose tensors differ in any bit (NaN payloads and the sign of zero included), or are on one side only."""
    differ = sorted(set(a) ^ set(b))
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(_bits(x), _bits(y)):
            differ.append(key)
    return differ


def stray_temporaries(root: Path) -> list[Path]:
    """Temporary files and directories the atomic writers leave only when something went wrong."""
    return sorted(p for p in root.rglob(".*") if p.name.endswith(".tmp") or ".old-" in p.name)


FIGURES: list[str] = []  # repeated in the terminal summary by conftest.py


def report(line: str) -> None:
    """Print a figure now (seen with -s) and keep it for the end-of-session summary (seen without)."""
    print(line)
    FIGURES.append(line)
