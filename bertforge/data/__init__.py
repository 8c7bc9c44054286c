"""Streaming pretraining data: corpus reading, BERT (NSP) / ALBERT (SOP) / RoBERTa (packing) instance creation,
dynamic masking (tokens, whole words, n-grams), static shards.

The training loop uses :class:`PretrainingStream`; tokenizer training uses :func:`iter_documents`. What the layers
above use is exported here; the parts (instances, masking, spans) are imported from their own modules.
"""

from bertforge.data.corpus import DEFAULT_CORPUS, CorpusReader, Document, DocumentSplit, iter_documents, list_corpus_files, take_mb
from bertforge.data.instance_stream import Buffers
from bertforge.data.static import (
    StaticShardReader,
    index_sentence_objective,
    write_duplicated_shards,
    write_static_shards,
)
from bertforge.data.stream import PretrainingStream

__all__ = [
    "Buffers",
    "DEFAULT_CORPUS",
    "CorpusReader",
    "Document",
    "DocumentSplit",
    "PretrainingStream",
    "StaticShardReader",
    "index_sentence_objective",
    "iter_documents",
    "list_corpus_files",
    "take_mb",
    "write_duplicated_shards",
    "write_static_shards",
]
