"""Inference pipelines: `bertforge.pipeline(task, model=DIR, **options)`.

    >>> embed = bertforge.pipeline("embed", model="all-MiniLM-L6-v2/")
    >>> embed(["a sentence", "another one"]).shape
    (2, 384)

Tasks: "embed", "sparse-embed" (SPLADE; also "sparse"), "fill-mask", "text-classification", "token-classification",
"question-answering", "rerank", "multiple-choice". Every pipeline takes one input or a list of any length (`pipe.stream(iterable)` yields
results one by one), tokenizes in a background thread, sorts inputs by length into batches with no padding at all,
and returns results in input order. A call takes transformers' call-time options for itself, `fill(texts, top_k=3)`,
and refuses by name those with no setting here (each class's `call_options` and `refused_options`).
`rerank(query, passages)` scores (query, passage) pairs with a cross-encoder and returns them best first;
`choose(context, choices)` picks a multiple-choice model's likeliest choice. A caller
that has tokenized already (the server) runs `pipe.run_features(inputs, pipe.features(inputs)[0])`.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..core.errors import BertforgeError
from .base import Pipeline

PIPELINE_CLASSES: dict[str, str] = {  # pipeline task -> its class
    "embed": "EmbedPipeline",
    "feature-extraction": "FeatureExtractionPipeline",
    "fill-mask": "FillMaskPipeline",
    "text-classification": "TextClassificationPipeline",
    "token-classification": "TokenClassificationPipeline",
    "question-answering": "QuestionAnsweringPipeline",
    "rerank": "RerankPipeline",
    "multiple-choice": "MultipleChoicePipeline",
    "sparse-embed": "SparseEmbedPipeline",
}
MODULES = {
    "embed": "embed",
    "feature-extraction": "embed",
    "fill-mask": "fill_mask",
    "text-classification": "classification",
    "token-classification": "classification",
    "question-answering": "question_answering",
    "rerank": "rerank",
    "multiple-choice": "multiple_choice",
    "sparse-embed": "sparse",
}
ALIASES = {
    "sentence-embedding": "embed",
    "feature_extraction": "feature-extraction",
    "fill_mask": "fill-mask",
    "sentiment-analysis": "text-classification",
    "text_classification": "text-classification",
    "ner": "token-classification",
    "token_classification": "token-classification",
    "qa": "question-answering",
    "question_answering": "question-answering",
    "reranker": "rerank",
    "text-ranking": "rerank",
    "cross-encoder": "rerank",
    "multiple_choice": "multiple-choice",
    "splade": "sparse-embed",
    "sparse": "sparse-embed",
    "sparse_embed": "sparse-embed",
}


def pipeline_class(task: str) -> type[Pipeline]:
    """The Pipeline subclass for a task name (or alias)."""
    name = ALIASES.get(task, task)
    if name not in PIPELINE_CLASSES:
        raise BertforgeError(f"unknown task {task!r}; choose one of: {', '.join(PIPELINE_CLASSES)}")
    module = importlib.import_module(f".{MODULES[name]}", __name__)
    return getattr(module, PIPELINE_CLASSES[name])

def pipeline(task: str, model: Any, **kwargs: Any) -> Pipeline:
    """Build the pipeline for `task` on `model` (a model directory, or a loaded model with `tokenizer=`).

    Options common to all tasks: tokenizer, max_length, max_batch_tokens, batch_size, progress, num_threads (see
    `bertforge.pipelines.base.Pipeline`); task options: see each pipeline class.
    """
    return pipeline_class(task)(model, **kwargs)


__all__ = ["ALIASES", "PIPELINE_CLASSES", "Pipeline", "pipeline", "pipeline_class"]
