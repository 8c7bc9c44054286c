"""Sentence embeddings: mean or [CLS] pooling of the last (or a chosen layer's) hidden states, optionally
L2-normalised."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.errors import BertforgeError
from ..model import BertModel
from ..model.pooling import POOLINGS, Dense, pool, read_dense, sentence_transformers_settings
from .base import Feature, Pipeline, VectorPipeline
from ..model.attention import PackedBatch
from ..core.hub import model_path

log = logging.getLogger("bertforge")


class SentenceTransformersVectors(VectorPipeline):
    """A vector pipeline on a model directory that may be a sentence-transformers model (`EmbedPipeline`, and
    `SparseEmbedPipeline` on a SparseEncoder): its `max_seq_length` and its prompts.

    Args:
        settings_from: the directory whose sentence-transformers settings (pooling, normalisation, max_seq_length,
            prompts) apply when `model` is a loaded model (by default a model object has none).
        prompt_name: the sentence-transformers prompt (of the directory's `config_sentence_transformers.json`)
            put before every text, as `SentenceTransformer.encode(prompt_name=...)` does: nomic-embed's
            "search_query" / "search_document", a model trained with `train-embeddings --prompts`' "query" /
            "document", say. Default: the directory's `default_prompt_name`, if any.
        prompt: a prompt string instead (`encode(prompt=...)`); "" puts none, even where a default is declared.
        Other arguments: see `Pipeline`. `max_length` defaults to sentence-transformers' `max_seq_length` if the
        directory gives one.
    """

    def __init__(self, model: Any, *, settings_from: str | os.PathLike[str] | None = None,
                 prompt_name: str | None = None, prompt: str | None = None, **kwargs: Any) -> None:
        if isinstance(model, torch.nn.Module):
            directory = None if settings_from is None else model_path(settings_from)
        else:
            directory = model_path(model)
        defaults = sentence_transformers_settings(directory if directory is not None and directory.is_dir() else None)
        self.declared = defaults
        self.settings_dir = directory
        declared = defaults.get("max_length") if kwargs.get("max_length") is None else None
        super().__init__(model, **kwargs)  # without max_length: the model's limit
        if declared is not None:
            # sentence-transformers' max_seq_length, at most the model's limit (as sentence-transformers caps it)
            if declared > self.max_length:
                log.warning("%s: %s: max_seq_length %d is beyond this model's %d positions; using %d", self.task,
                            directory, declared, self.max_length, self.max_length)
            else:
                self.max_length = self.check_max_length(declared, self.max_length)
        self.prompts: dict[str, str] = defaults.get("prompts", {})
        self.default_prompt_name: str | None = defaults.get("default_prompt_name")
        self.prompt = self.choose_prompt(prompt_name, prompt, self.default_prompt_name)

    refused_options = {
        **Pipeline.refused_options,
        "tokenize_kwargs": "texts are tokenized as the model's tokenizer does and cut at max_length; set that "
                           "with max_length=N",
        "show_progress_bar": "it is called progress here (True, False, or None: for long inputs on a terminal)",
    }

    def choose_prompt(self, name: str | None, prompt: str | None, default: str | None) -> str:
        """The text put before every input: `prompt`, or the prompt called `name` (else the default one), or ""."""
        if name is not None and prompt is not None:
            raise BertforgeError(f"{self.task}: give prompt_name or prompt, not both")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise BertforgeError(f"{self.task}: prompt must be a string, got {type(prompt).__name__}")
            return prompt
        name = name if name is not None else default
        if name is None:
            return ""
        if name not in self.prompts:
            known = ", ".join(repr(k) for k in self.prompts) or "none (no config_sentence_transformers.json prompts)"
            raise BertforgeError(f"{self.task}: unknown prompt_name {name!r}; this model's prompts: {known}")
        return self.prompts[name]

    def featurize(self, inputs: list[str]) -> tuple[list[Feature], int]:
        """The texts tokenized with the prompt before each, as sentence-transformers does (truncated together)."""
        return super().featurize([self.prompt + text for text in inputs] if self.prompt else inputs)


class EmbedPipeline(SentenceTransformersVectors):
    """`pipeline("embed", model=DIR)`: texts → float32 array [n, hidden] (one text → [hidden]).

    Args:
        pooling: "mean" (average of the token vectors, [CLS] and [SEP] included, as sentence-transformers does)
            or "cls" (the [CLS] token's last hidden state). Default: what a sentence-transformers directory
            declares, else "mean".
        normalize: scale each embedding to unit length. Default: whether a sentence-transformers directory has a
            Normalize module, else False.
        layer: whose hidden states are pooled, numbered as transformers' `hidden_states` (`output_hidden_states`):
            0 the embedding output, N (the model's number of layers) the last; negative counts from the end, -1
            (the default) the last. Only the layers up to it are run.
        settings_from, prompt_name, prompt and the other arguments: see `SentenceTransformersVectors` and
        `Pipeline`.
    """

    task = "embed"
    model_class = BertModel
    # Runs of different lengths longer than the matmul attention's limit share padded, masked attention calls (up to
    # 50 % padding): far fewer SDPA calls on varied lengths (1.45x faster on WikiText paragraphs, 2 cores); rows
    # change by float rounding only (~2e-7). See `attention.attention_plan`.
    attention_padding = 0.5

    def __init__(self, model: Any, *, pooling: str | None = None, normalize: bool | None = None, layer: int = -1,
                 **kwargs: Any) -> None:
        if pooling is not None and pooling not in POOLINGS:
            raise BertforgeError(f"embed: pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        super().__init__(model, **kwargs)
        defaults = self.declared
        self.pooling = pooling if pooling is not None else defaults.get("pooling", "mean")
        self.set_normalize(normalize)
        self.hidden_size = self.model.config.hidden_size
        self.dense = self.dense_chain(self.declared.get("dense", []))
        self.layer = self.check_layer(layer)
        n = self.model.config.num_hidden_layers
        self.depth = None if self.layer == n else self.layer  # None: every block
        self.similarity: str = defaults.get("similarity", "cosine")  # sentence-transformers' similarity_fn_name

    call_options = (*Pipeline.call_options, "normalize")
    refused_options = {
        **SentenceTransformersVectors.refused_options,
        "normalize_embeddings": "it is called normalize here: embed(texts, normalize=True)",
        "return_tensors": "results are float32 numpy arrays; torch.from_numpy(result) makes a tensor",
    }

    def set_normalize(self, normalize: Any) -> None:
        """Scale each embedding to unit length; None: what a sentence-transformers directory declares."""
        if normalize is not None and not isinstance(normalize, bool):
            raise BertforgeError(f"embed: normalize must be True, False or None, got {normalize!r}")
        self.normalize = normalize if normalize is not None else bool(self.declared.get("normalize", False))

    def check_layer(self, layer: Any) -> int:
        """`layer` as an index 0..N of the hidden states, or a BertforgeError naming the range."""
        n = self.model.config.num_hidden_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not -(n + 1) <= layer <= n:
            raise BertforgeError(
                f"embed: layer must be an integer in {-(n + 1)}..{n} for this {n}-layer model (0: the embedding "
                f"output, {n} or -1: the last layer), got {layer!r}"
            )
        return layer % (n + 1)

    def dense_chain(self, paths: list[str]) -> list[Dense]:
        """The Dense modules a sentence-transformers directory lists after its Pooling, in order, each taking the
        previous one's width (the first: the model's)."""
        chain: list[Dense] = []
        for path in paths:
            where = f"{self.task}: {self.settings_dir}: Dense module {path!r}"
            chain.append(read_dense(Path(self.settings_dir or ".") / path, chain[-1].out_features if chain else
                                    self.hidden_size, where))
        return chain

    def vector_size(self) -> int:
        return self.dense[-1].out_features if self.dense else self.hidden_size

    def head(self, batch: PackedBatch, hidden: Tensor, features: list[Feature]) -> list[np.ndarray]:
        pooled = pool(hidden, batch.lengths, batch.starts, self.pooling, self.normalize and not self.dense)
        if self.dense:  # sentence-transformers' order: Pooling, each Dense, then Normalize
            for dense in self.dense:
                pooled = dense(pooled)
            pooled = F.normalize(pooled, dim=-1) if self.normalize else pooled
        return list(pooled.float().cpu().numpy())  # [B, H] rows (H: the last Dense's width)


class FeatureExtractionPipeline(EmbedPipeline):
    """`pipeline("feature-extraction", model=DIR)`: what `transformers`' feature-extraction pipeline returns — every
    token's last hidden state, special tokens included, no pooling: one text → a nested list [1, tokens, hidden];
    a list of texts → one such list each. (`pipeline("embed")` gives pooled sentence vectors.)"""

    task = "feature-extraction"
    call_options = Pipeline.call_options
    refused_options = {
        **SentenceTransformersVectors.refused_options,
        "return_tensors": "results are nested lists [1, tokens, hidden]; torch.tensor(result) makes a tensor",
    }

    def __init__(self, model: Any, **kwargs: Any) -> None:
        if kwargs.get("pooling") is not None or kwargs.get("normalize"):
            raise BertforgeError("feature-extraction returns token vectors, unpooled: for pooled (or normalised) "
                                 "sentence vectors use pipeline(\"embed\")")
        super().__init__(model, **kwargs)

    def head(self, batch: PackedBatch, hidden: Tensor, features: list[Feature]) -> list[np.ndarray]:
        rows = hidden.float().cpu().numpy()
        return [rows[start:start + n] for start, n in zip(batch.starts, batch.lengths)]  # [T, H] each

    def run(self, inputs: str | Iterable[str]) -> Any:
        if isinstance(inputs, str):
            return Pipeline.run(self, inputs)[None].tolist()
        return [rows[None].tolist() for rows in Pipeline.run(self, inputs)]
