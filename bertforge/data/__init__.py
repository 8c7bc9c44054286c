"""Streaming pretraining data: corpus reading, BERT (NSP) / ALBERT (SOP) / RoBERTa (packing) instance creation,
dynamic masking (tokens, whole words, n-grams), ModernBERT's document packing, static shards.

The training loop uses :class:`PretrainingStream`; tokenizer training uses :func:`iter_documents`.
"""

from bertforge.data.corpus import DEFAULT_CORPUS, CorpusReader, Document, DocumentSplit, iter_documents, list_corpus_files, take_mb
from bertforge.data.instance_stream import InstanceStream
from bertforge.data.instances import (
    IN_ORDER,
    IS_NEXT,
    NOT_NEXT,
    SENTENCE_OBJECTIVES,
    SWAPPED,
    DocumentPacker,
    Instance,
    PairLayout,
    SequencePacker,
    create_nsp_instances,
    create_sop_instances,
    derive_seed,
    resolve_sentence_objective,
    truncate_pair,
)
from bertforge.data.masking import MASKING_KINDS, MaskingCollator
from bertforge.data.spans import NgramDraw
from bertforge.data.static import (
    StaticShardReader,
    index_sentence_objective,
    write_duplicated_shards,
    write_static_shards,
)
from bertforge.data.stream import PretrainingStream

__all__ = [
    "DEFAULT_CORPUS",
    "IN_ORDER",
    "IS_NEXT",
    "MASKING_KINDS",
    "NOT_NEXT",
    "SENTENCE_OBJECTIVES",
    "SWAPPED",
    "CorpusReader",
    "Document",
    "DocumentPacker",
    "DocumentSplit",
    "Instance",
    "InstanceStream",
    "PairLayout",
    "MaskingCollator",
    "NgramDraw",
    "PretrainingStream",
    "SequencePacker",
    "StaticShardReader",
    "create_nsp_instances",
    "create_sop_instances",
    "derive_seed",
    "index_sentence_objective",
    "iter_documents",
    "take_mb",
    "list_corpus_files",
    "resolve_sentence_objective",
    "truncate_pair",
    "write_duplicated_shards",
    "write_static_shards",
]
