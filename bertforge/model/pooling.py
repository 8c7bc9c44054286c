"""Sentence embeddings from an encoder's last hidden states, and the sentence-transformers files that describe them.

One place for what the embed pipeline (inference) and the embeddings trainer share: mean or [CLS] pooling of the
packed rows, and the sentence-transformers model directory: read (`sentence_transformers_settings`: which pooling,
normalised or not, the longest input) and written (`write_sentence_transformers_files`: `modules.json`,
`sentence_bert_config.json`, `1_Pooling/config.json`, `2_Normalize/`), so that a directory bertforge trains is one
sentence-transformers loads, and the reverse.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.io import atomic_write_text

POOLINGS = ("mean", "cls")
TRANSFORMER_MODULE = "sentence_transformers.models.Transformer"
POOLING_MODULE = "sentence_transformers.models.Pooling"
NORMALIZE_MODULE = "sentence_transformers.models.Normalize"


def mean_pool(hidden: Tensor, lengths: list[int]) -> Tensor:
    """Mean of each sequence's rows of a packed [T, H] matrix (sequences end to end) → [B, H].

    One segment sum (`index_add` of every row into its sequence's row) instead of a mean per length group and a
    `cat`: one pass over [T, H] whatever the number of distinct lengths. Differentiable (the trainer uses it).
    """
    counts = torch.tensor(lengths, device=hidden.device)  # [B]
    segment = torch.repeat_interleave(torch.arange(len(lengths), device=hidden.device), counts)  # [T]: each row's sequence
    sums = hidden.new_zeros(len(lengths), hidden.shape[-1]).index_add(0, segment, hidden)  # [B, H]
    return sums / counts.unsqueeze(1).to(hidden.dtype)


def pool(hidden: Tensor, lengths: list[int], starts: list[int], pooling: str, normalize: bool = False) -> Tensor:
    """Sentence embeddings [B, H] of packed rows [T, H]: "mean" of each sequence's rows ([CLS] and [SEP] included,
    as sentence-transformers does) or its first ("cls") row; scaled to unit length with `normalize`."""
    if pooling == "cls":
        pooled = hidden[starts]  # [B, H]
    elif pooling == "mean":
        pooled = mean_pool(hidden, lengths)  # [B, H]
    else:
        raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    return F.normalize(pooled, dim=-1) if normalize else pooled


def sentence_transformers_settings(path: Path | None) -> dict[str, Any]:
    """Pooling, normalisation and maximum length a sentence-transformers model directory declares, if any.

    Reads `modules.json` (is there a Normalize module?), the Pooling module's `config.json` and
    `sentence_bert_config.json` (max_seq_length). Unreadable files are ignored: they are only defaults.
    """
    if path is None:
        return {}

    def read(file: Path) -> Any:
        try:
            return json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None

    settings: dict[str, Any] = {}
    modules = read(path / "modules.json")
    if isinstance(modules, list):
        types = [m.get("type", "") for m in modules if isinstance(m, dict)]
        settings["normalize"] = any(t.endswith(".Normalize") for t in types)
        for m in modules:
            if isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling"):
                pooling = read(path / str(m.get("path", "")) / "config.json")
                if isinstance(pooling, dict):
                    if pooling.get("pooling_mode_cls_token"):
                        settings["pooling"] = "cls"
                    elif pooling.get("pooling_mode_mean_tokens"):
                        settings["pooling"] = "mean"
    st_config = read(path / "sentence_bert_config.json")
    if isinstance(st_config, dict) and isinstance(st_config.get("max_seq_length"), int):
        settings["max_length"] = st_config["max_seq_length"]
    return settings


def write_sentence_transformers_files(path: Path, hidden_size: int, pooling: str, normalize: bool, max_length: int,
                                      versions: dict[str, str] | None = None) -> None:
    """The files that make a directory holding config.json, the weights and the tokenizer a sentence-transformers
    model: Transformer (the directory itself) → Pooling (`pooling`) → Normalize (when `normalize`)."""
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    modules = [{"idx": 0, "name": "0", "path": "", "type": TRANSFORMER_MODULE},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": POOLING_MODULE}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": NORMALIZE_MODULE})
        (path / "2_Normalize").mkdir(exist_ok=True)  # Normalize has no settings: an empty directory
    pooling_config = {
        "word_embedding_dimension": hidden_size,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
    }
    (path / "1_Pooling").mkdir(exist_ok=True)
    atomic_write_text(path / "1_Pooling" / "config.json", json.dumps(pooling_config, indent=2) + "\n")
    atomic_write_text(path / "sentence_bert_config.json",
                      json.dumps({"max_seq_length": max_length, "do_lower_case": False}, indent=2) + "\n")
    st_config = {"__version__": versions or {}, "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"}
    atomic_write_text(path / "config_sentence_transformers.json", json.dumps(st_config, indent=2) + "\n")
    atomic_write_text(path / "modules.json", json.dumps(modules, indent=2) + "\n")
