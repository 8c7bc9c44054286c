"""The model, tokenizer and data of a pretraining run: the run's model config (the tokenizer's vocabulary), the
memory check every rank agrees on, the weights it starts from, the tokenizer it uses (or trains)
and its training stream (dynamic or static masking)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..model.auto import AutoModelForPreTraining
from ..model.checkpoint import load_pretrained
from ..core.errors import BertforgeError
from ..model.memory import check_training_fits
from ..model import BertPreTrainedModel
from ..model.config import BertConfig
from .data import check_run_corpora, pretraining_stream, static_reader, train_run_tokenizer
from ..core.system import Runtime, on_every_rank, on_main

if TYPE_CHECKING:
    from .args import PretrainArgs
    from ..tokenizer import Tokenizer


def run_model_config(base: BertConfig, tokenizer: Tokenizer, args: PretrainArgs) -> BertConfig:
    """The run's model config: the preset or config.json with the tokenizer's vocabulary (`tokenizer` None: one
    rank 0 has not trained yet, of `args.vocab_size`); or the --init-from checkpoint's own, which must cover its
    tokenizer's ids."""
    if args.vocabulary_source is not None:
        if tokenizer is not None and tokenizer.vocab_size > base.vocab_size:
            raise BertforgeError(f"{args.vocabulary_source}: its tokenizer has {tokenizer.vocab_size} tokens, "
                                 f"more than the vocab_size of its config.json ({base.vocab_size})")
        return base
    vocab = tokenizer.vocab_size if tokenizer is not None else args.vocab_size
    pad = tokenizer.pad_token_id if tokenizer is not None else base.pad_token_id
    return dataclasses.replace(base, vocab_size=vocab, pad_token_id=pad, extra={**base.extra, **special_ids(base, tokenizer)})


def special_ids(config: BertConfig, tokenizer: Tokenizer | None) -> dict[str, int]:
    """The token-id fields the family's config.json carries besides pad (ModernBERT's bos, eos, cls, sep), from the
    run's tokenizer: [CLS] begins a sequence and [SEP] ends it, as in transformers' ModernBERT configs."""
    if tokenizer is None:
        return {}
    ids = {"cls_token_id": tokenizer.cls_token_id, "sep_token_id": tokenizer.sep_token_id,
           "bos_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id}
    return {name: ids[name] for name in config.family.special_ids if ids.get(name) is not None}


def check_fits(config: BertConfig, args: PretrainArgs, rt: Runtime) -> None:
    """Refuse a run that does not fit in memory: each rank against its own device; every rank learns whether all
    of them fit."""
    on_every_rank(rt, lambda: check_training_fits(
        config, args.batch_size, args.max_length, rt.device, gradient_checkpointing=args.gradient_checkpointing,
        shards=rt.world_size if args.fsdp else 1,
        what=f"pretraining --init-from {args.init_from}" if args.init_from else f"pretraining --config {args.config}",
    ), "the run does not fit in memory on another rank")


def initial_model(config: BertConfig, args: PretrainArgs, resuming: bool, is_main: bool) -> BertPreTrainedModel:
    """The weights the run starts from: the --init-from checkpoint's, through the one loader (the heads it lacks
    initialised from --seed, named in one warning, by rank 0), or random ones from --seed. A run resuming from a
    checkpoint of its own starts from random ones, which `Pretrainer.resume` replaces: never the --init-from
    weights again."""
    torch.manual_seed(args.seed)  # the same weights on every rank (FSDP shards them as they are)
    cls = AutoModelForPreTraining.model_class(config)  # MLM + the family's sentence head, or MLM alone
    if args.init_from is not None and not resuming:  # with the run's changes to its config (context extension)
        changes = args.context_overrides(BertConfig.from_pretrained(args.init_from))
        return load_pretrained(cls, args.init_from, quiet=not is_main, **changes)
    return cls(config)


def choose_tokenizer(args: PretrainArgs, out: Path, corpus: list[str], rt: Runtime, family: str = "bert"):
    """(tokenizer, trained): `--tokenizer` (or --init-from's); else the vocabulary this run trained before (a resume
    or a launch killed after training it: never retrain; not with --overwrite, whose run is a new one); else one
    trained now, in memory, on the corpus by rank 0 (saved to OUT/tokenizer once OUT is prepared; other ranks get
    None and read it from there)."""
    from ..tokenizer import Tokenizer

    a, own = args, out / "tokenizer"
    tokenizer = None
    if a.tokenizer or a.init_from:
        tokenizer = Tokenizer.from_pretrained(a.tokenizer or a.init_from)  # type: ignore[arg-type]
    elif not a.overwrite and (own / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_pretrained(own)
    # too few documents (or none) is refused now, not at the first batch, and before a vocabulary is trained
    on_main(rt, lambda: check_run_corpora(a, corpus))
    if tokenizer is not None:
        return tokenizer, False
    return (train_run_tokenizer(a, corpus, family) if rt.is_main else None), True


def build_stream(args: PretrainArgs, out: Path, corpus: list[str], tokenizer: Tokenizer, rt: Runtime):
    """Dynamic masking: a `PretrainingStream` over this rank's share of the corpus. Static masking
    (`static_masking`): that same stream's instances written to disk first, masked `dupe_factor` ways, then read
    back by a `StaticShardReader` (whose position is saved in checkpoints like the stream's)."""
    def stream(batch_size: int):
        return pretraining_stream(args, corpus, tokenizer, rt.rank, rt.world_size, batch_size)

    if args.static_masking:
        return static_reader(args, out, stream, rt.rank, rt.world_size, rt.is_main)
    return stream(args.batch_size)
