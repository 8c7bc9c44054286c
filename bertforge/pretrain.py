"""Pretraining: raw text in, a Hugging Face-ready BERT out, exact to resume, from one CPU to many GPUs.

    pretrain(PretrainArgs(corpus=["wiki/"], config="base", max_steps=100_000, out="runs/base"))

One process per device under `torchrun`; PyTorch's own DDP (or FSDP with `fsdp=True`) does the rest. Rank 0 alone
logs and writes. A checkpoint is a directory `OUT/checkpoints/step-N/` built under a temporary name and renamed into
place, so a kill at any moment leaves only complete checkpoints; `resume=True` continues from the newest one that
loads, and the run ends bitwise equal to one that was never interrupted.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from .checkpoint import load_pretrained
from .model.config import BertConfig, PRESETS
from .constants import IGNORE_INDEX
from .data.demo_world import DEMO_CORPUS, PROBES
from .errors import BertforgeError
from .io import atomic_directory
from .memory import check_training_fits
from .auto import AutoModelForPreTraining
from .model import BertForPreTraining, BertPreTrainedModel
from .optim import DECAYS, decay_start, make_optimizer, warmup_decay
from .options import option
from .pretrain_data import STATIC_DIR, check_corpus, model_inputs, check_run_corpora, pretraining_stream, static_reader, train_run_tokenizer  # noqa: F401
from .pretrain_eval import HeldOutEvaluation, build_eval_set
from .run_dir import CHECKPOINT_RE, RUN_CONFIG, RunDirectory, list_checkpoints  # noqa: F401  (importable here too)
from .system import Runtime, all_ranks_agree, barrier, on_main, setup_runtime, teardown_runtime
from .time_budget import PROVISIONAL_STEPS, RunClock, apply_length
from .train import (MAX_SKIPPED_STEPS, PRECISION_HELP, PRECISIONS, TrainStep, labelled_count, pick_precision,
                    refuse_nonfinite)
from .training_checkpoint import Loaded, TrainingCheckpoints, number_list
from .training_log import MetricsLog, Panel, plot_curves, read_rows

log = logging.getLogger("bertforge")

WARMUP_STEPS = 100  # the default --warmup-steps
# (setting, the settings it decides, why): giving both is a contradiction, refused
CONTRADICTIONS = (
    ("init_from", ("config", "tokenizer", "vocab_size", "tokenizer_sample_mb", "lowercase"),
     "the checkpoint's config.json and tokenizer decide the model and its vocabulary"),
    ("warmup_ratio", ("warmup_steps",), "the ratio sets the warmup"),
    ("eval_fraction", ("eval_corpus",), "choose one source of held-out text"),
    ("max_minutes", ("max_steps", "warmup_ratio"), "the time budget sets the run's length in steps as it runs; give "
     "the warmup in steps"),
)

# the pretraining recipe of a family that says nothing else (`Family.recipe` overrides it: RoBERTa's beta2, ALBERT's
# n-gram masking)
RECIPE_DEFAULTS: dict[str, Any] = {"masking": "token", "adam_beta2": 0.999}

@dataclass
class PretrainArgs:
    """Everything that defines a pretraining run; each field with `option(...)` is also a `bertforge pretrain`
    option (see `bertforge.options`)."""

    corpus: list[str] = option(help="text files or directories (.txt, .gz, .jsonl); blank lines separate documents, "
                               "one sentence per line. Default: the bundled demo corpus (short stories about a small world, "
                               "bertforge/data/demo_world.py), with demo settings",
                               default_factory=list, metavar="PATH")
    out: str = option("runs/pretrain", "output directory")
    init_from: str | None = option(None, "continue pretraining a checkpoint (config.json, model.safetensors and its "
                                   "tokenizer files; pretraining heads it lacks are initialised): its model, config and "
                                   "tokenizer, so --config and the tokenizer options are refused with it", metavar="DIR")
    config: str = option("tiny", "a preset (tiny, mini, small, medium, base, large) or a config.json")
    tokenizer: str | None = option(None, "an existing tokenizer; default: train a WordPiece vocabulary on the corpus "
                                   "and keep it in OUT/tokenizer", metavar="DIR")
    vocab_size: int = option(30522, "size of a vocabulary trained here")
    tokenizer_sample_mb: float = option(256.0, "train the vocabulary on the first N MB of the corpus")
    lowercase: bool = option(True, "keep case and accents in a vocabulary trained here", flag="--cased")
    max_steps: int = option(1000, "optimizer steps")
    max_minutes: float | None = option(None, "train for M minutes of wall time instead of --max-steps: the run times "
                                       "its first steps and fits its step count, and so the learning-rate schedule, "
                                       "to the budget (see bertforge/time_budget.py)", metavar="M")
    batch_size: int = option(32, "sequences per micro-batch per process")
    grad_accum: int = option(1, "micro-batches per optimizer step")
    seq_len: int = option(128, "tokens per sequence")
    lr: float = option(1e-4, "peak learning rate")
    warmup_steps: int = option(WARMUP_STEPS, "linear warmup steps; one at or beyond --max-steps is cut to "
                               "a tenth of --max-steps, with a warning")
    warmup_ratio: float | None = option(None, "warmup over this fraction of --max-steps (instead of --warmup-steps)",
                                        metavar="R")
    decay: str = option("linear", "learning-rate decay after warmup; wsd: warmup-stable-decay, the peak until the "
                        "last --decay-ratio of the run, then linear to 0", choices=DECAYS)
    decay_ratio: float = option(0.1, "with --decay wsd: the final fraction of --max-steps that decays to 0", metavar="R")
    optimizer: str = option("adamw", "the optimizer; LAMB for very large batches", choices=("adamw", "lamb"))
    weight_decay: float = option(0.01, "decoupled weight decay of matrices and embeddings")
    max_grad_norm: float = 1.0
    max_skipped_steps: int = option(MAX_SKIPPED_STEPS, "stop with an error after N steps in a row with a non-finite "
                                    "loss or gradient", metavar="N")
    seed: int = option(0, "random seed")
    nsp: bool = option(True, "RoBERTa-style full-sentence packing, no next-sentence prediction (--objective mlm)",
                       flag="--no-nsp")
    objective: str = option("auto", "what the model learns besides MLM: auto (the family's recipe: BERT nsp, RoBERTa "
                            "and DistilBERT none, ALBERT sop), mlm (MLM alone, full-sentence packing), nsp "
                            "(next-sentence prediction) or sop (sentence-order prediction)",
                            choices=("auto", "mlm", "nsp", "sop"))
    masking: str = option("auto", "which tokens MLM masks: auto (the family's recipe: ALBERT ngram, else token), "
                          "token, or ngram (spans of up to 3, p(n) ~ 1/n); --whole-word-mask makes either whole "
                          "words", choices=("auto", "token", "ngram"))
    adam_beta2: float | None = option(None, "AdamW's beta2; default: the family's recipe (RoBERTa 0.98, else 0.999)")
    whole_word_mask: bool = option(False, "mask whole words rather than word pieces")
    mlm_probability: float = option(0.15, "share of tokens masked for the MLM loss")
    static_masking: bool = option(False, "mask once, as the original BERT did: write the masked data to "
                                  "OUT/static_shards first, then train from it")
    dupe_factor: int = option(10, "with --static-masking: how many different ways each instance is masked "
                              "(BERT's duplication factor)")
    eval_corpus: list[str] = option(help="held-out text to evaluate on (files or directories, as --corpus)",
                                    default_factory=list, metavar="PATH")
    eval_fraction: float | None = option(None, "hold out this fraction of the corpus's documents (the same ones "
                                         "every run: chosen by a hash of their number) to evaluate on", metavar="F")
    eval_every: int | None = option(None, "evaluate every N steps, at step 0 and at the end (default: every "
                                    "--save-every steps)", metavar="N")
    eval_max_instances: int = option(1000, "sequences in the fixed evaluation set", metavar="N")
    early_stop_patience: int | None = option(None, "stop the run after K evaluations in a row without a lower "
                                             "eval loss", metavar="K")
    save_every: int = option(500, "checkpoint every N steps")
    save_every_minutes: float | None = option(None, "also checkpoint at every multiple of M minutes of training time",
                                              metavar="M")
    keep_last: int = option(3, "complete checkpoints to keep")
    log_every: int = option(10, "a metrics row every N steps")
    resume: bool = option(False, "continue the run in --out from its newest complete checkpoint")
    overwrite: bool = option(False, "replace the run in --out")
    device: str = option("auto", "where to train", choices=("auto", "cpu", "cuda"))
    precision: str = option("auto", PRECISION_HELP, choices=PRECISIONS)
    fsdp: bool = option(False, "shard the model with FSDP (under torchrun)")
    gradient_checkpointing: bool = option(False, "recompute activations to save memory")
    compile: bool = option(False, "torch.compile the model")
    text_field: str = option("text", "the text field of .jsonl input")
    allow_binary: bool = option(False, "read corpus files that look binary (NUL bytes, mostly control characters or "
                                "invalid UTF-8) instead of refusing them; invalid bytes are replaced")
    progress: bool = option(True, "no progress bar", flag="--no-progress")
    demo: bool = True  # print [MASK] predictions for a few sentences before and after

    def validate(self) -> None:
        """Raise `BertforgeError` naming the first bad setting (before anything is written)."""
        a = self
        for name in ("max_steps", "batch_size", "grad_accum", "seq_len", "save_every", "keep_last", "log_every", "vocab_size",
                     "dupe_factor", "max_skipped_steps", "eval_max_instances", "eval_every", "early_stop_patience"):
            value = getattr(a, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise BertforgeError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        for name in ("max_minutes", "save_every_minutes"):
            value = getattr(a, name)
            if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise BertforgeError(f"--{name.replace('_', '-')} must be a positive number of minutes, got {value!r}")
        if a.seq_len < 8:
            raise BertforgeError(f"--seq-len {a.seq_len} is too short for [CLS] A [SEP] B [SEP]; use at least 8")
        if not (a.lr > 0 and math.isfinite(a.lr)):
            raise BertforgeError(f"--lr must be a positive number, got {a.lr}")
        if not 0 < a.mlm_probability < 1:
            raise BertforgeError(f"--mlm-probability must be in (0, 1), got {a.mlm_probability}")
        if a.resume and a.overwrite:
            raise BertforgeError("--resume and --overwrite contradict each other; choose one")
        refuse_contradictions(self.chosen())
        a.validate_schedule()
        a.validate_evaluation()
        for path in [*a.corpus, *a.eval_corpus]:
            if not Path(path).exists():
                raise BertforgeError(f"corpus path {path} does not exist")
        if a.init_from is not None and not (Path(a.init_from) / "config.json").is_file():
            raise BertforgeError(f"--init-from {a.init_from}: no config.json there (a checkpoint directory is expected)")

    def chosen(self) -> set[str]:
        """The settings that differ from their defaults (what a command line gave, as far as values can tell)."""
        def default(f: dataclasses.Field) -> Any:
            return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default

        return {f.name for f in dataclasses.fields(self) if getattr(self, f.name) != default(f)}

    def validate_schedule(self) -> None:
        a = self
        if a.warmup_steps < 0:
            raise BertforgeError(f"--warmup-steps must be >= 0, got {a.warmup_steps}")
        if a.warmup_ratio is not None and not 0 <= a.warmup_ratio < 1:
            raise BertforgeError(f"--warmup-ratio must be in [0, 1), got {a.warmup_ratio}")
        if not 0 < a.decay_ratio <= 1:
            raise BertforgeError(f"--decay-ratio must be in (0, 1], got {a.decay_ratio}")
        if a.decay != "wsd" and "decay_ratio" in a.chosen():
            raise BertforgeError(f"--decay-ratio applies to --decay wsd only, not --decay {a.decay}")

    def validate_evaluation(self) -> None:
        a = self
        if a.eval_fraction is not None and not 0 < a.eval_fraction < 1:
            raise BertforgeError(f"--eval-fraction must be in (0, 1), got {a.eval_fraction}")
        if not a.evaluates:
            for name in ("eval_every", "early_stop_patience"):
                if getattr(a, name) is not None:
                    raise BertforgeError(f"--{name.replace('_', '-')} needs held-out text: --eval-corpus or --eval-fraction")

    @property
    def evaluates(self) -> bool:
        return bool(self.eval_corpus or self.eval_fraction)

    def warmup(self) -> tuple[int, str | None]:
        """The warmup steps the run uses, and a warning when they differ from those asked for: a warmup at or beyond
        --max-steps would never let the learning rate reach its peak, so it is cut to a tenth of the run."""
        a = self
        asked = round(a.warmup_ratio * a.max_steps) if a.warmup_ratio is not None else a.warmup_steps
        if asked < a.max_steps:
            return asked, None
        used = a.max_steps // 10
        what = f"--warmup-ratio {a.warmup_ratio}" if a.warmup_ratio is not None else f"--warmup-steps {a.warmup_steps}"
        return used, (f"{what} is not shorter than --max-steps {a.max_steps}: the learning rate would never reach its "
                      f"peak; warming up over {used} steps (a tenth of the run) instead")

    def for_family(self, config: BertConfig) -> PretrainArgs:
        """These settings with the family's recipe filled in for "auto" (objective, masking, AdamW's beta2) and
        `nsp` following the objective; a setting the family contradicts is refused (RoBERTa has no sentence
        objective, ALBERT's is sentence order)."""
        a, member = self, config.family
        recipe = {**RECIPE_DEFAULTS, **member.recipe}
        objective = a.objective
        if objective == "auto":
            objective = {"NSP": "nsp", "SOP": "sop", None: "mlm"}[member.sentence_head] if a.nsp else "mlm"
        elif not a.nsp and objective != "mlm":
            raise BertforgeError(f"--no-nsp and --objective {objective} contradict each other; choose one")
        model = f"--config {a.config}" if a.init_from is None else f"--init-from {a.init_from}"
        if objective != "mlm" and member.sentence_head is None:
            raise BertforgeError(f"--objective {objective} contradicts {model}: {member.name} is pretrained with MLM "
                                 "only (it has no sentence head)")
        if objective == "nsp" and member.sentence_head == "SOP":
            raise BertforgeError(f"--objective nsp contradicts {model}: {member.name}'s sentence head learns "
                                 "sentence order (--objective sop)")
        masking = recipe["masking"] if a.masking == "auto" else a.masking
        beta2 = recipe["adam_beta2"] if a.adam_beta2 is None else a.adam_beta2
        return dataclasses.replace(a, objective=objective, nsp=objective == "nsp", masking=masking, adam_beta2=beta2)

    @property
    def vocabulary_source(self) -> str | None:
        """The checkpoint whose config.json and tokenizer decide the vocabulary (--init-from), or None: the model's
        vocabulary is the tokenizer's."""
        return self.init_from

    @property
    def sentence_objective(self) -> str | None:
        """The data's sentence objective: "nsp", "sop" or None (settings not resolved by `for_family` yet read
        "auto" as BERT's: NSP unless --no-nsp)."""
        if self.objective == "auto":
            return "nsp" if self.nsp else None
        return None if self.objective == "mlm" else self.objective

    @property
    def masking_kind(self) -> str:
        """The data's masking: "token" or "ngram" ("auto" unresolved reads as BERT's, token)."""
        return "token" if self.masking == "auto" else self.masking

    def model_config(self) -> BertConfig:
        """The preset, config.json or --init-from checkpoint's config, checked against seq_len (a vocabulary trained
        here is applied later)."""
        a = self
        if a.init_from is not None:
            config = BertConfig.from_pretrained(a.init_from)
        elif Path(a.config).exists():
            config = BertConfig.from_pretrained(a.config)
        elif a.config.rpartition("-")[2] in PRESETS:
            config = BertConfig.preset(a.config)  # a size, or FAMILY-SIZE; an unknown family is refused there
        else:
            raise BertforgeError(f"--config {a.config!r} is neither a preset ({', '.join(PRESETS)}, or FAMILY-SIZE such "
                                 "as roberta-tiny) nor a config.json path")
        config.check_sequence_length(a.seq_len, "--seq-len")
        return config


def refuse_contradictions(chosen: set[str]) -> None:
    """Refuse, in one line, settings given together with one that decides them (`CONTRADICTIONS`). `chosen`: the
    settings given (by the command line) or set off their defaults (`PretrainArgs.chosen`)."""
    from .options import flag_of

    flags = {f.name: flag_of(f) for f in dataclasses.fields(PretrainArgs) if "cli" in f.metadata}
    for setting, decided, why in CONTRADICTIONS:
        clash = [flags[name] for name in decided if name in chosen]
        if setting in chosen and clash:
            raise BertforgeError(f"{flags[setting]} contradicts {', '.join(clash)} ({why}); leave out {' and '.join(clash)}")


def decided_by(chosen: set[str]) -> set[str]:
    """The settings that `chosen` ones decide (`CONTRADICTIONS`): a base such as the demo's must not set them."""
    return {name for setting, decided, _ in CONTRADICTIONS if setting in chosen for name in decided}


# ---------------------------------------------------------------------------------------------------- environment
# ---------------------------------------------------------------------------------------------------- the trainer
class Pretrainer:
    """Owns the model, optimizer, schedule, data stream and the loop. `run()` trains to `max_steps`."""

    def __init__(self, args: PretrainArgs) -> None:
        self.args = args
        args.validate()
        self.rt = setup_runtime(args.device)
        self.out = Path(args.out)
        self.corpus = [str(p) for p in args.corpus] or [str(DEMO_CORPUS)]
        self.run_dir = RunDirectory(self.out, args.resume, args.overwrite, dataclasses.asdict(args))  # rank 0 acts on it
        base_config = args.model_config()  # settings the model config refuses fail here, before anything is written
        self.args = args = args.for_family(base_config)  # the family's recipe where the settings say "auto"
        self.autocast_dtype = pick_precision(self.args.precision, self.rt.device)
        try:
            self.setup(base_config)
        except BaseException:
            self.abandon()
            raise

    def setup(self, base_config: BertConfig) -> None:
        """Lock OUT and check the whole run (OUT, corpus, tokenizer, model size) before OUT changes; then prepare
        OUT and build the model, optimizer and data."""
        args = self.args
        self.take_lock()
        self.tokenizer, trained = self.choose_tokenizer(base_config.model_type)
        check_fits(run_model_config(base_config, self.tokenizer, args), args, self.rt)
        self.prepare_output_dir()  # the first change to OUT
        if trained:
            if self.rt.is_main:
                self.tokenizer.save_pretrained(self.out / "tokenizer")
            barrier(self.rt)
            from .tokenizer import Tokenizer

            self.tokenizer = Tokenizer.from_pretrained(self.out / "tokenizer")  # every rank reads what rank 0 saved
        self.config = run_model_config(base_config, self.tokenizer, args)  # the vocabulary the model is trained with
        resuming = args.resume and bool(list_checkpoints(self.out))  # then resume() brings the weights
        self.model = self.build_model(resuming).to(self.rt.device)
        if args.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        if args.sentence_objective is None and isinstance(self.model, BertForPreTraining):
            # MLM alone with a family that has a sentence head: the pooler and that head get no gradient, so freeze
            # them (DDP wants a gradient for every trainable weight); they are still saved, so the model keeps the
            # BertForPreTraining layout.
            for module in (self.model.bert.pooler, self.model.cls.seq_relationship):
                module.requires_grad_(False)
        self.train_model = wrap_model(self.model, self.rt, args.fsdp, args.compile)
        self.optimizer = make_optimizer(self.model, args.optimizer, args.lr, args.weight_decay,  # fused where it applies
                                        betas=(0.9, args.adam_beta2))
        self.clock = None if args.max_minutes is None and args.save_every_minutes is None else RunClock(
            args.max_minutes, args.save_every_minutes, self.rt)
        if args.max_minutes is not None:
            args.max_steps = PROVISIONAL_STEPS  # until the budget has timed the first steps (`follow_clock`)
        self.warmup, note = args.warmup()
        if note and self.rt.is_main:
            log.warning("%s", note)
        self.scheduler = warmup_decay(self.optimizer, self.warmup, args.max_steps, args.decay, args.decay_ratio)
        self.stepper = TrainStep(self.model, self.optimizer, self.scheduler, max_grad_norm=args.max_grad_norm,
                                 device=self.rt.device, precision=self.autocast_dtype, world_size=self.rt.world_size,
                                 max_skipped_steps=args.max_skipped_steps)
        self.stream = self.build_stream()
        self.evaluation = None if not args.evaluates else HeldOutEvaluation(
            build_eval_set(args, self.corpus, self.tokenizer), args.eval_every or args.save_every,
            args.early_stop_patience, self.rt, self.stepper.autocast, args.fsdp)
        self.tokens_seen = 0
        self.checkpoints = TrainingCheckpoints(self.out, self.rt, self.stepper, args.keep_last, self.config,
                                               counters=("tokens_seen",))
        # per-step metrics since the last row of metrics.jsonl; checkpointed, so that the first row after a resume
        # averages the same steps as in an uninterrupted run
        self.metrics_window: list[dict[str, float]] = []

    @property
    def step(self) -> int:
        """Optimizer steps taken (or skipped): the shared `TrainStep`'s count."""
        return self.stepper.step

    @step.setter
    def step(self, value: int) -> None:
        self.stepper.step = value

    @property
    def skipped_steps(self) -> int:
        return self.stepper.skipped_steps

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self.stepper.skipped_steps = value

    # ------------------------------------------------------------------ set-up
    def take_lock(self) -> None:
        """Rank 0 locks OUT (a second run into it is refused, naming this one's pid), finishes what an interrupted
        --overwrite left, and checks OUT and the corpus without changing anything; every rank learns the outcome.
        One lock, rank 0's: rank 0 alone writes the run's files, and OUT may sit on a filesystem other hosts share,
        where a lock per host would not exclude a second launch elsewhere."""
        on_main(self.rt, self.run_dir.lock_and_check)

    def prepare_output_dir(self) -> None:
        """The first change to OUT, once the run has been checked (see `RunDirectory.prepare`)."""
        if self.rt.is_main:
            self.run_dir.prepare()
        barrier(self.rt)

    def abandon(self) -> None:
        """After a failure: the run --overwrite set aside goes back in place, and the lock is released."""
        if self.rt.is_main:
            self.run_dir.abandon()

    def close(self) -> None:
        """Release the lock on OUT (the run is over, or this object will not run)."""
        self.run_dir.close()

    def finish(self) -> None:
        """After a successful run: drop the DDP wrapper, then destroy the process group. DDP's reducer holds the
        group; were the reducer the last holder, the group would be destroyed inside the reducer's destructor, which
        holds the GIL while it waits for gloo's worker thread, and that thread may need the GIL to free a finished
        barrier's tensors: the process hangs after the run (seen under torchrun, 2 CPU processes, PyTorch 2.13)."""
        self.train_model = self.model
        gc.collect()  # the wrapper may sit in a reference cycle
        teardown_runtime(self.rt)  # on success only: after an error, other ranks may still be inside a collective

    def choose_tokenizer(self, family: str = "bert"):
        """(tokenizer, trained): `--tokenizer` (or --init-from's); else the vocabulary this run trained before (a resume or a launch
        killed after training it: never retrain; not with --overwrite, whose run is a new one); else one trained
        now, in memory, on the corpus by rank 0 (saved to OUT/tokenizer once OUT is prepared; other ranks get None
        and read it from there)."""
        from .tokenizer import Tokenizer

        a, own = self.args, self.out / "tokenizer"
        tokenizer = None
        if a.tokenizer or a.init_from:
            tokenizer = Tokenizer.from_pretrained(a.tokenizer or a.init_from)
        elif not a.overwrite and (own / "tokenizer.json").is_file():
            tokenizer = Tokenizer.from_pretrained(own)
        # too few documents (or none) is refused now, not at the first batch, and before a vocabulary is trained
        on_main(self.rt, lambda: check_run_corpora(a, self.corpus))
        if tokenizer is not None:
            return tokenizer, False
        return (train_run_tokenizer(a, self.corpus, family) if self.rt.is_main else None), True

    def build_stream(self):
        """Dynamic masking: a `PretrainingStream` over this rank's share of the corpus. Static masking
        (`static_masking`): that same stream's instances written to disk first, masked `dupe_factor` ways, then read
        back by a `StaticShardReader` (whose position is saved in checkpoints like the stream's)."""
        rt = self.rt

        def stream(batch_size: int):
            return pretraining_stream(self.args, self.corpus, self.tokenizer, rt.rank, rt.world_size, batch_size)

        if self.args.static_masking:
            return static_reader(self.args, self.out, stream, rt.rank, rt.world_size, rt.is_main)
        return stream(self.args.batch_size)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> None:
        """Everything that decides what comes next (`TrainingCheckpoints.save`): weights, optimizer, schedule, RNGs,
        the stream's position, and the counters and metrics window of this trainer."""
        counters: dict[str, Any] = {"tokens_seen": self.tokens_seen, "metrics_window": self.metrics_window}
        if self.evaluation is not None:
            counters["evaluation"] = self.evaluation.state_dict()
        if self.clock is not None:
            counters["clock"] = self.clock.state_dict(self.args.max_steps)
        self.checkpoints.save(self.stream.state_dict(), counters)
        if self.rt.is_main:
            self.run_dir.drop_replaced()  # the new run has a checkpoint: the run --overwrite replaced can go

    def restore(self, loaded: Loaded) -> None:
        """This trainer's part of a checkpoint being read: the stream's position, the tokens seen, the metrics
        window (a damaged or absent one starts anew) and the held-out evaluation's record."""
        trainer = loaded.trainer
        self.stream.load_state_dict(loaded.data)
        self.tokens_seen = trainer["tokens_seen"]
        window = trainer.get("metrics_window", [])
        self.metrics_window = window if number_list(window) and all(isinstance(w, dict) for w in window) else []
        if self.evaluation is not None and "evaluation" in trainer:
            self.evaluation.load_state_dict(trainer["evaluation"])
        if self.clock is not None:
            self.set_length(self.clock.load_state_dict(trainer.get("clock")))

    def resume(self) -> None:
        """Continue from the newest checkpoint that loads; a corrupt one is reported and the previous one tried
        (`TrainingCheckpoints.resume`)."""
        self.checkpoints.resume(self.restore)

    # ------------------------------------------------------------------ the loop
    def forward_backward(self, batch: dict[str, torch.Tensor], weights: dict[str, float]) -> dict[str, torch.Tensor]:
        """One micro-batch forward and backward (through `TrainStep.accumulate`, with `TrainStep.weights`' shares: MLM
        by labelled tokens, NSP by sequences); returns its statistics, losses as shares of the step's loss."""
        batch = self.on_device(batch)
        with self.stepper.autocast():
            out = self.train_model(**model_inputs(batch))
        loss = self.stepper.accumulate({"mlm": out.mlm_loss, "nsp": out.nsp_loss}, weights)
        stats = self.mlm_stats(loss, out, batch, weights)
        if out.nsp_loss is not None:
            with torch.no_grad():
                stats["nsp_loss"] = out.nsp_loss.detach() * weights["nsp"]
                stats["nsp_correct"] = (out.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]).sum()
                stats["nsp_count"] = torch.tensor(batch["next_sentence_label"].numel(), device=self.rt.device)
        return stats

    def on_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.rt.device, non_blocking=True) for k, v in batch.items()}

    @torch.no_grad()
    def mlm_stats(self, loss: torch.Tensor, out: Any, batch: dict[str, torch.Tensor],
                  weights: dict[str, float]) -> dict[str, torch.Tensor]:
        """A micro-batch's statistics every pretraining-style trainer logs: its share of the step's loss and of the
        MLM loss, MLM hits among the labelled tokens (`out.prediction_logits`: their rows only), real tokens."""
        labels = batch["labels"]
        target = labels[labels != IGNORE_INDEX]
        return {
            "loss": loss,
            "mlm_loss": out.mlm_loss.detach() * weights["mlm"],
            "mlm_correct": (out.prediction_logits.argmax(-1) == target).sum(),
            "mlm_count": torch.tensor(target.numel(), device=self.rt.device),
            "tokens": batch["attention_mask"].sum(),
        }

    def build_model(self, resuming: bool) -> BertPreTrainedModel:
        """The model this run trains (a trainer built on this one, distillation, brings its own)."""
        return initial_model(self.config, self.args, resuming, self.rt.is_main)

    @staticmethod
    def loss_counts(batch: dict[str, torch.Tensor]) -> dict[str, int]:
        """What each loss term is averaged over (see `pretraining_counts`)."""
        return pretraining_counts(batch)

    def train_step(self) -> dict[str, float]:
        """One optimizer step over `grad_accum` micro-batches (`TrainStep.run`). A non-finite loss or gradient skips
        the update."""
        batches = [next(self.stream) for _ in range(self.args.grad_accum)]
        outcome = self.stepper.run(batches, lambda b, w: self.forward_backward(b, w), self.loss_counts, self.train_model)
        totals = outcome.totals
        result = {
            "loss": totals["loss"].item(),
            "mlm_loss": totals["mlm_loss"].item(),
            "mlm_accuracy": totals["mlm_correct"].item() / max(1, totals["mlm_count"].item()),
            "lr": outcome.lr,
            "grad_norm": outcome.grad_norm.item(),
            "tokens": int(totals["tokens"].item()),
        }
        if "nsp_loss" in totals:
            result["nsp_accuracy"] = totals["nsp_correct"].item() / max(1, totals["nsp_count"].item())
        result.update({k: v.item() for k, v in totals.items() if k.endswith("_loss") and k not in result})  # nsp, ...
        self.tokens_seen += result["tokens"]
        return result

    def run(self) -> Path:
        """Train to `max_steps` and export OUT/model. A failure before the first checkpoint puts back the run that
        --overwrite set aside; the lock on OUT is released at the end either way."""
        try:
            return self.run_locked()
        except BaseException:
            self.abandon()
            raise
        finally:
            self.close()

    def run_locked(self) -> Path:
        a = self.args
        if a.resume:
            self.resume()
        # rows after the step resumed from are dropped (all of them when no checkpoint was made: -1)
        resume_step = -1 if a.resume and self.step == 0 else self.step
        metrics = MetricsLog(self.out / "metrics.jsonl", resume_step, self.out / "tensorboard", enabled=self.rt.is_main)
        if a.demo and self.step == 0:
            self.demo("before training")
        if self.evaluation is not None and self.step == 0:
            self.evaluate(metrics)  # where the run starts from (an --init-from checkpoint, or random weights)
        bar = None
        if self.rt.is_main and a.progress:
            from tqdm.auto import tqdm

            total = None if a.max_steps == PROVISIONAL_STEPS else a.max_steps  # a budget not yet timed
            bar = tqdm(total=total, initial=self.step, desc="pretraining", unit="step", dynamic_ncols=True)
        self.model.train()
        try:
            self.train_loop(bar, metrics)
        finally:
            if bar is not None:
                bar.close()
            metrics.close()
        final = self.out / "model"
        self.export(final)  # every rank: gathering FSDP shards is a collective
        if a.demo:
            self.demo("after training")
        if self.rt.is_main:
            plot_metrics(self.out / "metrics.jsonl", self.out / "training_curves.png")
            summary = metrics_summary(self.out / "metrics.jsonl", self.config.vocab_size)
            if summary:
                log.info("%s", summary)
            log.info("done: %d steps (%d skipped), %s tokens; model in %s", self.step, self.skipped_steps, f"{self.tokens_seen:,}", final)
        barrier(self.rt)
        return final

    def train_loop(self, bar, metrics: "MetricsLog") -> None:
        a = self.args
        window = self.metrics_window  # restored by a resume; tokens/s counts this process's steps only
        window_tokens, window_start = 0, time.perf_counter()
        if self.clock is not None:
            self.clock.start(self.step)
        while self.step < a.max_steps and not (self.evaluation is not None and self.evaluation.stopped):
            result = self.train_step()
            timed_save = self.follow_clock(bar)
            window_tokens += result.pop("tokens")
            window.append({k: float(v) for k, v in result.items()})
            if bar is not None:
                bar.update(1)
            if self.step % a.log_every == 0 or self.step == a.max_steps:
                elapsed = time.perf_counter() - window_start
                row = {"step": self.step, **{k: float(np.mean([w[k] for w in window])) for k in window[0]}}
                row["lr"] = window[-1]["lr"]
                row["tokens_per_s"] = window_tokens / max(elapsed, 1e-9)
                row["skipped_steps"] = self.skipped_steps
                metrics.write(row)
                if bar is not None:
                    bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{row['lr']:.2e}", tok_s=f"{row['tokens_per_s']:,.0f}")
                if self.step % a.log_every == 0:  # a last row off the log_every grid keeps its window going, so that
                    window.clear()  # a run resumed past max_steps logs the rows of one that never stopped there
                window_tokens, window_start = 0, time.perf_counter()
            if self.evaluation is not None and self.evaluation.due(self.step, a.max_steps):
                self.evaluate(metrics)
            stopped = self.evaluation is not None and self.evaluation.stopped
            if self.step % a.save_every == 0 or self.step == a.max_steps or stopped or timed_save:
                self.save_checkpoint()

    def follow_clock(self, bar=None) -> bool:
        """After a step, with --max-minutes or --save-every-minutes (`time_budget.RunClock`): the run's length,
        fitted to the budget, and whether a wall-time checkpoint is due."""
        if self.clock is None:
            return False
        a = self.args
        length, due = self.clock.tick(self.step, a.max_steps,
                                      lambda total: decay_start(self.warmup, total, a.decay, a.decay_ratio))
        self.set_length(length, bar)
        return due

    def set_length(self, length: int | None, bar=None) -> None:
        """The run's length from the budget, or from a checkpoint's record of it (`time_budget.apply_length`)."""
        if length is None or length == self.args.max_steps:
            return
        self.warmup = apply_length(self.args, self.scheduler, self.warmup, length, self.step, self.rt.is_main)
        if bar is not None:
            bar.total = length
            bar.refresh()

    def evaluate(self, metrics: MetricsLog) -> None:
        """Evaluate on the held-out set (every rank: its share, summed over all): a row of metrics.jsonl, and
        OUT/best/ when the eval loss is the lowest so far."""
        evaluation = self.evaluation
        result = evaluation.evaluate(self.model)
        metrics.write({"type": "eval", "step": self.step, **result})
        if evaluation.record(self.step, result["eval_loss"]):
            self.export(self.out / "best", {"step": self.step, **result})
        elif evaluation.stopped and self.rt.is_main:
            log.info("early stop at step %d: no lower eval loss in %d evaluations; the best, %.4f at step %d, is in %s",
                     self.step, evaluation.since_best, evaluation.best_loss, evaluation.best_step, self.out / "best")

    def demo(self, title: str) -> None:
        """[MASK] predictions for the demo sentences, logged by rank 0. Under FSDP each forward all-gathers the
        shards, so every rank must run it (rank 0 alone would wait forever for the others); under DDP the bare
        model is local and rank 0 alone runs it."""
        if self.args.fsdp or self.rt.is_main:
            show_predictions(self.model, self.tokenizer, title, self.rt.device, emit=self.rt.is_main)

    def export(self, target: Path, evaluation: dict[str, Any] | None = None) -> None:
        """`OUT/model/` (or `OUT/best/`, with its `evaluation` in eval.json) in Hugging Face layout: config.json,
        model.safetensors and the tokenizer files. Called on every rank (under FSDP the full state dict is gathered
        collectively); rank 0 alone writes."""
        weights = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.rt.is_main:
            return
        refuse_nonfinite(weights, str(target))
        with torch.device("meta"):  # no storage and no initialisation: it would draw from the training RNG
            export = type(self.model)(self.config)
        export.load_state_dict(weights, assign=True)
        with atomic_directory(target) as tmp:
            export.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            if evaluation is not None:
                (tmp / "eval.json").write_text(json.dumps(evaluation, indent=2) + "\n", encoding="utf-8")


def wrap_model(model: torch.nn.Module, rt: Runtime, fsdp: bool, compile: bool) -> torch.nn.Module:
    """DDP (or FSDP, per layer and whole) when several processes run, then torch.compile if asked."""
    wrapped: torch.nn.Module = model
    if fsdp:
        if not rt.distributed:
            raise BertforgeError("--fsdp needs several processes: launch with torchrun --nproc-per-node N")
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks():  # type: ignore[operator]
            fully_shard(block)
        fully_shard(model)
    elif rt.distributed:
        from torch.nn.parallel import DistributedDataParallel

        ids = [rt.local_rank] if rt.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=ids)
    if compile:
        wrapped = torch.compile(wrapped)
    return wrapped


def run_model_config(base: BertConfig, tokenizer: Any, args: PretrainArgs) -> BertConfig:
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
    return dataclasses.replace(base, vocab_size=vocab, pad_token_id=pad)


def check_fits(config: BertConfig, args: PretrainArgs, rt: Runtime) -> None:
    """Refuse a run that does not fit in memory: each rank against its own device; every rank learns whether all
    of them fit."""
    refused: BertforgeError | None = None
    try:
        check_training_fits(config, args.batch_size, args.seq_len, rt.device,
                            gradient_checkpointing=args.gradient_checkpointing, shards=rt.world_size if args.fsdp else 1,
                            what=f"pretraining --init-from {args.init_from}" if args.init_from else f"pretraining --config {args.config}")
    except BertforgeError as err:
        refused = err
    if not all_ranks_agree(rt, refused is None):
        raise refused if refused is not None else BertforgeError("the run does not fit in memory on another rank")


def initial_model(config: BertConfig, args: PretrainArgs, resuming: bool, is_main: bool) -> BertPreTrainedModel:
    """The weights the run starts from: the --init-from checkpoint's, through the one loader (the heads it lacks
    initialised from --seed, named in one warning, by rank 0), or random ones from --seed. A run resuming from a
    checkpoint of its own starts from random ones, which `Pretrainer.resume` replaces: never the --init-from
    weights again."""
    torch.manual_seed(args.seed)  # the same weights on every rank (FSDP shards them as they are)
    cls = AutoModelForPreTraining.model_class(config)  # MLM + the family's sentence head, or MLM alone
    if args.init_from is not None and not resuming:
        return load_pretrained(cls, args.init_from, quiet=not is_main)
    return cls(config)


def pretraining_counts(batch: dict[str, torch.Tensor]) -> dict[str, int]:
    """What the step's loss is normalised by: labelled (masked) tokens for MLM, labelled sequences for NSP."""
    counts = {"mlm": labelled_count(batch["labels"])}
    if "next_sentence_label" in batch:
        counts["nsp"] = labelled_count(batch["next_sentence_label"])
    return counts


def metrics_summary(path: Path, vocab_size: int) -> str | None:
    """One line: the MLM loss and accuracy of the first and the last logged step, against ln(V) (the loss of a
    uniform guess), so that a user sees at once how far training went. None without two logged rows."""
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError):
        return None
    rows = [r for r in rows if isinstance(r, dict) and isinstance(r.get("mlm_loss"), (int, float))]
    if len(rows) < 2:
        return None
    first, last = rows[0], rows[-1]
    text = (f"MLM loss {first['mlm_loss']:.2f} (step {first['step']}) -> {last['mlm_loss']:.2f} (step {last['step']}); "
            f"ln(vocab) = {math.log(vocab_size):.2f} is a uniform guess")
    if isinstance(first.get("mlm_accuracy"), (int, float)) and isinstance(last.get("mlm_accuracy"), (int, float)):
        text += f"; MLM accuracy {first['mlm_accuracy']:.1%} -> {last['mlm_accuracy']:.1%}"
    return text


PRETRAIN_PANELS = (
    Panel("training loss", ("loss", "mlm_loss", "nsp_loss")),
    Panel("training accuracy", ("mlm_accuracy", "nsp_accuracy"), ylim=(0, 1)),
    Panel("learning rate", ("lr",)),
)
EVAL_PANELS = (  # with held-out evaluation: its MLM loss beside the training one, and its accuracies
    Panel("MLM loss", ("mlm_loss", "eval_loss"), marker="."),
    Panel("held-out accuracy", ("eval_mlm_accuracy", "eval_nsp_accuracy"), kind="eval", marker="o", ylim=(0, 1)),
)


def plot_metrics(metrics_file: Path, png: Path) -> None:
    """Losses, accuracies and learning rate against step (and the held-out evaluation's, when there is one), one
    PNG."""
    rows = read_rows(metrics_file)
    if rows:
        evaluated = any(r.get("type") == "eval" for r in rows)
        plot_curves(rows, png, PRETRAIN_PANELS + (EVAL_PANELS if evaluated else ()))


@torch.no_grad()
def show_predictions(model: BertForPreTraining, tokenizer, title: str, device: torch.device, k: int = 3,
                     emit: bool = True) -> int:
    """Print the top-k fillers of the [MASK] in each probe sentence (`demo_world.PROBES`), marking the top guess
    that is the word the demo corpus puts there, and return how many are (`emit=False`: run the forwards, print
    nothing)."""
    was_training = model.training
    model.eval()
    lines, right = [], 0
    for text, answer in PROBES:
        enc = tokenizer(text.replace("[MASK]", tokenizer.mask_token), return_tensors="pt")
        ids = enc["input_ids"].to(device)
        out = model(input_ids=ids, token_type_ids=enc["token_type_ids"].to(device))
        pos = int((ids[0] == tokenizer.mask_token_id).nonzero()[0, 0])
        top = out.prediction_logits[0, pos].float().softmax(-1).topk(k)
        top_ids = top.indices.tolist()
        # a model may have more rows than its tokenizer has tokens (ids past the vocabulary read as None)
        words = [w or f"[{i}]" for i, w in zip(top_ids, tokenizer.convert_ids_to_tokens(top_ids))]
        hit = words[0].lower() == answer.lower()
        right += hit
        guesses = ", ".join(f"{w} ({p:.2f})" for w, p in zip(words, top.values.tolist()))
        lines.append(f"  {'+' if hit else ' '} {text:<40} ->  {guesses}")
    if emit:
        log.info("\n".join([f"[MASK] predictions {title} (+: the word the demo corpus puts there; "
                             f"{right} of {len(PROBES)}):", *lines]))
    model.train(was_training)
    return right


def pretrain(args: PretrainArgs | None = None, **kwargs: Any) -> Path:
    """Train a BERT from raw text; returns the directory of the final Hugging Face-layout model."""
    args = args or PretrainArgs(**kwargs)
    trainer = Pretrainer(args)
    final = trainer.run()
    trainer.finish()
    return final
