"""Distillation into a student of half the teacher's layers, as Sanh et al. (2019) made DistilBERT from BERT.

A BERT-shaped teacher (BERT, RoBERTa, XLM-R, DistilBERT) gives a DistilBERT: the teacher's encoder with half its
layers, no token types and no pooler (`model_type: distilbert`), initialised from the teacher: its embeddings (the
first token-type row folded into the position rows, so that the initial student computes what the teacher's lower
half computes on single segments), every other layer (student layer i from teacher layer 2i) and the MLM head. A
DeBERTa-v2/v3 or ModernBERT teacher gives a student of its own family (DistilBERT has neither relative attention nor
rotary positions): the teacher's config with every other layer (`Family.keep_layers`: a ModernBERT layer keeps its
global or local attention), every other weight copied as it is. ALBERT (shared layers) is refused. The student is
trained on the teacher's corpus with MLM and dynamic masking, on three losses, weights configurable:

* soft-target cross-entropy against the teacher at temperature T: T^2 · KL(softmax(t/T) || softmax(s/T)) over the
  masked positions (`--alpha-ce`, 5 in the paper's code);
* the MLM loss against the true tokens (`--alpha-mlm`, 2);
* cosine alignment of the last hidden states, 1 - cos(student, teacher) over the real tokens (`--alpha-cos`, 1).

The teacher runs without gradients, in eval mode, on every rank. A distillation run is a pretraining run
(`Pretrainer`) whose settings (`DistillArgs`) name the objective entry `DISTILLATION`: it loads the teacher and
builds the student from it and the three losses on it, in one function (`distillation`), so nothing depends on the
order the trainer builds things in. Everything else is pretraining's: streaming, exact resume, DDP/FSDP, metrics,
held-out evaluation, atomic checkpoints, and `OUT/model/` in Hugging Face layout (`DistilBertForMaskedLM`, or the
teacher's family's ForMaskedLM) with the teacher's tokenizer. `DistillArgs` extends `PretrainArgs` (the command line
and run_config.json are pretraining's settings and the teacher's): the student's config is the teacher's
(`model_config`), its vocabulary the teacher's (`vocabulary_source`), and `for_family` fixes MLM rows packed as a
stream, which the pretrainer then reads as any run's.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..model.auto import AutoModelForMaskedLM
from ..model.config import BertConfig
from ..core.errors import BertforgeError
from ..model import BertForMaskedLM, BertPreTrainedModel
from ..core.options import check_choices, option
from .args import PretrainArgs
from .trainer import Pretrainer
from .objectives import MaskedLMObjective, ObjectiveKind, mlm_stats
from .data import model_inputs
from ..training.step import TrainStep
from ..core.hub import model_path
from ..core.system import Runtime

log = logging.getLogger("bertforge")

#: pretraining settings that the teacher decides (its config and tokenizer) or that distillation fixes (MLM only)
TEACHER_DECIDES = ("config", "tokenizer", "vocab_size", "tokenizer_sample_mb", "lowercase", "init_from", "objective", "nsp")


@dataclass(frozen=True)
class DistillArgs(PretrainArgs):
    """`PretrainArgs` (the training, data and output settings) and the teacher, the student's depth and the loss."""

    teacher: str | None = option(None, "the teacher: a checkpoint directory with an MLM head and its tokenizer", metavar="DIR")
    student_layers: int | None = option(None, "layers of the student (default: half the teacher's)", metavar="N")
    temperature: float = option(2.0, "softmax temperature of the soft targets")
    alpha_ce: float = option(5.0, "weight of the soft-target cross-entropy against the teacher")
    alpha_mlm: float = option(2.0, "weight of the MLM loss against the true tokens")
    alpha_cos: float = option(1.0, "weight of the cosine loss between the last hidden states")

    def validate(self) -> None:
        check_choices(self)
        if not self.teacher:
            raise BertforgeError("--teacher is required: the checkpoint directory to distil")
        if not (model_path(self.teacher) / "config.json").is_file():
            raise BertforgeError(f"--teacher {self.teacher}: no config.json there (a checkpoint directory is expected)")
        if not self.corpus:
            raise BertforgeError("--corpus is required: the text the student learns on")
        if not self.temperature > 0:
            raise BertforgeError(f"--temperature must be positive, got {self.temperature}")
        weights = (self.alpha_ce, self.alpha_mlm, self.alpha_cos)
        if min(weights) < 0 or sum(weights) <= 0:
            raise BertforgeError(f"--alpha-ce/--alpha-mlm/--alpha-cos must be >= 0 and not all 0, got {weights}")
        if self.student_layers is not None and self.student_layers < 1:
            raise BertforgeError(f"--student-layers must be a positive integer, got {self.student_layers}")
        super().validate()

    def model_config(self) -> BertConfig:
        """The student's config: the teacher's, as a DistilBERT of `student_layers` (half the teacher's) layers."""
        teacher = BertConfig.from_pretrained(self.teacher)  # type: ignore[arg-type]
        # a DistilBERT student (BERT's, RoBERTa's) has no E -> H projection; ELECTRA's student of its own family has
        factorised = teacher.embedding_dim != teacher.hidden_size and teacher.family.student is not None
        if factorised or teacher.num_hidden_groups:
            raise BertforgeError(f"--teacher {self.teacher}: a {teacher.family.name} teacher (factorised embeddings or "
                                 "shared layers) cannot be copied into a DistilBERT; use a BERT- or RoBERTa-shaped one")
        layers = self.student_layers or max(1, teacher.num_hidden_layers // 2)
        if layers > teacher.num_hidden_layers:
            raise BertforgeError(f"--student-layers {layers} is more than the teacher's {teacher.num_hidden_layers}")
        # BERT's and RoBERTa's: a DistilBERT; relative attention or rotary positions: a student of the teacher's family
        kept = teacher_layers(layers, teacher.num_hidden_layers)
        student = dataclasses.replace(teacher.family.student_config(teacher, kept), architectures=None)
        if self.max_length > student.max_sequence_length:
            raise BertforgeError(f"--max-length {self.max_length} is above the teacher's {student.max_sequence_length} positions")
        return student

    def __post_init__(self) -> None:
        if self.tokenizer is None:  # the student speaks the teacher's vocabulary (set once, while it is built)
            object.__setattr__(self, "tokenizer", self.teacher)

    @property
    def vocabulary_source(self) -> str | None:
        return self.teacher

    @property
    def objective_kind(self) -> ObjectiveKind:
        """Distillation's entry, whatever `objective` reads (MLM's data: `for_family`)."""
        return DISTILLATION

    def for_family(self, config: BertConfig) -> DistillArgs:
        """Pretraining's recipe for the student's family, with MLM alone (DistilBERT dropped NSP; the losses are
        distillation's) and rows packed as a stream: the cosine loss needs every token's last hidden state, which
        rows of several documents attending within themselves (`--packing documents`) do not give."""
        if self.packing == "documents":
            raise BertforgeError("distill: --packing documents gives no per-token hidden states, which the cosine "
                                 "loss needs; use --packing stream (the default for distillation)")
        packing = "stream" if self.packing == "auto" else self.packing
        mlm = dataclasses.replace(self, objective="mlm", nsp=False, packing=packing)
        return PretrainArgs.for_family(mlm, config)  # type: ignore[return-value]


def teacher_layers(student_layers: int, teacher_layers_: int) -> list[int]:
    """The teacher layer each student layer starts from: every other one (0, 2, 4, ...), as DistilBERT did; for a
    student of more than half the teacher's depth, spread evenly."""
    if 2 * student_layers <= teacher_layers_:
        return [2 * i for i in range(student_layers)]
    return [round(i * (teacher_layers_ - 1) / max(1, student_layers - 1)) for i in range(student_layers)]


@torch.no_grad()
def init_from_teacher(student: BertForMaskedLM, teacher: BertPreTrainedModel) -> None:
    """Copy the teacher's embeddings (for a DistilBERT student: the first token-type row folded into the positions,
    RoBERTa's offset skipped), every other layer and the MLM head into `student`; a student of the teacher's own
    family gets every other weight as it is (DeBERTa's relative table, ModernBERT's final norm)."""
    layers = teacher_layers(student.config.num_hidden_layers, teacher.config.num_hidden_layers)
    teacher_blocks = teacher.blocks()
    if student.config.family is not teacher.config.family:  # a DistilBERT student
        student.base_model.embeddings.load_from(teacher.base_model.embeddings, teacher.config.position_offset)
        for block, index in zip(student.blocks(), layers):
            block.load_state_dict(teacher_blocks[index].state_dict())
        student.mlm_head().load_state_dict(teacher.mlm_head().state_dict())  # type: ignore[operator, misc]
        return
    names = {id(m): name for name, m in teacher.named_modules()}
    names.update({id(m): name for name, m in student.named_modules()})
    renames = [(names[id(block)] + ".", names[id(teacher_blocks[index])] + ".")
               for block, index in zip(student.blocks(), layers)]
    source = teacher.state_dict()
    state = {}
    for key in student.state_dict():
        mine = next((theirs + key[len(own):] for own, theirs in renames if key.startswith(own)), key)
        state[key] = source[mine]
    student.load_state_dict(state)


def load_teacher(path: str, device: torch.device) -> BertPreTrainedModel:
    teacher = AutoModelForMaskedLM.from_pretrained(path, quiet=True)
    missing = [k for k in teacher.loading_info.missing_keys if k.startswith("cls.")]
    if missing:
        raise BertforgeError(f"--teacher {path}: no MLM head ({missing[0]} is missing); distillation learns from its "
                             "predictions, so the teacher must be a masked-language model")
    return teacher.to(device).eval().requires_grad_(False)


def distillation(config: BertConfig, args: DistillArgs, resuming: bool,
                 rt: Runtime) -> tuple[BertForMaskedLM, Distillation]:
    """The student (of `config`, the student's; initialised from the teacher unless resuming, whose checkpoint
    brings its weights) and the three losses against the teacher, which both are built from."""
    teacher = load_teacher(args.teacher, rt.device)  # type: ignore[arg-type]
    torch.manual_seed(args.seed)
    student = BertForMaskedLM(config)
    if not resuming:
        init_from_teacher(student, teacher)
    if rt.is_main:
        kept = teacher_layers(config.num_hidden_layers, teacher.config.num_hidden_layers)
        log.info("student: %d layers initialised from the teacher's layers %s (%.1f M parameters; teacher %.1f M)",
                 config.num_hidden_layers, kept, student.num_parameters() / 1e6, teacher.num_parameters() / 1e6)
    return student, Distillation(teacher, args.temperature, args.alpha_ce, args.alpha_mlm, args.alpha_cos)


class Distillation(MaskedLMObjective):
    """Distillation's objective: the teacher's soft targets at temperature T, the MLM loss and the cosine
    alignment of the last hidden states, weighted (`--alpha-ce`, `--alpha-mlm`, `--alpha-cos`)."""

    def __init__(self, teacher: BertPreTrainedModel, temperature: float, alpha_ce: float, alpha_mlm: float,
                 alpha_cos: float) -> None:
        super().__init__(None)
        self.teacher, self.temperature = teacher, temperature
        self.alpha_ce, self.alpha_mlm, self.alpha_cos = alpha_ce, alpha_mlm, alpha_cos

    def counts(self, batch: dict[str, torch.Tensor]) -> dict[str, int]:
        counts = super().counts(batch)
        return {**counts, "ce": counts["mlm"], "cos": int(batch["attention_mask"].sum())}

    def forward_backward(self, model: torch.nn.Module, stepper: TrainStep, batch: dict[str, torch.Tensor],
                         weights: dict[str, float]) -> dict[str, torch.Tensor]:
        inputs = model_inputs(batch)
        with stepper.autocast():
            with torch.no_grad():
                teacher = self.teacher(**inputs, output_hidden_states=True)
            out = model(**inputs, output_hidden_states=True)
        s_logits, t_logits = out.logits.float(), teacher.logits.float()  # [N, V]: the masked positions, same order
        t = self.temperature
        ce = (F.kl_div(F.log_softmax(s_logits / t, -1), F.softmax(t_logits / t, -1), reduction="batchmean") * t * t
              if s_logits.shape[0] else s_logits.sum())
        real = batch["attention_mask"].bool()
        cos = (1 - F.cosine_similarity(out.hidden_states[-1][real].float(), teacher.hidden_states[-1][real].float(),
                                       dim=-1)).mean()
        loss = stepper.accumulate({"ce": self.alpha_ce * ce, "mlm": self.alpha_mlm * out.loss,
                                   "cos": self.alpha_cos * cos}, weights)
        stats = mlm_stats(loss, out.loss, out.logits, batch, weights)
        stats["ce_loss"] = ce.detach() * weights.get("ce", 0.0)
        stats["cos_loss"] = cos.detach() * weights.get("cos", 0.0)
        return stats

    @staticmethod
    def masked_logits(out: Any) -> torch.Tensor:
        return out.logits


#: distillation: MLM rows packed as a stream (the cosine loss needs every token's last hidden state), the student
#: and the teacher's three losses; named by `DistillArgs.objective_kind`, not by `--objective`
DISTILLATION = ObjectiveKind("distillation", distillation)
#: a distillation run is a pretraining run whose settings are a `DistillArgs`
Distiller = Pretrainer


def distill(args: DistillArgs | None = None, **kwargs: Any) -> Path:
    """Distil `args.teacher` into a DistilBERT on `args.corpus`; returns the directory of the student."""
    args = args or DistillArgs(**kwargs)
    trainer = Pretrainer(args)
    final = trainer.run()
    trainer.finish()
    return final


__all__ = ["DISTILLATION", "DistillArgs", "Distillation", "Distiller", "distill", "distillation", "init_from_teacher",
           "teacher_layers"]
