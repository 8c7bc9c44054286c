"""Sentence embeddings from an encoder's last hidden states, and the sentence-transformers files that describe them.

One place for what the embed pipelines (inference) and the embeddings trainer share: mean or [CLS] pooling of the
packed rows, SPLADE's pooling of the MLM logits (`splade_pool`), and the sentence-transformers model directory: read
(`sentence_transformers_settings`: which pooling, normalised or not, the longest input, the prompts, a SparseEncoder)
and written (`write_sentence_transformers_files`: `modules.json`, `sentence_bert_config.json`,
`1_Pooling/config.json`, `2_Normalize/`; `write_sparse_encoder_files`: `modules.json` with MLMTransformer and
`1_SpladePooling/`), so that a directory bertforge trains is one sentence-transformers loads, and the reverse.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..core.constants import POOLINGS, ST_POOLING_MODES
from ..core.errors import BertforgeError
from ..core.io import atomic_write_text

_LEGACY_FLAGS = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens", "mean": "pooling_mode_mean_tokens",
                 "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
                 "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}
TRANSFORMER_MODULE = "sentence_transformers.models.Transformer"
POOLING_MODULE = "sentence_transformers.models.Pooling"
NORMALIZE_MODULE = "sentence_transformers.models.Normalize"
# sentence-transformers 5's names of a SparseEncoder's modules (6.x reads them too, as its legacy aliases)
MLM_TRANSFORMER_MODULE = "sentence_transformers.sparse_encoder.models.MLMTransformer"
SPLADE_POOLING_MODULE = "sentence_transformers.sparse_encoder.models.SpladePooling"
SPLADE_POOLING_DIR = "1_SpladePooling"
#: Tokens whose [·, V] logits are alive at a time in `splade_pool` (float32: 122 MB a thousand tokens of a 30,522 vocabulary)
SPLADE_CHUNK_TOKENS = 2048


def _segments(hidden: Tensor, lengths: list[int]) -> Tensor:
    """Each row's sequence number [T] for packed rows (sequences end to end)."""
    counts = torch.tensor(lengths, device=hidden.device)
    return torch.repeat_interleave(torch.arange(len(lengths), device=hidden.device), counts)


def mean_pool(hidden: Tensor, lengths: list[int], weights: Tensor | None = None, segment: Tensor | None = None) -> Tensor:
    """Mean of each sequence's rows of a packed [T, H] matrix (sequences end to end) → [B, H]; with `weights` [T],
    the weighted mean (`segment`: each row's sequence number, when the caller has it already).

    One segment sum (`index_add` of every row into its sequence's row) instead of a mean per length group and a
    `cat`: one pass over [T, H] whatever the number of distinct lengths. Differentiable (the trainer uses it).
    """
    segment = _segments(hidden, lengths) if segment is None else segment  # [T]: each row's sequence
    rows = hidden if weights is None else hidden * weights.unsqueeze(1).to(hidden.dtype)
    sums = hidden.new_zeros(len(lengths), hidden.shape[-1]).index_add(0, segment, rows)  # [B, H]
    if weights is None:
        return sums / torch.tensor(lengths, device=hidden.device).unsqueeze(1).to(hidden.dtype)
    totals = weights.new_zeros(len(lengths)).index_add(0, segment, weights)  # [B]
    return sums / totals.unsqueeze(1).to(hidden.dtype)


def _first(hidden: Tensor, lengths: list[int], starts: list[int]) -> Tensor:
    return hidden[starts]  # [B, H]


def _last(hidden: Tensor, lengths: list[int], starts: list[int]) -> Tensor:
    return hidden[[s + n - 1 for s, n in zip(starts, lengths)]]  # [B, H]


def _mean(hidden: Tensor, lengths: list[int], starts: list[int]) -> Tensor:
    return mean_pool(hidden, lengths)  # [B, H]


def _mean_sqrt_len(hidden: Tensor, lengths: list[int], starts: list[int]) -> Tensor:
    """sum / √n = mean · √n"""
    root = torch.tensor(lengths, device=hidden.device, dtype=hidden.dtype).sqrt().unsqueeze(1)
    return mean_pool(hidden, lengths) * root


def _weighted_mean(hidden: Tensor, lengths: list[int], starts: list[int]) -> Tensor:
    segment = _segments(hidden, lengths)
    first = torch.tensor(starts, device=hidden.device)[segment]  # [T]: each row's sequence start
    weights = (torch.arange(hidden.shape[0], device=hidden.device) - first + 1).to(torch.float32)
    return mean_pool(hidden, lengths, weights, segment)


def _max(hidden: Tensor, lengths: list[int], starts: list[int]) -> Tensor:
    index = _segments(hidden, lengths).unsqueeze(1).expand_as(hidden)
    return hidden.new_zeros(len(lengths), hidden.shape[-1]).scatter_reduce(0, index, hidden, reduce="amax",
                                                                          include_self=False)


#: Each pooling by its name: (packed rows [T, H], lengths, starts) → [B, H].
POOLERS: dict[str, Callable[[Tensor, list[int], list[int]], Tensor]] = {
    "mean": _mean, "cls": _first, "max": _max, "mean-sqrt-len": _mean_sqrt_len, "weighted-mean": _weighted_mean,
    "last-token": _last}


def pool(hidden: Tensor, lengths: list[int], starts: list[int], pooling: str, normalize: bool = False) -> Tensor:
    """Sentence embeddings [B, H] of packed rows [T, H], as sentence-transformers' Pooling computes them ([CLS] and
    [SEP] included): "mean" of each sequence's rows, its first ("cls") or last ("last-token") row, the elementwise
    "max", the sum over √length ("mean-sqrt-len"), or the mean weighted by position 1, 2, ... ("weighted-mean");
    scaled to unit length with `normalize`."""
    if pooling not in POOLERS:
        raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    pooled = POOLERS[pooling](hidden, lengths, starts)
    return F.normalize(pooled, dim=-1) if normalize else pooled


#: A sentence-transformers Dense module's `activation_function` → the function (its default is Tanh).
DENSE_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "torch.nn.modules.linear.Identity": lambda x: x, "torch.nn.modules.activation.Tanh": torch.tanh,
    "torch.nn.modules.activation.ReLU": torch.relu, "torch.nn.modules.activation.GELU": F.gelu,
    "torch.nn.modules.activation.Sigmoid": torch.sigmoid,
}


class Dense:
    """A sentence-transformers Dense module on pooled embeddings [B, in] → [B, out]: activation(x Wᵀ + b), in
    float32 (LaBSE's projection, EmbeddingGemma's two, TEI's --dense-path)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, activation: Callable[[Tensor], Tensor]) -> None:
        self.weight, self.bias, self.activation = weight.float(), None if bias is None else bias.float(), activation
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def __call__(self, rows: Tensor) -> Tensor:
        weight, bias = self.weight.to(rows.device), None if self.bias is None else self.bias.to(rows.device)
        return self.activation(F.linear(rows.float(), weight, bias))


def read_dense(directory: Path, in_features: int, where: str) -> Dense:
    """The Dense module in `directory` (its config.json and model.safetensors, never a pickle) taking vectors of
    `in_features`; what it cannot be is one line starting with `where`."""
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise BertforgeError(f"{where}: no readable config.json in {directory} ({type(err).__name__})") from None
    if not (directory / "model.safetensors").is_file():
        raise BertforgeError(f"{where}: {directory} has no model.safetensors (bertforge reads no pickled weights)")
    from safetensors.torch import load_file

    weights = load_file(str(directory / "model.safetensors"))
    name = config.get("activation_function", "torch.nn.modules.activation.Tanh") if isinstance(config, dict) else None
    activation = DENSE_ACTIVATIONS.get(str(name))
    if activation is None:
        raise BertforgeError(f"{where}: activation {name!r} is not one of {', '.join(DENSE_ACTIVATIONS)}")
    weight = weights.get("linear.weight")
    if weight is None or weight.ndim != 2 or weight.shape[1] != in_features:
        raise BertforgeError(f"{where}: linear.weight must be [out, {in_features}] (the vectors it takes), got "
                             f"{None if weight is None else list(weight.shape)}")
    return Dense(weight, weights.get("linear.bias"), activation)


def _splade_rows(logits: Callable[[Tensor], Tensor], hidden: Tensor, lengths: list[int]) -> Tensor:
    """max over each sequence's rows of log(1 + relu(logits)) → [B, V] (float32 from half precision), for
    consecutive packed rows."""
    raw = logits(hidden)  # [T, V]
    values = torch.log1p(torch.relu(raw.float() if raw.element_size() < 4 else raw))
    if len(lengths) == 1:
        return values.amax(dim=0, keepdim=True)
    return _max(values, lengths, [])


def splade_pool(logits: Callable[[Tensor], Tensor], hidden: Tensor, lengths: list[int],
                chunk_tokens: int = SPLADE_CHUNK_TOKENS) -> Tensor:
    """SPLADE vectors [B, V] (float32, or the logits' wider dtype) of packed rows [T, H] (sequences end to end, no padding): for each
    sequence, the elementwise max over its tokens (special tokens included) of log(1 + relu(logits(row))), `logits`
    being the MLM head (hidden → vocabulary logits), as sentence-transformers' SpladePooling ("max", "relu") on
    its MLMTransformer's logits computes them.

    The vocabulary projection runs on consecutive sequences of up to `chunk_tokens` tokens at a time (at least one
    sequence), so only a chunk's [n, V] logits are alive; with grad, each chunk is recomputed in the backward pass
    (activation checkpointing) instead of keeping [T, V] logits for it: a SPLADE training step's memory is the
    encoder's plus one chunk's logits, for one more head projection."""
    chunks: list[list[int]] = []  # the lengths of each chunk's sequences
    for n in lengths:
        if chunks and sum(chunks[-1]) + n <= chunk_tokens:
            chunks[-1].append(n)
        else:
            chunks.append([n])
    pooled, first = [], 0
    for sizes in chunks:
        part = hidden[first:first + sum(sizes)]  # [n, H]
        first += sum(sizes)
        if torch.is_grad_enabled() and part.requires_grad:
            pooled.append(checkpoint(_splade_rows, logits, part, sizes, use_reentrant=False))
        else:
            pooled.append(_splade_rows(logits, part, sizes))
    return torch.cat(pooled) if pooled else hidden.new_zeros(0, 0)


def sentence_transformers_settings(path: Path | None) -> dict[str, Any]:
    """Pooling, normalisation and maximum length a sentence-transformers model directory declares, if any.

    Reads `modules.json`, the Pooling module's `config.json` (its `pooling_mode`, or the older `pooling_mode_*`
    flags), the Dense modules after it (`dense`: their directories, in order), `sentence_bert_config.json` (max_seq_length) and `config_sentence_transformers.json` (its `prompts` by
    name and `default_prompt_name`, e.g. nomic-embed's "search_query: ", and its `similarity_fn_name`). A
    SparseEncoder (a SpladePooling module after an MLMTransformer, or 6.x's fill-mask Transformer) gives
    `sparse: True`. Unreadable files are ignored: they are only defaults. What bertforge would not compute as
    sentence-transformers does is refused in one line: a module other than Transformer → Pooling → Dense ... →
    Normalize or Transformer → SpladePooling (a CNN, an LSTM, ...), a Dense before the Pooling or after the
    Normalize, several pooling modes concatenated, a Pooling that leaves the
    prompt's tokens out (`include_prompt: false`), SPLADE pooling other than the max of log(1 + relu(logits)).
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
        settings["normalize"], pooled = False, False
        for m in (m for m in modules if isinstance(m, dict)):
            kind = str(m.get("type", "")).rsplit(".", 1)[-1]
            if kind == "Dense":
                if not pooled or settings["normalize"]:
                    raise BertforgeError(f"{path}: its Dense module {m.get('path')!r} is not between the Pooling "
                                         "and the Normalize, where bertforge applies Dense modules")
                settings.setdefault("dense", []).append(str(m.get("path", "")))
            elif kind == "Normalize":
                settings["normalize"] = True
            elif kind == "Pooling":
                pooled = True
                pooling = read(path / str(m.get("path", "")) / "config.json")
                if isinstance(pooling, dict):
                    settings.update(_pooling_mode(pooling, path))
            elif kind == "SpladePooling":
                settings["sparse"] = True
                _splade_mode(read(path / str(m.get("path", "")) / "config.json"), path)
            elif kind not in ("Transformer", "MLMTransformer"):
                raise BertforgeError(
                    f"{path}: its sentence-transformers module {m.get('path') or m.get('name')!r} ({kind}) is not one "
                    "bertforge applies (Transformer, Pooling, Dense, Normalize): its embeddings would differ from "
                    "sentence-transformers'; use sentence-transformers for this model")
    st_config = read(path / "sentence_bert_config.json")
    if isinstance(st_config, dict) and isinstance(st_config.get("max_seq_length"), int):
        settings["max_length"] = st_config["max_seq_length"]
    st = read(path / "config_sentence_transformers.json")
    if isinstance(st, dict):
        prompts = st.get("prompts") or {}
        if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
            raise BertforgeError(f"{path / 'config_sentence_transformers.json'}: 'prompts' must map names to strings")
        default = st.get("default_prompt_name")
        if default is not None and default not in prompts:
            raise BertforgeError(f"{path / 'config_sentence_transformers.json'}: default_prompt_name {default!r} is "
                                 f"not one of its prompts ({', '.join(prompts) or 'none'})")
        if prompts:
            settings["prompts"], settings["default_prompt_name"] = prompts, default
        if isinstance(st.get("similarity_fn_name"), str):  # cosine, dot, euclidean or manhattan
            settings["similarity"] = st["similarity_fn_name"]
    return settings


def _splade_mode(config: Any, path: Path) -> None:
    """Refuse a SpladePooling that `splade_pool` does not compute (sum pooling, log1p_relu activation)."""
    if not isinstance(config, dict):
        return
    strategy, activation = config.get("pooling_strategy", "max"), config.get("activation_function", "relu")
    if strategy != "max" or activation != "relu":
        raise BertforgeError(f"{path}: its SpladePooling is {strategy!r} of {activation!r}; bertforge computes SPLADE "
                             "as the max of log(1 + relu(logits)): use sentence-transformers for this model")


def _pooling_mode(config: dict[str, Any], path: Path) -> dict[str, str]:
    """bertforge's name of the one pooling mode a sentence-transformers Pooling config declares."""
    declared = config.get("pooling_mode")
    modes = ([declared] if isinstance(declared, str) else list(declared) if isinstance(declared, list)
             else [mode for mode, flag in _LEGACY_FLAGS.items() if config.get(flag)])
    ours = {st: name for name, st in ST_POOLING_MODES.items()}
    if len(modes) > 1:
        raise BertforgeError(f"{path}: its Pooling module concatenates {len(modes)} poolings ({', '.join(map(str, modes))});"
                             " bertforge computes one: use sentence-transformers for this model")
    if modes and modes[0] not in ours:
        raise BertforgeError(f"{path}: unknown sentence-transformers pooling mode {modes[0]!r}")
    if config.get("include_prompt") is False:
        raise BertforgeError(f"{path}: its Pooling module leaves the prompt's tokens out of the pooling "
                             "(include_prompt false), which bertforge does not: use sentence-transformers for this model")
    return {"pooling": ours[modes[0]]} if modes else {}


def _st_config(versions: dict[str, str] | None, prompts: dict[str, str] | None, default_prompt_name: str | None,
               **extra: Any) -> str:
    """config_sentence_transformers.json's text."""
    if default_prompt_name is not None and default_prompt_name not in (prompts or {}):
        raise ValueError(f"default prompt {default_prompt_name!r} is not one of the prompts")
    return json.dumps({**extra, "__version__": versions or {}, "prompts": dict(prompts or {}),
                       "default_prompt_name": default_prompt_name}, indent=2) + "\n"


def write_sentence_transformers_files(path: Path, hidden_size: int, pooling: str, normalize: bool, max_length: int,
                                      versions: dict[str, str] | None = None, prompts: dict[str, str] | None = None,
                                      default_prompt_name: str | None = None) -> None:
    """The files that make a directory holding config.json, the weights and the tokenizer a sentence-transformers
    model: Transformer (the directory itself) → Pooling (`pooling`) → Normalize (when `normalize`); `prompts` by
    name in config_sentence_transformers.json (what `encode(prompt_name=...)` puts before a text)."""
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    modules = [{"idx": 0, "name": "0", "path": "", "type": TRANSFORMER_MODULE},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": POOLING_MODULE}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": NORMALIZE_MODULE})
        (path / "2_Normalize").mkdir(exist_ok=True)  # Normalize has no settings: an empty directory
    pooling_config = {
        "word_embedding_dimension": hidden_size,
        **{flag: ST_POOLING_MODES[pooling] == mode for mode, flag in _LEGACY_FLAGS.items()},
        "include_prompt": True,
    }
    (path / "1_Pooling").mkdir(exist_ok=True)
    atomic_write_text(path / "1_Pooling" / "config.json", json.dumps(pooling_config, indent=2) + "\n")
    atomic_write_text(path / "sentence_bert_config.json",
                      json.dumps({"max_seq_length": max_length, "do_lower_case": False}, indent=2) + "\n")
    atomic_write_text(path / "config_sentence_transformers.json",
                      _st_config(versions, prompts, default_prompt_name, similarity_fn_name="cosine"))
    atomic_write_text(path / "modules.json", json.dumps(modules, indent=2) + "\n")


def write_sparse_encoder_files(path: Path, vocab_size: int, max_length: int, versions: dict[str, str] | None = None,
                               prompts: dict[str, str] | None = None, default_prompt_name: str | None = None) -> None:
    """The files that make a directory holding a masked-LM checkpoint (config.json, the weights with the MLM head)
    and its tokenizer a sentence-transformers SparseEncoder, as sentence-transformers 5 saves one (6.x loads it
    too): MLMTransformer (the directory itself: its MLM logits) → SpladePooling (max of log(1 + relu(logits))),
    `model_type` SparseEncoder, dot-product similarity; `prompts` as for `write_sentence_transformers_files`."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": MLM_TRANSFORMER_MODULE},
               {"idx": 1, "name": "1", "path": SPLADE_POOLING_DIR, "type": SPLADE_POOLING_MODULE}]
    (path / SPLADE_POOLING_DIR).mkdir(exist_ok=True)
    pooling_config = {"pooling_strategy": "max", "activation_function": "relu", "word_embedding_dimension": vocab_size}
    atomic_write_text(path / SPLADE_POOLING_DIR / "config.json", json.dumps(pooling_config, indent=2) + "\n")
    atomic_write_text(path / "sentence_bert_config.json",
                      json.dumps({"max_seq_length": max_length, "do_lower_case": False}, indent=2) + "\n")
    atomic_write_text(path / "config_sentence_transformers.json",
                      _st_config(versions, prompts, default_prompt_name, model_type="SparseEncoder",
                                 similarity_fn_name="dot"))
    atomic_write_text(path / "modules.json", json.dumps(modules, indent=2) + "\n")


def write_cross_encoder_files(path: Path, activation: str, versions: dict[str, str] | None = None) -> None:
    """The settings file that makes a directory holding a one-logit sequence classifier a sentence-transformers
    CrossEncoder whose score is `activation` (a class path, "torch.nn.modules.activation.Sigmoid") of the logit."""
    st_config = {"__version__": versions or {}, "activation_fn": activation, "model_type": "CrossEncoder",
                 "prompts": {}, "default_prompt_name": None}
    atomic_write_text(path / "config_sentence_transformers.json", json.dumps(st_config, indent=2) + "\n")
