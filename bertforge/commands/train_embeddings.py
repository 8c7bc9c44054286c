"""`bertforge train-embeddings`: train a sentence-embedding model; the output is a sentence-transformers model."""

from __future__ import annotations

import argparse
import json

NAME = "train-embeddings"
HELP = ("train sentence embeddings on pairs, triplets or scored pairs (in-batch negatives, CoSENT, Matryoshka); "
        "writes a sentence-transformers model")

REQUIRED = ("model", "train", "out")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..embeddings_train import EmbeddingsConfig
    from ..core.options import add_options, cli_fields

    names = [f.name for f in cli_fields(EmbeddingsConfig)]
    add_options(parser, EmbeddingsConfig, only=("model", "train", "dev", "out", "overwrite"), required=REQUIRED)
    training = [n for n in names if n not in ("model", "train", "dev", "out", "overwrite")]
    add_options(parser.add_argument_group("training"), EmbeddingsConfig, only=training)


def run(args: argparse.Namespace) -> int:
    from ..embeddings_train import EmbeddingsConfig, train_embeddings
    from ..core.options import given
    from ..core.system import last_runtime

    summary = train_embeddings(EmbeddingsConfig(**given(args, EmbeddingsConfig)))
    rt = last_runtime()
    if rt is None or rt.is_main:  # under torchrun, once
        print(json.dumps(summary, indent=2))
    return 0
