"""`bertforge train-tokenizer`: a WordPiece vocabulary trained on your corpus, saved in Hugging Face layout."""

from __future__ import annotations

import argparse

NAME = "train-tokenizer"
HELP = "train a WordPiece vocabulary on a corpus"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", nargs="+", required=True, metavar="PATH", help="text files or directories (.txt, .gz, .jsonl)")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--cased", action="store_true", help="keep case and accents")
    p.add_argument("--text-field", default="text", help="the text field of .jsonl input")
    p.add_argument("--sample-mb", type=float, default=None, help="train on the first N MB of the corpus only (default: all of it)")
    p.add_argument("--allow-binary", action="store_true",
                   help="read corpus files that look binary (NUL bytes, mostly control characters or invalid UTF-8) "
                        "instead of refusing them; invalid bytes are replaced")
    p.add_argument("--out", required=True, metavar="DIR")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..data import iter_documents
    from ..errors import BertforgeError
    from ..data import take_mb
    from ..tokenizer import Tokenizer

    if args.vocab_size < 10:
        raise BertforgeError(f"--vocab-size must be at least 10, got {args.vocab_size}")
    for path in args.corpus:
        if not Path(path).exists():
            raise BertforgeError(f"corpus path {path} does not exist")
    lines = iter_documents(args.corpus, text_field=args.text_field, allow_binary=args.allow_binary)
    if args.sample_mb is not None:
        lines = take_mb(lines, args.sample_mb)
    tok = Tokenizer.train(lines, vocab_size=args.vocab_size, lowercase=not args.cased, min_frequency=args.min_frequency)
    tok.save_pretrained(args.out)
    print(f"vocabulary of {tok.vocab_size:,} tokens written to {args.out}")
    return 0
