"""The data of a pretraining run: this rank's masked batches, streamed (dynamic masking) or written to disk first
and read back (static masking, `--static-masking`); with `--eval-fraction`, the training side of the corpus's
document split (the held-out side is the evaluation set, `pretrain_eval`)."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import BertforgeError

if TYPE_CHECKING:
    from .args import PretrainArgs
    from ..tokenizer import Tokenizer

log = logging.getLogger("bertforge")

STATIC_DIR = "static_shards"  # OUT/static_shards/rank-R-of-W/: --static-masking data, one directory per rank
STATIC_SHARD_BYTES = 64 << 20  # about this much per shard: one is held in memory while writing, one while reading
STATIC_WRITE_BATCH = 256  # instances masked together while writing static shards


def document_split(args: PretrainArgs, held_out: bool = False):
    """The `DocumentSplit` of `--eval-fraction` (the held-out side, or the side trained on); None without it."""
    from ..data import DocumentSplit

    return DocumentSplit(args.eval_fraction, held_out) if args.eval_fraction else None


def pretraining_stream(args: PretrainArgs, corpus: list[str], tokenizer: Tokenizer, rank: int, world_size: int, batch_size: int,
                       **overrides: Any):
    """A `PretrainingStream` of batches of `batch_size` over this rank's share of `corpus` (`args`: the run's
    `PretrainArgs`: sequence length, NSP, masking, seed, text field; the training side of `--eval-fraction`'s
    split). `overrides`: other `PretrainingStream` arguments (the evaluation set's seed, split, one epoch)."""
    from ..data import PretrainingStream

    tok, a = tokenizer, args
    settings = dict(
        cls_id=tok.cls_token_id,
        sep_id=tok.sep_token_id,
        pad_id=tok.pad_token_id,
        mask_id=tok.mask_token_id,
        vocab_size=tok.vocab_size,
        is_continuation=tok.continuation_mask() if a.whole_word_mask else None,
        max_seq_length=a.max_length,
        batch_size=batch_size,
        sentence_objective=a.sentence_objective,
        masking=a.masking_kind,
        whole_word_mask=a.whole_word_mask,
        mlm_probability=a.masking_rate,
        mask_token_prob=a.mask_replacement[0],
        random_token_prob=a.mask_replacement[1],
        seed=a.seed,
        rank=rank,
        world_size=world_size,
        text_column=a.text_column,
        allow_binary=a.allow_binary,
        split=document_split(a),
        packing=a.packing_kind,
    )
    return PretrainingStream(corpus, tok.encode_ids, **{**settings, **overrides})


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """A pretraining batch as the model's keyword arguments: the sentence label only where the objective has one
    (a BertForMaskedLM, the model of an MLM-only family, takes none); the documents of packed rows where the
    batch has them."""
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}
    for optional in ("next_sentence_label", "document_ids"):
        if optional in batch:
            inputs[optional] = batch[optional]
    return inputs


def static_shard_dir(out: Path, rank: int, world_size: int) -> Path:
    return out / STATIC_DIR / f"rank-{rank:05d}-of-{world_size:05d}"


def static_reader(args: PretrainArgs, out: Path, stream: Callable[[int], Any], rank: int, world_size: int, is_main: bool):
    """Each rank writes its own share of the corpus (the documents its dynamic stream, `stream(batch_size)`,
    would read), streamed into shards under a temporary name renamed into place when complete; a resumed run
    reuses them. Returns the `StaticShardReader` over them."""
    from ..data import StaticShardReader, write_duplicated_shards

    a = args
    directory = static_shard_dir(out, rank, world_size)
    if not (directory / "index.json").is_file():
        tmp = directory.with_name(f".{directory.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)  # the remains of a write that was killed
        if is_main:
            log.info("static masking: writing %d differently masked copies of the data to %s", a.dupe_factor, directory.parent)
        rows = max(1024, STATIC_SHARD_BYTES // (9 * a.max_length))  # int32 ids + int32 labels + uint8 types per token
        write_duplicated_shards(lambda: stream(STATIC_WRITE_BATCH), tmp, a.dupe_factor, rows,
                                progress=a.progress and is_main)
        os.replace(tmp, directory)
    reader = StaticShardReader(directory, a.batch_size, seed=a.seed)
    index = reader.index
    found = (index.get("dupe_factor"), index.get("max_seq_length"), reader.sentence_objective, index.get("masking", "token"),
             reader.packing)
    wanted = (a.dupe_factor, a.max_length, a.sentence_objective, "whole_word" if a.whole_word_mask and a.masking_kind == "token" else a.masking_kind,
              a.packing_kind)
    if found != wanted:
        raise BertforgeError(
            f"{directory} holds static shards for (dupe_factor, seq_len, sentence objective, masking, packing)={found}, "
            f"not {wanted}; remove it or use --overwrite"
        )
    return reader


def check_corpus(corpus: list[str], text_column: str, nsp: bool, allow_binary: bool = False, split: Any = None) -> None:
    """Refuse a corpus the run cannot train on before anything is written: no text, or (with NSP) fewer than two
    documents (of `split`'s side, when given). Reads until it has seen enough documents (two), so a large corpus
    costs a few lines."""
    from ..data import CorpusReader

    need = 2 if nsp else 1
    reader = CorpusReader(corpus, text_column=text_column, min_docs=need, cycle=False, allow_binary=allow_binary,
                          split=split)
    try:
        for seen, _ in enumerate(reader, start=1):  # a pass with fewer than `need` documents raises at its end
            if seen >= need:
                return
    finally:
        reader.close()


def check_run_corpora(args: PretrainArgs, corpus: list[str]) -> None:
    """`check_corpus` for what the run reads: the corpus (its training side with --eval-fraction) and the
    evaluation text (--eval-corpus, or the held-out side), each error naming which one is short."""
    a = args
    check_corpus(corpus, a.text_column, a.nsp, a.allow_binary, document_split(a))
    held_out = document_split(a, held_out=True)
    if not (a.eval_corpus or held_out):
        return
    try:
        check_corpus(a.eval_corpus or corpus, a.text_column, a.nsp, a.allow_binary, None if a.eval_corpus else held_out)
    except BertforgeError as err:
        what = "--eval-corpus" if a.eval_corpus else f"the documents --eval-fraction {a.eval_fraction} holds out"
        raise BertforgeError(f"{what}: {err}") from None


def train_run_tokenizer(args: PretrainArgs, corpus: list[str], family: str = "bert"):
    """A vocabulary of `args.vocab_size` of the model family's kind (WordPiece for BERT and DistilBERT, byte-level BPE
    for RoBERTa, Unigram for ALBERT and XLM-R) trained on the first `args.tokenizer_sample_mb` of the corpus, in
    memory (the caller saves it once the run's directory is ready)."""
    from ..data import iter_documents, take_mb
    from ..tokenizer import Tokenizer, kind_by_name

    a, kind = args, kind_by_name(family)
    log.info("training a %s vocabulary (%d tokens) on %s", kind.model_type.__name__, a.vocab_size, ", ".join(corpus))
    lines = take_mb(iter_documents(corpus, text_column=a.text_column, allow_binary=a.allow_binary), a.tokenizer_sample_mb)
    # lowercase=None: the kind's own default (BERT and ALBERT lowercase, byte-level BPE keeps case); --cased: never
    return Tokenizer.train(lines, vocab_size=a.vocab_size, lowercase=None if a.lowercase else False, kind=kind,
                           show_progress=None if a.progress else False)  # None: on a terminal only
