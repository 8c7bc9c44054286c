"""Helpers of the pipeline tests: sample texts, and tiny random transformers checkpoints with a task head."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

SENTENCES = [
    "The European lobster is a species of clawed lobster from the eastern Atlantic Ocean.",
    "Hi!",
    "",
    "BERT reads both directions at once, which is why it is bidirectional.",
    "Ünïcödé, emoji 🙂 and 中文 too",
    "short",
    "Short",
    "a b c d e f g",
]
LONG = "the lobster walked along the sea floor " * 60  # 420 tokens: beyond MiniLM's 256


def make_head_dir(root: Path, cls_name: str, tokenizer_dir: Path, **config) -> Path:
    """A tiny random transformers model with a head, saved next to a real tokenizer."""
    transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[test]'")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=512, **config)
    model = getattr(transformers, cls_name)(cfg).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith(("classifier.", "qa_outputs.")) and name.endswith("weight"):
                param.normal_(0.0, 0.5)  # varied, confident predictions rather than near-uniform ones
    out = root / cls_name
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out
