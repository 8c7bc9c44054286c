"""Values that several layers share, each defined once here and imported everywhere else.

(Where a value belongs to one module, it stays there: `bertforge.data.corpus.DEFAULT_CORPUS`, the bundled corpus
file next to that module; `bertforge.data.qa_spans.NULL_ANSWER_KEY`.)
"""

from __future__ import annotations

from dataclasses import dataclass

#: The label of a position or sequence that the loss ignores: `ignore_index` of `torch.nn.functional.cross_entropy`,
#: and the -100 of Hugging Face labels. Masked-LM labels of tokens that were not chosen, the NSP label of an
#: instance without a sentence pair, token-classification labels of special tokens and of every sub-word but a
#: word's first, and padding of label arrays.
IGNORE_INDEX = -100

#: A model directory's weight files, as `transformers` names them: safetensors, its shard index, the pickle (read
#: with weights_only=True only)
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
PICKLE_WEIGHTS_NAME = "pytorch_model.bin"

#: The default random seed of every trainer (`--seed`): the one of `transformers`' Trainer and sentence-transformers.
SEED = 42

#: sentence-embedding poolings, bertforge's names → sentence-transformers' `pooling_mode` (see `model/pooling.py`)
ST_POOLING_MODES = {"mean": "mean", "cls": "cls", "max": "max", "mean-sqrt-len": "mean_sqrt_len_tokens",
                    "weighted-mean": "weightedmean", "last-token": "lasttoken"}
POOLINGS = tuple(ST_POOLING_MODES)
#: how `bertforge embed --out DIR` stores its vectors (`pipelines/embed_corpus.py`), and its rows a shard by default
VECTOR_DTYPES = ("float32", "float16", "int8")
SHARD_ROWS = 100_000

@dataclass(frozen=True)
class ServeDefaults:
    """`bertforge serve`'s defaults, read by the command line (its help and TEI's environment variables) and by
    `serve.ServeConfig` / `serve.run_server`: where it listens and what it takes at once."""

    host: str = "127.0.0.1"  # this machine only; 0.0.0.0 for every interface
    port: int = 8080
    max_queue: int = 512  # requests waiting for the model (--max-concurrent-requests); one more gets 429
    max_batch_tokens: int = 16384  # real tokens per forward pass (requests are grouped up to this); TEI's default
    max_client_batch_size: int = 32  # inputs in one request; more gets TEI's 422; TEI's default
    auto_truncate: bool = True  # inputs longer than the model takes are cut (TEI's default since 1.9.0)
    max_body_bytes: int = 2_000_000  # request body size; more gets 413


SERVE_DEFAULTS = ServeDefaults()
