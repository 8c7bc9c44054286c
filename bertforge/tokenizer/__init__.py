"""The tokenizers of the BERT family: a thin, HF-compatible layer over the `tokenizers` library.

All the actual tokenization (normalization, pre-tokenization, WordPiece / BPE / Unigram, special-token templates,
truncation, padding, offsets) is done by a `tokenizers.Tokenizer` (the Rust backend, exposed as
`Tokenizer.backend`). This package only

* builds that backend from the files a checkpoint ships (`tokenizer.json`, or `vocab.txt` / `vocab.json` +
  `merges.txt` plus `tokenizer_config.json`), or trains a new vocabulary (`files.py`, `core.py`),
* saves it in the layout `transformers.AutoTokenizer.from_pretrained` reads (`files.py`), and
* offers a `__call__` whose output is identical to the `transformers` tokenizer of the same files for the same
  arguments (`core.py`, with the argument handling and batching in `encoding.py`).

What is particular to a tokenizer family (special tokens, template, model, normalizer and pre-tokenizer) is a
`TokenizerKind` value (`kinds.py`): `BERT`, `DISTILBERT` and `MPNET` (WordPiece), `ROBERTA`, `MODERNBERT` and `EUROBERT` (byte-level
BPE), `ALBERT`, `XLM_ROBERTA` and `DEBERTA` (Unigram); `kind_by_name("roberta")` or `kind_by_name("bpe")` finds one.
"""

from bertforge.tokenizer.core import Tokenizer
from bertforge.tokenizer.files import DEFAULT_MODEL_MAX_LENGTH
from bertforge.tokenizer.kinds import (
    ALBERT,
    BERT,
    DEBERTA,
    DEFAULT_SPECIAL_TOKENS,
    DISTILBERT,
    KINDS,
    EUROBERT,
    MMBERT,
    MODERNBERT,
    MPNET,
    ROBERTA,
    XLM_ROBERTA,
    Normalization,
    TokenizerKind,
    kind_by_name,
)

__all__ = ["ALBERT", "BERT", "DEBERTA", "DEFAULT_MODEL_MAX_LENGTH", "DEFAULT_SPECIAL_TOKENS", "DISTILBERT", "EUROBERT", "KINDS", "MMBERT", "MODERNBERT",
           "MPNET", "ROBERTA",
           "XLM_ROBERTA", "Normalization", "Tokenizer", "TokenizerKind", "kind_by_name"]
