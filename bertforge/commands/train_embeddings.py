"""`bertforge train-embeddings`: train a sentence-embedding model (dense, or sparse: SPLADE); the output is a
sentence-transformers model (a SparseEncoder for --sparse)."""

from __future__ import annotations

import argparse
import json

from . import add_run_config_argument, require_options

NAME = "train-embeddings"
HELP = ("train sentence embeddings, dense or sparse (SPLADE), on pairs, triplets, scored pairs or scored triplets "
        "(in-batch negatives, CoSENT, Matryoshka, margin-MSE); writes a sentence-transformers model")
EXAMPLES = (
    'bertforge train-embeddings --model runs/my-bert/model --train pairs.tsv --dev dev.tsv --out runs/my-embedder',
    'bertforge train-embeddings --model runs/my-bert/model --sparse splade --train pairs.tsv --prompts "query=query: " '
    '"document=passage: " --out runs/my-splade',
)  # `--help` shows them; tests/test_cli.py parses them

REQUIRED = ("model", "train", "out")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..embeddings_train import EmbeddingsConfig
    from ..embeddings_train.api import EMBEDDINGS
    from ..core.options import add_options, cli_fields

    names = [f.name for f in cli_fields(EmbeddingsConfig)]
    add_run_config_argument(parser, EMBEDDINGS)
    add_options(parser, EmbeddingsConfig, only=("model", "train", "dev", "out", "overwrite"))
    training = [n for n in names if n not in ("model", "train", "dev", "out", "overwrite")]
    add_options(parser.add_argument_group("training"), EmbeddingsConfig, only=training)


def run(args: argparse.Namespace) -> int:
    from ..core.options import given
    from ..core.system import last_runtime
    from ..embeddings_train import EmbeddingsConfig, train_embeddings
    from ..embeddings_train.api import EMBEDDINGS
    from ..training.run_dir import recorded_settings, settings_to_replay

    source = settings_to_replay(args.run_config, bool(args.resume), args.out, EMBEDDINGS)
    settings = {**(recorded_settings(source, EMBEDDINGS) if source else {}), **given(args, EmbeddingsConfig)}
    require_options(settings, REQUIRED)
    summary = train_embeddings(**settings)
    rt = last_runtime()
    if rt is None or rt.is_main:  # under torchrun, once
        print(json.dumps(summary, indent=2))
    return 0
