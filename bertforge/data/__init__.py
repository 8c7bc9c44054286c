"""Streaming pretraining data: corpus reading, BERT/RoBERTa instance creation, dynamic masking, static shards.

The training loop uses :class:`PretrainingStream`; tokenizer training uses :func:`iter_documents`.
"""

from bertforge.constants import IGNORE_INDEX
from bertforge.data.corpus import DEFAULT_CORPUS, CorpusReader, Document, DocumentSplit, iter_documents, list_corpus_files, take_mb
from bertforge.data.instances import (
    IS_NEXT,
    NO_LABEL,
    NOT_NEXT,
    Instance,
    InstanceStream,
    SequencePacker,
    create_nsp_instances,
    derive_seed,
    truncate_pair,
)
from bertforge.data.masking import MaskingCollator
from bertforge.data.static import StaticShardReader, write_duplicated_shards, write_static_shards
from bertforge.data.stream import PretrainingStream

__all__ = [
    "DEFAULT_CORPUS",
    "IGNORE_INDEX",
    "IS_NEXT",
    "NOT_NEXT",
    "NO_LABEL",
    "CorpusReader",
    "Document",
    "DocumentSplit",
    "Instance",
    "InstanceStream",
    "MaskingCollator",
    "PretrainingStream",
    "SequencePacker",
    "StaticShardReader",
    "create_nsp_instances",
    "derive_seed",
    "iter_documents",
    "take_mb",
    "list_corpus_files",
    "truncate_pair",
    "write_duplicated_shards",
    "write_static_shards",
]
