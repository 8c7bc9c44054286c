"""`bertforge fill-mask`: the most likely tokens for each [MASK] of one or more texts."""

from __future__ import annotations

import argparse

from ..core.io import json_line
from . import add_device_argument

NAME = "fill-mask"
HELP = "predict the tokens hidden behind [MASK] in a text (needs a model with its MLM head)"
EXAMPLES = (
    'bertforge fill-mask --model runs/my-bert/model "Paris is the [MASK] of France."',
)  # `--help` shows them; tests/test_cli.py parses them


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory with an MLM head")
    parser.add_argument("texts", nargs="+", metavar="TEXT", help='text with one or more [MASK] tokens, e.g. "Paris is the [MASK] of France."')
    parser.add_argument("--top-k", type=int, default=5, metavar="K", help="predictions per mask (5)")
    parser.add_argument("--json", action="store_true", help="one JSON line per text instead of a table")
    add_device_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..pipelines import pipeline

    fill = pipeline("fill-mask", model=args.model, top_k=args.top_k, progress=False, device=args.device)
    for text, result in zip(args.texts, fill(args.texts)):
        per_mask = [result] if result and isinstance(result[0], dict) else result
        if args.json:
            print(json_line({"text": text, "predictions": per_mask}), end="")
            continue
        print(text)
        for number, predictions in enumerate(per_mask, start=1):
            if len(per_mask) > 1:
                print(f"  mask {number}:")
            width = max(len(p["token_str"]) for p in predictions)
            for p in predictions:
                print(f"  {p['score']:7.4f}  {p['token_str']:<{width}}  {p['sequence']}")
    return 0
