"""Values that several layers share, each defined once here and imported everywhere else.

(Where a value belongs to one module, it stays there: `bertforge.data.corpus.DEFAULT_CORPUS`, the bundled corpus
file next to that module; `bertforge.data.qa_spans.NULL_ANSWER_KEY`.)
"""

from __future__ import annotations

#: The label of a position or sequence that the loss ignores: `ignore_index` of `torch.nn.functional.cross_entropy`,
#: and the -100 of Hugging Face labels. Masked-LM labels of tokens that were not chosen, the NSP label of an
#: instance without a sentence pair, token-classification labels of special tokens and of every sub-word but a
#: word's first, and padding of label arrays.
IGNORE_INDEX = -100

#: The default random seed of every trainer (`--seed`): the one of `transformers`' Trainer and sentence-transformers.
SEED = 42

#: sentence-embedding poolings, bertforge's names → sentence-transformers' `pooling_mode` (see `model/pooling.py`)
ST_POOLING_MODES = {"mean": "mean", "cls": "cls", "max": "max", "mean-sqrt-len": "mean_sqrt_len_tokens",
                    "weighted-mean": "weightedmean", "last-token": "lasttoken"}
POOLINGS = tuple(ST_POOLING_MODES)
