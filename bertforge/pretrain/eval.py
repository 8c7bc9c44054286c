"""Held-out evaluation of a pretraining run: a fixed set of masked sequences, the MLM loss, perplexity and accuracy
on it (and NSP accuracy with next-sentence prediction), the best evaluation so far and early stopping.

The set is built once, when the run starts, from `--eval-corpus` or from the documents `--eval-fraction` holds out
of the corpus: up to `--eval-max-instances` sequences made and masked exactly as the training data is, but with a
seed of their own (`EVAL_SEED`, not `--seed`), so every evaluation of a run, of its resumption, and of another
run with other settings on the same text and tokenizer, sees the same sequences with the same masks. Building it
reads its own streams and generators and evaluation runs the model in eval mode (no dropout): the training RNGs
are never touched, so a run trains the same weights with or without evaluation.

Every rank builds the whole set; rank r evaluates batches r, r + W, ...; the sums (loss, correct predictions,
targets) are all-reduced in float64, so any number of processes reports the same numbers (to float rounding).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..core.constants import IGNORE_INDEX
from ..core.errors import BertforgeError
from .data import document_split, model_inputs, pretraining_stream
from .objectives import MaskedLMObjective
from ..core.system import Runtime

if TYPE_CHECKING:
    from .args import PretrainArgs
    from ..tokenizer import Tokenizer

log = logging.getLogger("bertforge")

EVAL_SEED = 20_231_105  # the evaluation set's instances and masks; fixed, so runs with any --seed compare
STATE_VERSION = 1


def build_eval_set(args: PretrainArgs, corpus: list[str], tokenizer: Tokenizer) -> list[dict[str, torch.Tensor]]:
    """The fixed evaluation batches (`args.batch_size` sequences each) of the run `args` (`PretrainArgs`)."""
    from ..data import Buffers

    a = args
    paths = list(a.eval_corpus) or corpus
    what = "--eval-corpus" if a.eval_corpus else f"the documents --eval-fraction {a.eval_fraction} holds out"
    stream = pretraining_stream(a, paths, tokenizer, 0, 1, a.batch_size, seed=EVAL_SEED, max_epochs=1,
                                buffers=Buffers(shuffle=a.eval_max_instances), split=document_split(a, held_out=True))
    try:
        instances = stream.next_instances(a.eval_max_instances)
    except BertforgeError as err:
        raise BertforgeError(f"{what}: {err}") from None
    finally:
        stream.close()
    if not instances:
        raise BertforgeError(f"{what}: no sequence to evaluate on")
    batches = [stream.collator(instances[i : i + a.batch_size]) for i in range(0, len(instances), a.batch_size)]
    targets = sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in batches)
    log.info("held-out evaluation: %d sequences, %d masked tokens (%s)", len(instances), targets, what)
    return batches


class HeldOutEvaluation:
    """The evaluation set, when to evaluate, and what the evaluations so far decided: the best eval loss and its
    step, the evaluations since it (against `patience`) and whether the run stopped early. That record is part of
    a checkpoint (`state_dict`), so a resumed run decides as an uninterrupted one."""

    def __init__(self, batches: list[dict[str, torch.Tensor]], every: int, patience: int | None, rt: Runtime,
                 autocast: Callable[[], Any], sharded: bool,
                 sums: Callable[[Any, dict[str, torch.Tensor]], torch.Tensor] = MaskedLMObjective.eval_sums,
                 results: Callable[[torch.Tensor], dict[str, float]] = MaskedLMObjective.eval_results) -> None:
        self.batches, self.every, self.patience = batches, every, patience
        self.sums = sums  # a batch's sums (MLM loss sum, MLM correct, MLM targets, ...): the objective's
        self.results = results  # the metrics of those sums over the set: the objective's
        self.rt, self.autocast, self.sharded = rt, autocast, sharded
        self.best_loss: float | None = None
        self.best_step: int | None = None
        self.since_best = 0  # evaluations in a row without a lower loss than best_loss
        self.stopped = False  # early stopping ended the run

    def due(self, step: int, max_steps: int) -> bool:
        return step % self.every == 0 or step == max_steps

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """The objective's metrics of `model` on the set (`Objective.eval_results`: eval_loss, eval_perplexity,
        eval_mlm_accuracy, ...). Under FSDP every rank runs the same number of forwards (each one a collective); a
        rank with no batch left repeats its first one and discards it. The forwards draw from torch's generators
        (replaced-token detection samples) forked and seeded with EVAL_SEED: the same draws every evaluation, and
        the training RNG untouched."""
        rt, n = self.rt, len(self.batches)
        was_training = model.training
        model.eval()
        sums: Any = 0.0
        # a rank with no batch of its own (DDP, fewer batches than ranks) runs one and discards it: the objective's
        # sums then have their length for the all-reduce
        rounds = math.ceil(n / rt.world_size) if self.sharded else max(1, len(range(rt.rank, n, rt.world_size)))
        with torch.random.fork_rng(devices=[rt.device] if rt.device.type == "cuda" else []):
            torch.manual_seed(EVAL_SEED + rt.rank)
            for i in range(rounds):
                index = rt.rank + i * rt.world_size
                out, batch = self.forward(model, self.batches[index if index < n else 0])
                sums = sums + self.sums(out, batch) * (1.0 if index < n else 0.0)
        model.train(was_training)
        if rt.distributed:
            sums = sums.to(rt.device)
            dist.all_reduce(sums)
            sums = sums.cpu()
        return self.results(sums)

    def forward(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[Any, dict[str, torch.Tensor]]:
        batch = {k: v.to(self.rt.device) for k, v in batch.items()}
        with self.autocast():
            out = model(**model_inputs(batch))
        return out, batch

    def record(self, step: int, loss: float) -> bool:
        """Take an evaluation's loss into the record; True when it is the best so far (strictly lower)."""
        improved = math.isfinite(loss) and (self.best_loss is None or loss < self.best_loss)
        if improved:
            self.best_loss, self.best_step, self.since_best = loss, step, 0
        else:
            self.since_best += 1
            self.stopped = self.patience is not None and self.since_best >= self.patience
        return improved

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "best_loss": self.best_loss, "best_step": self.best_step,
                "since_best": self.since_best, "stopped": self.stopped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise BertforgeError(f"evaluation state {state!r} is not version {STATE_VERSION}")
        self.best_loss, self.best_step = state["best_loss"], state["best_step"]
        self.since_best, self.stopped = int(state["since_best"]), bool(state["stopped"])
