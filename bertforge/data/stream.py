"""``PretrainingStream``: corpus files in, masked batches out, forever, in constant memory, exactly resumable.

    stream = PretrainingStream(paths, tokenize, cls_id=..., sep_id=..., pad_id=..., mask_id=..., vocab_size=...)
    batch = next(stream)          # input_ids, token_type_ids, attention_mask, labels[, next_sentence_label]
    state = stream.state_dict()   # JSON-serialisable
    PretrainingStream(...same arguments...).load_state_dict(state)   # continues with the very same batches

Pipeline: :class:`~bertforge.data.corpus.CorpusReader` (this rank's documents, cycling over epochs) ->
:class:`~bertforge.data.instance_stream.InstanceStream` (BERT NSP pairs, ALBERT SOP pairs or RoBERTa packed sequences,
shuffle buffer) -> :class:`~bertforge.data.masking.MaskingCollator` (pad to the longest in the batch, dynamic
masking: tokens, whole words or n-grams). Each part's docstring has the details.

The recipes: BERT ``sentence_objective="nsp"`` (the default); RoBERTa ``sentence_objective=None``; ModernBERT
``sentence_objective=None, packing="documents"`` (batches then carry ``document_ids``); ALBERT
``sentence_objective="sop", masking="ngram"`` (``max_ngram=3``). With "nsp" or "sop" the batches have
``next_sentence_label`` (for SOP: 0 in order, 1 swapped). ``whole_word_mask=True`` is the older spelling of
``masking="whole_word"`` (with "ngram": n-grams of whole words). ``buffers``
(:class:`~bertforge.data.instance_stream.Buffers`) bounds the document window and the shuffle buffer.

Seeds: instance creation uses (seed, rank, epoch, document number), the shuffle buffer (seed, rank, epoch), the
masking generator (seed, rank); so ranks and epochs all differ, and nothing touches a global RNG.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from bertforge.data.corpus import DEFAULT_CORPUS, CorpusReader, DocumentSplit, PathsLike
from bertforge.data.instance_stream import Buffers, InstanceStream, Tokenize
from bertforge.data.instances import Instance, derive_seed
from bertforge.data.masking import MaskingCollator
from bertforge.core.errors import BertforgeError

log = logging.getLogger("bertforge")

STATE_VERSION = 1


class PretrainingStream:
    """Endless iterator of masked pretraining batches (dicts of torch tensors)."""

    def __init__(
        self,
        paths: PathsLike | None,
        tokenize: Tokenize,
        *,
        cls_id: int,
        sep_id: int,
        pad_id: int,
        mask_id: int,
        vocab_size: int,
        is_continuation: Sequence[bool] | Callable[[int], bool] | None = None,
        max_seq_length: int = 128,
        batch_size: int = 32,
        sentence_objective: str | None = "nsp",
        whole_word_mask: bool = False,
        masking: str = "token",
        max_ngram: int = 3,
        mlm_probability: float = 0.15,
        mask_token_prob: float = 0.8,
        random_token_prob: float = 0.1,
        short_seq_prob: float = 0.1,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        text_column: str = "text",
        buffers: Buffers = Buffers(),
        shard_by: str = "document",
        max_predictions: int | None = None,
        special_ids: Sequence[int] = (),
        pad_to_multiple_of: int | None = None,
        max_epochs: int | None = None,
        allow_binary: bool = False,
        split: DocumentSplit | None = None,
        packing: str = "stream",
    ) -> None:
        if batch_size < 1:
            raise BertforgeError(f"batch_size must be at least 1 (got {batch_size})")
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.reader = CorpusReader(DEFAULT_CORPUS if paths is None else paths, text_column=text_column, rank=rank,
                                   world_size=world_size, shard_by=shard_by, allow_binary=allow_binary, split=split)
        self.instances = InstanceStream(  # checks sentence_objective and the buffers, sets the reader's min_docs
            self.reader, tokenize, cls_id=cls_id, sep_id=sep_id, max_seq_length=max_seq_length,
            sentence_objective=sentence_objective, short_seq_prob=short_seq_prob, seed=seed, rank=rank,
            buffers=buffers, max_epochs=max_epochs, packing=packing,
        )
        self.sentence_objective = objective = self.instances.sentence_objective
        self.nsp = self.instances.nsp
        self.collator = MaskingCollator(
            cls_id=cls_id, sep_id=sep_id, pad_id=pad_id, mask_id=mask_id, vocab_size=vocab_size,
            mlm_probability=mlm_probability, mask_token_prob=mask_token_prob, random_token_prob=random_token_prob,
            max_predictions=max_predictions, whole_word_mask=whole_word_mask,
            masking=masking, max_ngram=max_ngram, is_continuation=is_continuation, special_ids=special_ids,
            pad_to_multiple_of=pad_to_multiple_of, nsp=objective is not None, seed=derive_seed(seed, rank, "masking"),
            documents=packing == "documents",
        )
        self.batches = 0
        self.warned_small = False  # the corpus made fewer instances an epoch than one batch (said once)
        self._config = self._resume_settings()

    def _resume_settings(self) -> dict[str, Any]:
        """What a saved state must agree with to be resumed here, read off the reader, instances and collator."""
        masking, split = self.collator.masking, self.reader.split
        return dict(nsp=self.nsp, sentence_objective=self.sentence_objective, max_seq_length=self.max_seq_length,
                    seed=self.seed, rank=self.rank, world_size=self.world_size, shard_by=self.reader.shard_by,
                    whole_word_mask=masking == "whole_word", masking=masking,
                    max_ngram=self.collator.max_ngram if masking == "ngram" else None,
                    mask_units="word" if self.collator.word_units else "token",
                    mlm_probability=self.collator.mlm_probability,
                    short_seq_prob=self.instances.pair_layout.short_seq_prob, vocab_size=self.collator.vocab_size,
                    split=None if split is None else [split.fraction, split.held_out], packing=self.instances.packing)

    def __iter__(self) -> PretrainingStream:
        return self

    def next_instances(self, n: int | None = None) -> list[Instance]:
        """The next ``n`` (default ``batch_size``) unmasked instances; fewer only at the end of a finite stream."""
        out: list[Instance] = []
        for _ in range(self.batch_size if n is None else n):
            try:
                out.append(next(self.instances))
            except StopIteration:
                break
        return out

    def __next__(self) -> dict[str, Any]:
        instances = self.next_instances()
        if not instances:
            raise StopIteration
        self.batches += 1
        self.warn_if_smaller_than_a_batch()
        return self.collator(instances)

    def warn_if_smaller_than_a_batch(self) -> None:
        """Loudly, once: an epoch of the corpus makes fewer instances than one batch, so every batch repeats the
        same few sequences (the model memorises them; training is still possible, so no error)."""
        made = self.instances.epoch_yield
        if made is not None and made < self.batch_size and not self.warned_small:
            self.warned_small = True
            log.warning("WARNING: the corpus gives only %d training sequence%s an epoch (this process), fewer than "
                        "one batch of %d: every batch repeats them, so the model memorises them instead of "
                        "learning the language; use a larger corpus (or a smaller --batch-size)",
                        made, "" if made == 1 else "s", self.batch_size)

    @property
    def epoch(self) -> int:
        """Epoch of the documents currently being turned into instances (0-based)."""
        return self.instances.epoch

    @property
    def stats(self) -> dict[str, Any]:
        return {
            "epoch": self.instances.epoch,
            "batches": self.batches,
            "instances": self.instances.instances_made,
            "docs_processed": self.instances.docs_processed,
            "docs_read": self.reader.docs_read,
            "docs_per_epoch": self.reader.docs_per_epoch,
            "bytes_read": self.reader.bytes_read,
            "bytes_replaced": self.reader.bytes_replaced,
            "files": len(self.reader.files),
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue with the same batches, as plain JSON types."""
        return {
            "version": STATE_VERSION,
            "config": dict(self._config),
            "batches": self.batches,
            "instances": self.instances.state_dict(),
            "collator": self.collator.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise BertforgeError(f"cannot resume: data state version {state.get('version')} is not {STATE_VERSION}")
        config = dict(state["config"])
        # states written before SOP and n-gram masking existed say only nsp and whole_word_mask
        config.setdefault("sentence_objective", "nsp" if config.get("nsp") else None)
        config.setdefault("masking", "whole_word" if config.get("whole_word_mask") else "token")
        config.setdefault("packing", "stream")  # states written before document packing existed
        for key, value in config.items():
            if self._config.get(key) != value:
                raise BertforgeError(
                    f"cannot resume: the data checkpoint has {key}={value!r} but this run has "
                    f"{key}={self._config.get(key)!r}"
                )
        self.instances.load_state_dict(state["instances"])
        self.collator.load_state_dict(state["collator"])
        self.batches = int(state["batches"])

    def close(self) -> None:
        self.reader.close()
