"""Streaming pretraining data: corpus reading, BERT (NSP) / ALBERT (SOP) / RoBERTa (packing) instance creation,
dynamic masking (tokens, whole words, n-grams), static shards.

The training loop uses :class:`PretrainingStream`; tokenizer training uses :func:`iter_documents`. What the layers
above use is exported here; the parts (instances, masking, spans) are imported from their own modules.

The bundled corpora: `corpus.DEFAULT_CORPUS` (The Devil's Dictionary: the stream's default and the text int8
calibration reads, `corpus.calibration_texts`) and `demo_world.DEMO_CORPUS` (short stories generated from a small
world's tables: what `bertforge pretrain` trains on when given no corpus, with the `PROBES` its demo asks).
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
