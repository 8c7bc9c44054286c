"""The settings of a pretraining run (`PretrainArgs`): each field is also a `bertforge pretrain` option, validated
once (`validate`), with the family's recipe filled in by `for_family` (a new value: settings are never changed once
validated; the run's length, which a time budget decides as it goes, lives in `time_budget.RunLength`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.constants import SEED
from ..core.errors import BertforgeError
from ..core.system import TRAINING_DEVICES
from ..model.config import BertConfig, PRESETS
from ..model.families import Recipe
from ..model.families import recipe as family_recipe
from ..training.optim import DECAYS, OPTIMIZERS, STABLE_DECAYS
from ..core.options import check_choices, option
from ..training.time_budget import PROVISIONAL_STEPS
from ..training.run_dir import RunKind, recorded_settings, settings_to_replay
from ..training.step import MAX_SKIPPED_STEPS, PRECISION_HELP, PRECISIONS
from .data import STATIC_DIR
from .objectives import BERT_REPLACEMENT, ObjectiveKind
from .registry import AUTO, OBJECTIVE_CHOICES, objective_kind, own_settings, owners
from ..core.hub import model_path

WARMUP_STEPS = 100  # the default --warmup-steps
RTD_WEIGHT = 50.0  # λ of --objective rtd: the papers' (ELECTRA, DeBERTa-v3); Microsoft's DeBERTa code defaults to 10
RUN_CONFIG = "run_config.json"  # the settings of a pretraining run, in OUT
# A pretraining (or distillation) run's directory: all that --overwrite replaces, and the settings a --resume may
# change (any other change would make the continuation a different run; `out` is where the run lives, not what it
# is: a moved run directory resumes, the data state checks the corpus)
PRETRAINING = RunKind(
    command="pretrain", what="pretraining run", config_file=RUN_CONFIG,
    entries=("checkpoints", "model", "best", "generator", "best-generator", "tokenizer", "tensorboard", "metrics.jsonl",
             RUN_CONFIG,
             "training_curves.png", STATIC_DIR),
    resumable=frozenset({"max_steps", "save_every", "keep_checkpoints", "log_every", "resume", "overwrite", "progress", "demo",
                         "out", "max_skipped_steps"}),
)
# (setting, the settings it decides, why): giving both is a contradiction, refused
CONTRADICTIONS = (
    ("init_from", ("config", "tokenizer", "vocab_size", "tokenizer_sample_mb", "lowercase"),
     "the checkpoint's config.json and tokenizer decide the model and its vocabulary"),
    ("warmup_ratio", ("warmup_steps",), "the ratio sets the warmup"),
    ("eval_fraction", ("eval_corpus",), "choose one source of held-out text"),
    ("max_minutes", ("max_steps", "warmup_ratio"), "the time budget sets the run's length in steps as it runs; give "
     "the warmup in steps"),
)

# The no-argument demo (no corpus given: the bundled demo world, `data/demo_world.py`): a tiny BERT in two to four
# minutes on 2 CPU cores. Measured 2026-11-28 (2 cores, nothing else running, the default seed 42): 208 s in all, MLM
# loss 6.69 -> 0.88 (74 %), most probes' top guess of the right kind (an animal's sound, a food, a capital, a day, a
# colour), 3 of 12 the corpus's own word; 2026-11-27 with seed 0: 138 s (the machine was faster that day: the older
# code measured 6 % slower than today's, alternated here), 5 of 12. 1,500 steps of 64 tokens (127 s) reached 2 of 12
# and 600 (53 s) none; MLM alone was worse than NSP. These are the defaults of every setting a run without a corpus is
# not given (`run_settings`).
# Its model is exported every minute of training (`save_every_minutes`) and when Ctrl-C stops it, so that a demo
# stopped early, on a slow machine, still leaves runs/demo/model/ to try the other commands on.
DEMO: dict[str, Any] = dict(vocab_size=8000, max_steps=2500, max_length=32, lr=2e-3, warmup_steps=100, save_every=500,
                            save_every_minutes=1.0, out="runs/demo")


@dataclass(frozen=True)
class PretrainArgs:
    """Everything that defines a pretraining run; each field with `option(...)` is also a `bertforge pretrain`
    option (see `bertforge.core.options`)."""

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
                                       "to the budget (see bertforge/training/time_budget.py)", metavar="M")
    batch_size: int = option(32, "sequences per micro-batch per process")
    grad_accum: int = option(1, "micro-batches per optimizer step")
    max_length: int = option(128, "tokens per sequence; a model with rotary positions (ModernBERT) takes longer ones "
                             "than its max_position_embeddings, which becomes --max-length (context extension)")
    global_rope_theta: float | None = option(None, "the rotary θ of the global-attention layers (context extension: "
                                             "ModernBERT trains at 1,024 with 10,000, then continues at 8,192 with "
                                             "160,000); for models with rotary positions only", metavar="THETA")
    lr: float = option(1e-4, "peak learning rate")
    warmup_steps: int = option(WARMUP_STEPS, "linear warmup steps; one at or beyond --max-steps is cut to "
                               "a tenth of --max-steps, with a warning")
    warmup_ratio: float | None = option(None, "warmup over this fraction of --max-steps (instead of --warmup-steps)",
                                        metavar="R")
    decay: str = option("auto", "learning-rate decay after warmup: auto (the family's recipe: ModernBERT wsd-sqrt, "
                        "else linear), linear, cosine, constant; wsd: warmup-stable-decay, the peak until the "
                        "last --decay-ratio of the run, then linear to 0; wsd-sqrt: the same decaying as "
                        "1 - sqrt(progress)", choices=("auto", *DECAYS))
    decay_ratio: float = option(0.1, "with --decay wsd or wsd-sqrt: the final fraction of --max-steps that decays "
                                "to 0", metavar="R")
    optimizer: str = option("adamw", "the optimizer; stable-adamw: AdamW with per-tensor update clipping "
                            "(ModernBERT's); lamb for very large batches", choices=OPTIMIZERS)
    weight_decay: float = option(0.01, "decoupled weight decay of matrices and embeddings")
    max_grad_norm: float = 1.0
    max_skipped_steps: int = option(MAX_SKIPPED_STEPS, "stop with an error after N steps in a row with a non-finite "
                                    "loss or gradient", metavar="N")
    seed: int = option(SEED, "random seed", metavar="N")
    nsp: bool = option(True, "RoBERTa-style full-sentence packing, no next-sentence prediction (--objective mlm)",
                       flag="--no-nsp")
    objective: str = option("auto", "what the model learns besides MLM: auto (the family's recipe: BERT nsp, RoBERTa "
                            "and DistilBERT none, ALBERT sop, DeBERTa rtd), mlm (MLM alone, full-sentence packing), nsp "
                            "(next-sentence prediction), sop (sentence-order prediction) or rtd (ELECTRA's and "
                            "DeBERTa-v3's replaced-token detection: a generator's MLM samples fill the masks, the model learns "
                            "which tokens were replaced; OUT/model is that discriminator, OUT/generator the generator)",
                            choices=OBJECTIVE_CHOICES)
    generator_layers: int | None = option(None, "with --objective rtd: the generator's layers (default: the "
                                          "family's; DeBERTa-v3 half the model's at its width, ELECTRA all of them "
                                          "at a quarter of its width)", metavar="N")
    rtd_weight: float = option(RTD_WEIGHT, "with --objective rtd: λ, the replaced-token loss's weight beside the "
                               "generator's MLM loss (50, ELECTRA's and the DeBERTa-v3 paper's; Microsoft's code "
                               "uses 10)", metavar="λ")
    masking: str = option("auto", "which tokens MLM masks: auto (the family's recipe: ALBERT ngram, else token), "
                          "token, or ngram (spans of up to 3, p(n) ~ 1/n); --whole-word-mask makes either whole "
                          "words", choices=("auto", "token", "ngram"))
    adam_beta2: float | None = option(None, "AdamW's beta2; default: the family's recipe (RoBERTa 0.98, else 0.999)")
    whole_word_mask: bool = option(False, "mask whole words rather than word pieces")
    mlm_probability: float | None = option(None, "share of tokens masked for the MLM loss; default: the family's "
                                           "recipe (ModernBERT 0.3, else 0.15)")
    packing: str = option("auto", "how MLM-only rows are filled: auto (the family's recipe: ModernBERT documents, "
                          "else stream), stream (RoBERTa's: text end to end, rows crossing documents), documents "
                          "(each document [CLS] … [SEP], packed end to end, attending only within itself)",
                          choices=("auto", "stream", "documents"))
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
    save_every_minutes: float | None = option(None, "also checkpoint, and export OUT/model and its curves, at every multiple "
                                              "of M minutes of training time (the demo: 1)",
                                              metavar="M")
    keep_checkpoints: int = option(3, "complete checkpoints to keep")
    log_every: int = option(10, "a metrics row every N steps")
    resume: bool = option(False, "continue the run in --out from its newest complete checkpoint")
    overwrite: bool = option(False, "replace the run in --out")
    device: str | None = option(None, TRAINING_DEVICES, metavar="DEVICE")
    precision: str = option("auto", PRECISION_HELP, choices=PRECISIONS)
    fsdp: bool = option(False, "shard the model with FSDP (under torchrun)")
    gradient_checkpointing: bool = option(False, "recompute activations to save memory")
    compile: bool = option(False, "torch.compile the model")
    text_column: str = option("text", "the text field of .jsonl input")
    allow_binary: bool = option(False, "read corpus files that look binary (NUL bytes, mostly control characters or "
                                "invalid UTF-8) instead of refusing them; invalid bytes are replaced")
    progress: bool = option(True, "no progress bar", flag="--no-progress")
    demo: bool = True  # on the demo corpus: print [MASK] predictions for its probe sentences before and after

    def validate(self) -> None:
        """Raise `BertforgeError` naming the first bad setting (before anything is written)."""
        check_choices(self)
        a = self
        for name in ("max_steps", "batch_size", "grad_accum", "max_length", "save_every", "keep_checkpoints", "log_every", "vocab_size",
                     "dupe_factor", "max_skipped_steps", "eval_max_instances", "eval_every", "early_stop_patience",
                     "generator_layers"):
            value = getattr(a, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise BertforgeError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        for name in ("max_minutes", "save_every_minutes"):
            value = getattr(a, name)
            if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise BertforgeError(f"--{name.replace('_', '-')} must be a positive number of minutes, got {value!r}")
        if a.max_length < 8:
            raise BertforgeError(f"--max-length {a.max_length} is too short for [CLS] A [SEP] B [SEP]; use at least 8")
        if a.global_rope_theta is not None and not (a.global_rope_theta > 0 and math.isfinite(a.global_rope_theta)):
            raise BertforgeError(f"--global-rope-theta must be a positive number, got {a.global_rope_theta}")
        if not (a.lr > 0 and math.isfinite(a.lr)):
            raise BertforgeError(f"--lr must be a positive number, got {a.lr}")
        if a.mlm_probability is not None and not 0 < a.mlm_probability < 1:
            raise BertforgeError(f"--mlm-probability must be in (0, 1), got {a.mlm_probability}")
        if not (a.rtd_weight > 0 and math.isfinite(a.rtd_weight)):
            raise BertforgeError(f"--rtd-weight must be a positive number, got {a.rtd_weight}")
        if a.objective != AUTO:
            a.refuse_foreign_settings(objective_kind(a.objective), f", not --objective {a.objective}")
        if a.resume and a.overwrite:
            raise BertforgeError("--resume and --overwrite contradict each other; choose one")
        refuse_contradictions(self.chosen())
        a.validate_schedule()
        a.validate_evaluation()
        for path in [*a.corpus, *a.eval_corpus]:
            if not Path(path).exists():
                raise BertforgeError(f"corpus path {path} does not exist")
        if a.init_from is not None and not (model_path(a.init_from) / "config.json").is_file():
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
        if a.decay not in (*STABLE_DECAYS, "auto") and "decay_ratio" in a.chosen():
            raise BertforgeError(f"--decay-ratio applies to --decay wsd or wsd-sqrt only, not --decay {a.decay}")

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

    def warmup(self, steps: int | None = None) -> tuple[int, str | None]:
        """The warmup steps a run of `steps` steps (default --max-steps; a time budget decides its own) uses, and a
        warning when they differ from those asked for: a warmup at or beyond the run's length would never let the
        learning rate reach its peak, so it is cut to a tenth of the run."""
        a = self
        steps = a.max_steps if steps is None else steps
        asked = round(a.warmup_ratio * steps) if a.warmup_ratio is not None else a.warmup_steps
        if asked < steps:
            return asked, None
        used = steps // 10
        what = f"--warmup-ratio {a.warmup_ratio}" if a.warmup_ratio is not None else f"--warmup-steps {a.warmup_steps}"
        return used, (f"{what} is not shorter than --max-steps {steps}: the learning rate would never reach its "
                      f"peak; warming up over {used} steps (a tenth of the run) instead")

    @property
    def first_length(self) -> int:
        """The run's length in steps as it starts: --max-steps, or, with a time budget, a provisional length until
        the budget has timed the first steps (`time_budget.RunLength`)."""
        return PROVISIONAL_STEPS if self.max_minutes is not None else self.max_steps

    def for_family(self, config: BertConfig) -> PretrainArgs:
        """These settings with the family's recipe filled in for "auto" (objective, masking and its rate, AdamW's
        beta2, the decay, the packing of MLM-only rows) and `nsp` following the objective; a setting the family contradicts is refused (RoBERTa has no sentence
        objective, ALBERT's is sentence order)."""
        a, member = self, config.family
        recipe = family_recipe(a.config, member)  # `Family.recipe` (RoBERTa's beta2, ALBERT's n-gram masking, ...) or a ladder's
        objective = a.objective
        if objective == AUTO:  # the family's: its recipe's, else its sentence head's
            sentence = {"NSP": "nsp", "SOP": "sop", None: "mlm"}[member.sentence_head]
            objective = (recipe.objective or sentence) if a.nsp else "mlm"
        kind = objective_kind(objective)
        if a.objective != AUTO and not a.nsp and kind.sentence is not None:
            raise BertforgeError(f"--no-nsp and --objective {objective} contradict each other; choose one")
        model = f"--config {a.config}" if a.init_from is None else f"--init-from {a.init_from}"
        refusal = kind.refusal(member)
        if refusal is not None:
            raise BertforgeError(f"--objective {objective} contradicts {model}: {refusal}")
        a.refuse_foreign_settings(kind, f"; {model} pretrains with {objective}")
        if kind.check is not None:
            kind.check(config, a)
        masking = recipe.masking if a.masking == "auto" else a.masking
        beta2 = recipe.adam_beta2 if a.adam_beta2 is None else a.adam_beta2
        rate = recipe.mlm_probability if a.mlm_probability is None else a.mlm_probability
        decay = recipe.decay if a.decay == "auto" else a.decay
        packing = (recipe.packing if kind.packs_documents else "stream") if a.packing == "auto" else a.packing
        if decay not in STABLE_DECAYS and "decay_ratio" in a.chosen():
            raise BertforgeError(f"--decay-ratio applies to --decay wsd or wsd-sqrt only, not {member.name}'s "
                                 f"--decay {decay}")
        if packing == "documents" and not kind.packs_documents:
            raise BertforgeError(f"--packing documents needs MLM alone, not --objective {objective}")
        return dataclasses.replace(a, objective=objective, nsp=kind.next_sentence, masking=masking, adam_beta2=beta2,
                                   mlm_probability=rate, decay=decay, packing=packing)

    @property
    def vocabulary_source(self) -> str | None:
        """The checkpoint whose config.json and tokenizer decide the vocabulary (--init-from), or None: the model's
        vocabulary is the tokenizer's."""
        return self.init_from

    @property
    def objective_kind(self) -> ObjectiveKind:
        """The objective's registry entry (`registry.OBJECTIVES`), which the run builds and its data follow; of
        settings resolved by `for_family` ("auto" has none)."""
        return objective_kind(self.objective)

    def refuse_foreign_settings(self, kind: ObjectiveKind, why: str) -> None:
        """Refuse a setting that another objective reads alone (`ObjectiveKind.settings`: --generator-layers, RTD's)
        given with `kind`; `why` ends the message."""
        for name in sorted(own_settings() - set(kind.settings)):
            if getattr(self, name) is not None:
                raise BertforgeError(f"--{name.replace('_', '-')} applies to --objective "
                                     f"{' or '.join(owners(name))} only{why}")

    @property
    def sentence_objective(self) -> str | None:
        """The data's sentence objective: "nsp", "sop" or None, the objective's (`ObjectiveKind.sentence`; settings
        not resolved by `for_family` yet read "auto" as BERT's: NSP unless --no-nsp)."""
        if self.objective == AUTO:
            return "nsp" if self.nsp else None
        return self.objective_kind.sentence

    @property
    def mask_replacement(self) -> tuple[float, float]:
        """Of the masked tokens, the shares that become [MASK] and a random token, the objective's
        (`ObjectiveKind.mask_replacement`): BERT's 80 % and 10 %, or all [MASK] for replaced-token detection (its
        generator's samples replace them)."""
        return BERT_REPLACEMENT if self.objective == AUTO else self.objective_kind.mask_replacement

    @property
    def masking_rate(self) -> float:
        """The share of tokens masked (unresolved None reads as the default recipe's)."""
        return Recipe().mlm_probability if self.mlm_probability is None else self.mlm_probability

    @property
    def packing_kind(self) -> str:
        """How MLM-only rows are filled: "stream" or "documents" ("auto" unresolved reads as the default's)."""
        return Recipe().packing if self.packing == "auto" else self.packing

    @property
    def masking_kind(self) -> str:
        """The data's masking: "token" or "ngram" ("auto" unresolved reads as BERT's, token)."""
        return "token" if self.masking == "auto" else self.masking

    def model_config(self) -> BertConfig:
        """The preset, config.json or --init-from checkpoint's config, checked against max_length (a vocabulary trained
        here is applied later)."""
        a = self
        if a.init_from is not None:
            config = BertConfig.from_pretrained(a.init_from)
        elif Path(a.config).exists():
            config = BertConfig.from_pretrained(a.config)
        elif a.config.rpartition("-")[2] in PRESETS or "-" in a.config:  # FAMILY-SIZE: the preset names bad ones
            config = BertConfig.preset(a.config)  # a size, or FAMILY-SIZE; an unknown family is refused there
        else:
            raise BertforgeError(f"--config {a.config!r} is neither a preset ({', '.join(PRESETS)}, or FAMILY-SIZE such "
                                 "as roberta-tiny) nor a config.json path")
        changes = a.context_overrides(config)
        if changes:
            config = BertConfig.from_dict({**config.to_dict(), **changes}, source=a.init_from or a.config)
        config.check_sequence_length(a.max_length, "--max-length")
        return config

    def context_overrides(self, config: BertConfig) -> dict[str, Any]:
        """The config.json keys this run changes in `config` (the checkpoint's, a preset's or a file's): the global
        rotary θ (--global-rope-theta), and for rotary positions, which have no table to outgrow,
        max_position_embeddings raised to --max-length. `load_pretrained` applies the same to --init-from."""
        a, family, changes = self, config.family, {}
        if a.global_rope_theta is not None:
            if family.global_theta_keys is None:
                model = f"--init-from {a.init_from}" if a.init_from else f"--config {a.config}"
                raise BertforgeError(f"--global-rope-theta: {model} ({family.name}) has no rotary positions")
            changes.update(family.global_theta_keys(config, a.global_rope_theta))
        if family.global_theta_keys is not None and a.max_length > config.max_position_embeddings:
            changes["max_position_embeddings"] = a.max_length
        return changes


def refuse_contradictions(chosen: set[str]) -> None:
    """Refuse, in one line, settings given together with one that decides them (`CONTRADICTIONS`). `chosen`: the
    settings given (by the command line) or set off their defaults (`PretrainArgs.chosen`)."""
    from ..core.options import flag_of

    flags = {f.name: flag_of(f) for f in dataclasses.fields(PretrainArgs) if "cli" in f.metadata}
    for setting, decided, why in CONTRADICTIONS:
        clash = [flags[name] for name in decided if name in chosen]
        if setting in chosen and clash:
            raise BertforgeError(f"{flags[setting]} contradicts {', '.join(clash)} ({why}); leave out {' and '.join(clash)}")


def decided_by(chosen: set[str]) -> set[str]:
    """The settings that `chosen` ones decide (`CONTRADICTIONS`): a base such as the demo's must not set them."""
    return {name for setting, decided, _ in CONTRADICTIONS if setting in chosen for name in decided}


def with_recorded_run(settings: dict[str, Any], run_config: str | None, cls: type = PretrainArgs) -> dict[str, Any]:
    """The given `settings` over those of the run they replay: `--run-config`, or with --resume alone the run in
    --out (`run_dir.settings_to_replay`); `settings` as they are when there is none."""
    source = settings_to_replay(run_config, bool(settings.get("resume")), settings.get("out"), PRETRAINING)
    return {**recorded_run(source, settings, cls), **settings} if source else settings


def recorded_run(source: str, settings: dict[str, Any], cls: type = PretrainArgs) -> dict[str, Any]:
    """The base `--run-config` gives a run: the settings a pretraining (or distillation, `cls`) run recorded in its
    run_config.json (`source`: the file or the run's directory) that differ from `cls`' defaults, less those that
    contradict a given setting (the given one wins: `--max-steps` over a recorded time budget)."""
    recorded = recorded_settings(source, PRETRAINING)
    try:
        saved = cls(**recorded)
    except TypeError as err:
        command = cls.__name__.removesuffix("Args").lower()  # pretrain, distill
        raise BertforgeError(f"--run-config {source}: not the settings of a `bertforge {command}` run ({err})") from None
    given = set(settings)
    clashing = decided_by(given) | {setting for setting, decided, _ in CONTRADICTIONS if given & set(decided)}
    return {name: getattr(saved, name) for name in saved.chosen() if name not in clashing}


def run_settings(settings: dict[str, Any]) -> PretrainArgs:
    """The run's settings from those given (on the command line, or as `pretrain(**settings)`'s keywords), the one
    place defaults are resolved: with no corpus, over the demo's defaults (`DEMO`, less those a given setting
    decides: --init-from's vocabulary, --warmup-ratio's warmup); with one, over `PretrainArgs`' own. Settings that
    contradict each other are refused in one line, before anything is written."""
    refuse_contradictions(set(settings))
    base = {} if settings.get("corpus") else {k: v for k, v in DEMO.items() if k not in decided_by(set(settings))}
    try:
        return PretrainArgs(**{**base, **settings})
    except TypeError as err:
        raise BertforgeError(f"bad pretraining settings: {err}") from None
