"""The training loop of sentence embeddings: fine-tuning's loop (`finetune.trainer.Finetuning`: the shared
`TrainStep`, AdamW with warm-up and decay, evaluation, best-weights keeping, early stopping, the metrics log) with
this trainer's batches and its `forward_backward`.

A step is one batch of examples (their anchors, positives, negatives: every text of the batch goes through the model
as one packed batch) and one loss over the whole batch: the in-batch negatives of MNRL couple every example with
every other, so a batch cannot be split into independent micro-batches. `--mini-batch-size` splits it anyway with
gradient caching (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup"):

1. embed the batch mini-batch by mini-batch without grad (no activations kept), saving the random state each
   mini-batch started from;
2. compute the loss on those embeddings and its gradient with respect to them;
3. re-run each mini-batch with grad from its saved random state (the same dropout masks, so the same embeddings)
   and backpropagate its rows of that gradient (`TrainStep.backward_from`).

The parameter gradient is the one of the whole batch at once (tests check it to 1e-6) while only one mini-batch's
activations are alive at a time, for one extra forward pass.

A sparse encoder (`--sparse splade`) trains the same way on its SPLADE vectors, its loss a `losses.Splade` (the
regularizers' weights of the step about to be taken; their terms and the vectors' non-zero counts go to the
metrics rows, averaged over the steps a row spans).

Under `torchrun` each rank embeds its share of each batch (`parallel.shares`) through the DDP-wrapped model and the
loss sees the whole batch (`parallel.gather_columns`; see `embeddings_train/parallel.py`); with gradient caching the
mini-batches but the last re-run under DDP's `no_sync`, so that gradients are all-reduced once a step.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..core.errors import BertforgeError
from ..core.system import Runtime
from ..finetune.trainer import Finetuning
from ..training.parallel import wrap_model
from .data import PairData
from .encoder import SentenceEncoder, rng_state, set_rng_state
from .parallel import gather_columns, shares
from .losses import Loss, Splade

log = logging.getLogger("bertforge")


@dataclass
class EncodedPairs:
    """A file's examples as token ids: each distinct text tokenized once (`tokens`), `columns[c][i]` the index in
    `tokens` of example i's text in column c, `labels` the scores (scored pairs) on cosine's scale."""

    tokens: list[list[int]]
    columns: list[list[int]]
    labels: list[float] | None

    def __len__(self) -> int:
        return len(self.columns[0])

    def texts_of(self, example: int) -> set[int]:
        return {column[example] for column in self.columns}


def encode_pairs(tokenizer: Any, data: PairData, max_length: int, labels: list[float] | None) -> EncodedPairs:
    """Tokenize every distinct text of `data` once, truncated to `max_length` tokens ([CLS] and [SEP] included)."""
    index: dict[str, int] = {}
    for column in data.texts:
        for text in column:
            index.setdefault(text, len(index))
    texts = list(index)
    tokens = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    full = tokenizer(texts)["input_ids"] if texts else []
    cut = sum(1 for a, b in zip(tokens, full) if len(a) < len(b))
    if cut:
        log.info("%s: %d of %d distinct texts cut to %d tokens", data.path, cut, len(texts), max_length)
    return EncodedPairs(tokens, [[index[t] for t in column] for column in data.texts], labels)


def distinct_batches(order: Sequence[int], keys: Sequence[set[int]], batch_size: int) -> list[list[int]]:
    """Batches of the examples in `order` in which no text occurs twice (sentence-transformers' "no duplicates"
    sampling): an in-batch negative equal to an anchor's positive would be a false negative. An example that would
    repeat a text waits for the next batch; batches keep the order otherwise.

    That is: each batch takes, in order, the examples not taken yet that fit it (the batches sentence-transformers'
    `NoDuplicatesBatchSampler` makes), which is the same as putting each example, in order, into the first batch
    that is not full and holds none of its texts. Done that way, with the full batches skipped (`open_from`) and
    for each text the first open batch that may lack it (`frontier`: every open batch before it holds the text),
    the cost grows with the rows (20,000 rows of 10 distinct anchors, batches of 32: 5.8 s before, see
    tests/embeddings_train/test_trainer.py)."""
    batches: list[list[int]] = []
    seen: list[set[int]] = []  # the texts of each batch
    after: list[int] = []  # after[b] == b while batch b is open; a full batch points further on
    frontier: dict[int, int] = {}

    def open_from(b: int) -> int:
        """The first open batch at or after b (len(batches): a new one)."""
        root = b
        while root < len(after) and after[root] != root:
            root = after[root]
        while b < len(after) and after[b] != b:  # path compression
            after[b], b = root, after[b]
        return root

    def first_without(b: int, texts: set[int]) -> int:
        b = open_from(b)
        while b < len(batches) and not seen[b].isdisjoint(texts):
            b = open_from(b + 1)
        return b

    for example in order:
        texts = keys[example]
        b = first_without(max((frontier.get(t, 0) for t in texts), default=0), texts)
        if b == len(batches):
            batches.append([])
            seen.append(set())
            after.append(b)
        batches[b].append(example)
        seen[b].update(texts)
        if len(batches[b]) == batch_size:
            after[b] = b + 1
        for t in texts:
            frontier[t] = first_without(frontier.get(t, 0), {t})
    return batches


@dataclass
class TextBatch:
    """One step's texts, column after column (anchors, positives, negatives), and the scores of scored pairs."""

    ids: list[list[int]]
    columns: int
    labels: Tensor | None  # of the whole batch (every rank's share)
    sizes: list[int] | None = None  # under torchrun: the examples of each rank's share; `ids` holds this rank's

    def split(self, embeddings: Tensor) -> list[Tensor]:
        """[columns * B, H] → one [B, H] tensor per column."""
        return list(embeddings.chunk(self.columns))


class EmbeddingTraining(Finetuning):
    """A `Finetuning` run whose examples are `EncodedPairs` and whose loss is one of `losses.make_loss`."""

    what, rows = "train-embeddings", "examples"
    wraps_own_module = True  # the encoder (model + pooling) is what DDP wraps

    def __init__(self, model, data: EncodedPairs, evaluate, cfg, main_metric: str | None, loss: Loss, pooling: str,
                 device: torch.device, rt: Runtime | None = None) -> None:
        self.data, self.loss, self.pooling = data, loss, pooling
        self.in_batch_negatives = data.labels is None
        if getattr(model, "pooler", None) is not None:  # never used by sentence embeddings (kept for transformers):
            model.pooler.requires_grad_(False)  # not trained, so that DDP finds a gradient for every trained weight
        super().__init__(model, data, evaluate, cfg, main_metric or "", False, 0, device, rt)
        self.encoder = wrap_model(SentenceEncoder(model, pooling), self.rt)  # DDP under torchrun
        self.train_model = self.encoder  # the module DDP wraps (what `TrainStep.run` would call no_sync on)
        self.has_dev = main_metric is not None
        self.baseline: dict[str, Any] | None = None  # the dev metrics before training
        self.sparse_rows: list[dict[str, float]] = []  # a sparse encoder's stats of each step since the last row

    def plan_steps(self) -> list[int]:
        """Batches without repeated texts can be more than len / batch_size (an example waits for a later batch when
        its text is taken): every epoch's batches are drawn now, and the schedule (and the plan line) spans the steps
        there really are. In-batch negatives need two distinct examples in a batch: pairs that can never be batched
        so (one pair, pairs all the same, --batch-size 1) are refused, as their loss would be exactly 0."""
        self.plan = [self.draw_batches() for _ in range(self.cfg.epochs)]
        sizes = [len(b) for batches in self.plan for b in batches]
        if self.in_batch_negatives and len(self.data.columns) == 2 and max(sizes) < 2:
            why = ("--batch-size 1" if self.cfg.batch_size == 1 else
                   f"{'its only pair' if len(self.data) == 1 else 'every pair shares a text with every other'}")
            raise BertforgeError(
                f"train-embeddings: every batch holds one pair ({why}), and in-batch negatives (--loss mnrl) need at "
                f"least two distinct pairs per batch: the loss would be exactly 0 and nothing learnt; give more "
                f"distinct pairs, a larger --batch-size, or hard negatives (a third column)"
            )
        if self.in_batch_negatives and len(self.data.columns) == 2 and min(sizes) < 2:
            log.warning("train-embeddings: %d of %d batches hold one pair: with no in-batch negative, their loss is 0 "
                        "and they teach nothing", sum(size < 2 for size in sizes), len(sizes))
        if min(sizes) < self.rt.world_size:
            raise BertforgeError(
                f"train-embeddings: a batch of {min(sizes)} example(s) cannot be shared by {self.rt.world_size} "
                f"processes (each needs at least one); use fewer processes or a --batch-size that leaves no batch that "
                f"small (the batches without repeated texts: see the plan)")
        return [len(batches) for batches in self.plan]

    def epoch_batches(self) -> list[list[int]]:
        return self.plan.pop(0)

    def draw_batches(self) -> list[list[int]]:
        """One epoch's batches: shuffled; for in-batch negatives, no text twice in a batch (`distinct_batches`)."""
        order = torch.randperm(len(self.data), generator=self.generator).tolist()
        if not self.in_batch_negatives:
            return [order[i : i + self.cfg.batch_size] for i in range(0, len(order), self.cfg.batch_size)]
        keys = [self.data.texts_of(i) for i in range(len(self.data))]
        return distinct_batches(order, keys, self.cfg.batch_size)

    def make_batch(self, indices: list[int]) -> TextBatch:
        """This rank's share of a batch (all of it in one process): its texts, and the labels of the whole batch."""
        labels = None if self.data.labels is None else torch.tensor([self.data.labels[i] for i in indices])
        sizes = shares(len(indices), self.rt.world_size) if self.rt.distributed else None
        if sizes is not None:
            start = sum(sizes[: self.rt.rank])
            indices = indices[start : start + sizes[self.rt.rank]]
        ids = [self.data.tokens[column[i]] for column in self.data.columns for i in indices]
        return TextBatch(ids, len(self.data.columns), labels, sizes)

    def counts(self, batch: TextBatch) -> dict[str, int]:
        return {"loss": len(batch.ids) // batch.columns}  # examples: every loss is a mean over them

    def embed(self, ids: list[list[int]]) -> Tensor:
        with self.stepper.autocast():
            return self.encoder(ids, self.device).float()  # [n, H]

    def batch_loss(self, batch: TextBatch, embeddings: Tensor) -> Tensor:
        """The loss of the whole batch; under torchrun from every rank's embeddings, gathered (`embeddings`: this
        rank's share)."""
        labels = batch.labels.to(self.device) if batch.labels is not None else None
        if batch.sizes is None:
            return self.loss(batch.split(embeddings), labels)
        return self.loss(gather_columns(embeddings, batch.columns, batch.sizes, self.rt.rank), labels)

    def forward_backward(self, batch: TextBatch, weights: dict[str, float]) -> dict[str, Tensor]:  # type: ignore[override]
        mini = self.cfg.mini_batch_size
        texts = len(batch.ids) if batch.sizes is None else max(batch.sizes) * batch.columns  # every rank alike
        if isinstance(self.loss, Splade):
            self.loss.step, self.loss.total_steps = self.stepper.step, self.total_steps
        if mini is None or mini >= texts:
            loss = self.stepper.accumulate({"loss": self.batch_loss(batch, self.embed(batch.ids))}, weights)
        else:
            loss = self.cached_forward_backward(batch, weights["loss"], mini)
        return {"loss": loss, **self.sparse_stats()}

    def sparse_stats(self) -> dict[str, Tensor]:
        """A sparse encoder's last loss terms and non-zero counts, divided by the processes (the step sums every
        rank's stats, and every rank's loss saw the whole batch); {} for a dense one."""
        if not isinstance(self.loss, Splade):
            return {}
        return {k: v / self.rt.world_size for k, v in {**self.loss.terms, **self.loss.nonzero}.items()}

    def record_step(self, outcome: Any) -> None:
        super().record_step(outcome)
        stats = {k: v.item() for k, v in outcome.totals.items() if k != "loss"}
        if stats:
            self.sparse_rows.append(stats)

    def log_row(self, on_grid: bool, seconds: float) -> dict[str, Any]:
        row = super().log_row(on_grid, seconds)
        rows, self.sparse_rows = self.sparse_rows, []
        if rows:
            row.update({k: sum(r[k] for r in rows) / len(rows) for k in rows[0]})
            if isinstance(self.loss, Splade):
                row["query_regularizer_weight"], row["document_regularizer_weight"] = self.loss.weights()
        return row

    def cached_forward_backward(self, batch: TextBatch, weight: float, mini: int) -> Tensor:
        """Gradient caching (see the module docstring); returns this batch's share of the step's loss."""
        chunks = [batch.ids[i : i + mini] for i in range(0, len(batch.ids), mini)]
        states, cached = [], []
        with torch.no_grad():
            for chunk in chunks:
                states.append(rng_state(self.device))
                cached.append(self.embed(chunk))
        embeddings = torch.cat(cached).requires_grad_()  # [n, H], a leaf: the loss's graph ends here
        loss = self.batch_loss(batch, embeddings)
        # weighted before the gradient: under torchrun the gather's backward sums every rank's weighted loss
        (grad,) = self.stepper.output_gradients(loss * weight, [embeddings])
        no_sync = getattr(self.encoder, "no_sync", contextlib.nullcontext)  # DDP: all-reduce after the last only
        for i, (chunk, state, rows) in enumerate(zip(chunks, states, grad.split(mini))):
            set_rng_state(state, self.device)
            with no_sync() if i < len(chunks) - 1 else contextlib.nullcontext():
                self.stepper.backward_from([self.embed(chunk)], [rows])
        return loss.detach() * weight

    def run(self):
        if self.has_dev and self.baseline is None:  # the starting point, for comparison (not a candidate for the
            self.baseline = self.evaluate()  # best weights); a resumed run has it from its checkpoint
            self.record({"type": "eval", "step": 0, "epoch": 0.0, **self.baseline})
        return super().run()

    def own_counters(self) -> dict[str, Any]:
        return {"baseline": self.baseline}

    def restore(self, loaded) -> None:
        super().restore(loaded)
        baseline = loaded.trainer.get("baseline")
        if baseline is not None and not isinstance(baseline, dict):
            raise ValueError(f"{loaded.path}: the dev metrics before training are not a JSON object")
        self.baseline = baseline

    def run_evaluation(self, epoch: float) -> bool:
        return super().run_evaluation(epoch) if self.has_dev else False
