"""`bertforge train-tokenizer`: a WordPiece, byte-level BPE or Unigram vocabulary trained on your corpus, saved in
Hugging Face layout."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "train-tokenizer"
HELP = "train a WordPiece (BERT), byte-level BPE (RoBERTa) or Unigram (ALBERT) vocabulary on a corpus"
EXAMPLES = (
    'bertforge train-tokenizer --corpus my_corpus/ --algorithm bpe --vocab-size 32000 --out my-tokenizer',
)  # `--help` shows them; tests/test_cli.py parses them
ALGORITHMS = ("wordpiece", "bpe", "unigram")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", nargs="+", required=True, metavar="PATH", help="text files or directories (.txt, .gz, .jsonl)")
    p.add_argument("--algorithm", choices=ALGORITHMS, default="wordpiece",
                   help="the tokenizer to train: wordpiece (BERT's: [CLS] A [SEP]), bpe (RoBERTa's byte-level BPE: "
                        "<s> A </s></s> B </s>) or unigram (ALBERT's SentencePiece-style Unigram) (default: wordpiece)")
    from ..tokenizer.kinds import KINDS

    p.add_argument("--kind", choices=tuple(KINDS), default=None,
                   help="a family's tokenizer instead of --algorithm's: its special tokens, template and pipeline "
                        "(eurobert: byte-level BPE under Llama 3's tokens; mmbert: Gemma's byte-fallback BPE)")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--min-frequency", type=int, default=2, help="how often a pair must occur to be merged "
                                                                  "(wordpiece and bpe; unigram has no such limit)")
    p.add_argument("--cased", action="store_true",
                   help="keep case and accents (wordpiece and unigram; bpe always keeps them: byte-level BPE is "
                        "case-preserving by construction)")
    p.add_argument("--text-column", default="text", help="the text field of .jsonl input")
    p.add_argument("--sample-mb", type=float, default=None, help="train on the first N MB of the corpus only (default: all of it)")
    p.add_argument("--allow-binary", action="store_true",
                   help="read corpus files that look binary (NUL bytes, mostly control characters or invalid UTF-8) "
                        "instead of refusing them; invalid bytes are replaced")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--overwrite", action="store_true",
                   help="write the tokenizer into an --out that holds a model, a tokenizer or a pretraining run's "
                        "tokenizer (what is there is then replaced: a model's or a run's vocabulary stops matching "
                        "its weights)")


def refuse_model_directory(out: Path, overwrite: bool) -> None:
    """Without --overwrite, refuse an --out holding a model (config.json, weights) or a tokenizer, or that is a
    pretraining run's tokenizer/: a new vocabulary there would silently stop matching the model's embeddings, or
    stop the run from resuming."""
    from ..model.checkpoint import PICKLE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME
    from ..model.config import CONFIG_NAME
    from ..core.errors import BertforgeError
    from ..pretrain.args import RUN_CONFIG
    from ..tokenizer.files import tokenizer_files_in

    if overwrite:
        return
    found = [n for n in (CONFIG_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME, PICKLE_WEIGHTS_NAME) if (out / n).is_file()]
    if found:
        raise BertforgeError(f"--out {out} holds a model ({', '.join(found)}): a new vocabulary there would no longer "
                             f"match its embeddings; choose another directory, or pass --overwrite to replace its "
                             f"tokenizer anyway")
    run = out.parent
    if (run / RUN_CONFIG).is_file() or (run / "checkpoints").is_dir():
        raise BertforgeError(f"--out {out} is the tokenizer of the pretraining run {run}: a new vocabulary there "
                             f"would stop the run from resuming and its model from matching it; choose another "
                             f"directory, or pass --overwrite to replace it anyway")
    tokenizer = tokenizer_files_in(out)
    if tokenizer:
        raise BertforgeError(f"--out {out} already holds a tokenizer ({', '.join(tokenizer)}); choose another "
                             f"directory, or pass --overwrite to replace it")


def run(args: argparse.Namespace) -> int:
    from ..data import iter_documents
    from ..core.errors import BertforgeError
    from ..data import take_mb
    from ..tokenizer import Tokenizer, kind_by_name

    if args.vocab_size < 10:
        raise BertforgeError(f"--vocab-size must be at least 10, got {args.vocab_size}")
    for path in args.corpus:
        if not Path(path).exists():
            raise BertforgeError(f"corpus path {path} does not exist")
    refuse_model_directory(Path(args.out), args.overwrite)
    kind = kind_by_name(args.kind or args.algorithm)
    chosen = args.kind or args.algorithm
    lowercase = (not args.cased) if kind.case_options else None
    if args.cased and not kind.case_options:
        print(f"note: --cased changes nothing for {'--kind' if args.kind else '--algorithm'} {chosen}: it keeps case "
              "and accents anyway")
    lines = iter_documents(args.corpus, text_column=args.text_column, allow_binary=args.allow_binary)
    if args.sample_mb is not None:
        lines = take_mb(lines, args.sample_mb)
    tok = Tokenizer.train(lines, vocab_size=args.vocab_size, lowercase=lowercase, min_frequency=args.min_frequency,
                          kind=kind)
    tok.save_pretrained(args.out)
    print(f"{kind.family} ({chosen}) vocabulary of {tok.vocab_size:,} tokens written to {args.out}")
    return 0
