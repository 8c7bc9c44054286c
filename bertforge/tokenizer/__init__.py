"""BERT WordPiece tokenizer: a thin, HF-compatible layer over the `tokenizers` library.

All the actual tokenization (normalization, pre-tokenization, WordPiece, special-token templates, truncation,
padding, offsets) is done by a `tokenizers.Tokenizer` (the Rust backend, exposed as `Tokenizer.backend`). This
package only

* builds that backend from the files a BERT checkpoint ships (`tokenizer.json`, or `vocab.txt` plus
  `tokenizer_config.json`), or trains a new WordPiece vocabulary (`files.py`, `core.py`),
* saves it in the layout `transformers.AutoTokenizer.from_pretrained` reads (`files.py`), and
* offers a `__call__` whose output is identical to `transformers.BertTokenizerFast` for the same arguments
  (`core.py`, with the argument handling and batching in `encoding.py`).

What is particular to a tokenizer family (special tokens, template, model, normalizer and pre-tokenizer) is a
`TokenizerKind` value (`kinds.py`); BERT's is `kinds.BERT`.
"""

from bertforge.tokenizer.core import Tokenizer
from bertforge.tokenizer.files import DEFAULT_MODEL_MAX_LENGTH
from bertforge.tokenizer.kinds import BERT, DEFAULT_SPECIAL_TOKENS, Normalization, TokenizerKind

__all__ = ["BERT", "DEFAULT_MODEL_MAX_LENGTH", "DEFAULT_SPECIAL_TOKENS", "Normalization", "Tokenizer", "TokenizerKind"]
