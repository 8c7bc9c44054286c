"""Dynamic masked-language-model masking: pad instances into a batch and choose what the model must predict.

Which tokens: the candidates are the sequence's tokens that are neither special (``[CLS]``, ``[SEP]``, ``[PAD]``,
``[MASK]`` and any ``special_ids``) nor padding. Like BERT, each sequence gets exactly
``min(max_predictions, max(1, round(n * mlm_probability)))`` predictions, where ``n`` is its number of candidates
(not a Bernoulli draw per token); the positions are a uniformly random subset of the candidates. With whole-word
masking, the candidates are grouped into words (a token that is a continuation piece, e.g. ``##ing``, joins the word
of the token right before it), the words are visited in random order and a word is taken whole if it still fits
in the count (BERT's rule: a word that would overshoot is skipped).

N-gram masking (``masking="ngram"``, ALBERT's, after SpanBERT): the candidates are cut into spans of ``n`` units,
``n`` in ``1..max_ngram`` drawn with ``p(n) ∝ 1/n`` (for 3: 6/11, 3/11, 2/11); a unit is a token, or a whole word
when ``is_continuation`` is given (n counted in words). Each run of candidates between two special tokens (a
segment) is tiled from its start by spans of independently drawn lengths, so no span crosses a special token; a
segment's last span is cut short at the segment's end. The spans are then taken in a uniformly random order until
the same count as above is reached; the span that crosses the count keeps only its first units that fit (tokens:
the count is met exactly; words: a word that does not fit is not split, and as with whole-word masking, whole
words that still fit are then added at random, each a span of one word, until none does). Every step is a batched
tensor operation (no Python loop over tokens or rows).

How: of the chosen positions, 80% (``mask_token_prob``) become ``[MASK]``, 10% (``random_token_prob``) a token drawn
uniformly from the vocabulary minus the special ids, and the rest stay unchanged; the decision is made per token.
``labels`` hold the original id at chosen positions and -100 everywhere else.

All randomness comes from the collator's own ``torch.Generator`` (seeded; its state is in :meth:`state_dict`).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from bertforge.core.constants import IGNORE_INDEX
from bertforge.data.instances import Instance
from bertforge.data.spans import NgramDraw, NgramSpans
from bertforge.core.errors import BertforgeError


def _field(item: Any, name: str) -> Any:
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)


MASKING_KINDS = ("token", "whole_word", "ngram")


def resolve_masking(masking: str, whole_word_mask: bool, max_ngram: int) -> str:
    """The masking kind from ``masking`` and the older ``whole_word_mask`` switch (True turns "token" into
    "whole_word"; with "ngram" it asks for n-grams of whole words)."""
    if masking not in MASKING_KINDS:
        raise BertforgeError(f"unknown masking {masking!r}; choose one of {', '.join(MASKING_KINDS)}")
    if max_ngram < 1:
        raise BertforgeError(f"max_ngram must be at least 1 (got {max_ngram})")
    return "whole_word" if whole_word_mask and masking == "token" else masking


def check_rates(mlm_probability: float, mask_token_prob: float, random_token_prob: float) -> None:
    """Refuse (BertforgeError) a masking rate outside (0, 1], or replacement shares that are negative or add up to
    more than 1."""
    if not 0.0 < mlm_probability <= 1.0:
        raise BertforgeError(f"mlm_probability must be in (0, 1] (got {mlm_probability})")
    if mask_token_prob < 0 or random_token_prob < 0 or mask_token_prob + random_token_prob > 1.0:
        raise BertforgeError(
            f"mask_token_prob + random_token_prob must be within [0, 1] (got {mask_token_prob} + "
            f"{random_token_prob})"
        )


def special_token_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
    """The distinct special ids, sorted; BertforgeError for one outside the vocabulary."""
    special = sorted({int(i) for i in ids})
    for sid in special:
        if not 0 <= sid < vocab_size:
            raise BertforgeError(f"special token id {sid} is outside the vocabulary (size {vocab_size})")
    return special


def random_replacements(special: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The ids a chosen token may be replaced by at random: every id but the `special` ones."""
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[special] = False
    pool = allowed.nonzero().squeeze(1)
    if len(pool) == 0:
        raise BertforgeError("the vocabulary has no non-special token to use as a random replacement")
    return pool


def continuation_flags(is_continuation: Sequence[bool] | Callable[[int], bool], vocab_size: int) -> torch.Tensor:
    """[vocab_size] bool: which ids continue the word before them (WordPiece's "##" pieces; for SentencePiece /
    Unigram vocabularies, the pieces that do not start with "▁")."""
    if callable(is_continuation):
        flags = [bool(is_continuation(i)) for i in range(vocab_size)]
    else:
        flags = [bool(f) for f in is_continuation]
        if len(flags) != vocab_size:
            raise BertforgeError(f"is_continuation has {len(flags)} entries but the vocabulary has {vocab_size}")
    return torch.tensor(flags, dtype=torch.bool)


def generator_state_to_json(generator: torch.Generator) -> str:
    return base64.b64encode(generator.get_state().numpy().tobytes()).decode("ascii")


def generator_state_from_json(generator: torch.Generator, state: str) -> None:
    raw = bytearray(base64.b64decode(state))
    generator.set_state(torch.frombuffer(raw, dtype=torch.uint8).clone())


class MaskingCollator:
    """Pads a list of instances (``Instance`` objects or dicts with ``input_ids`` and optionally
    ``token_type_ids``/``next_sentence_label``) and masks them.

    ``masking``: "token" (a random subset of tokens), "whole_word" (whole words; ``is_continuation`` says which ids
    continue a word) or "ngram" (spans of up to ``max_ngram`` tokens, or words when ``is_continuation`` is given);
    the older ``whole_word_mask=True`` means "whole_word" with "token", and word units with "ngram".
    ``pad_to``: None pads to the longest sequence of the batch, an int to that fixed length;
    ``pad_to_multiple_of`` rounds the padded length up. ``nsp``: whether to return ``next_sentence_label``
    (None: when the instances carry one).
    """

    def __init__(
        self,
        *,
        cls_id: int,
        sep_id: int,
        pad_id: int,
        mask_id: int,
        vocab_size: int,
        mlm_probability: float = 0.15,
        max_predictions: int | None = None,
        whole_word_mask: bool = False,
        masking: str = "token",
        max_ngram: int = 3,
        is_continuation: Sequence[bool] | Callable[[int], bool] | None = None,
        special_ids: Sequence[int] = (),
        mask_token_prob: float = 0.8,
        random_token_prob: float = 0.1,
        pad_to: int | None = None,
        pad_to_multiple_of: int | None = None,
        nsp: bool | None = None,
        seed: int = 0,
        generator: torch.Generator | None = None,
    ) -> None:
        check_rates(mlm_probability, mask_token_prob, random_token_prob)
        masking = resolve_masking(masking, whole_word_mask, max_ngram)
        if max_predictions is not None and max_predictions < 1:
            raise BertforgeError(f"max_predictions must be at least 1 (got {max_predictions})")
        self.special_ids = special_token_ids((cls_id, sep_id, pad_id, mask_id, *special_ids), vocab_size)
        self.cls_id, self.sep_id, self.pad_id, self.mask_id = cls_id, sep_id, pad_id, mask_id
        self.vocab_size = vocab_size
        self.mlm_probability = mlm_probability
        self.max_predictions = max_predictions
        self.mask_token_prob = mask_token_prob
        self.random_token_prob = random_token_prob
        self.pad_to = pad_to
        self.pad_to_multiple_of = pad_to_multiple_of
        self.nsp = nsp
        self.masking = masking
        self.max_ngram = max_ngram
        self.whole_word_mask = masking == "whole_word"
        self._special = torch.tensor(self.special_ids, dtype=torch.long)
        self._random_pool = random_replacements(self._special, vocab_size)
        self._continuation: torch.Tensor | None = None
        if masking == "whole_word" or whole_word_mask or (masking == "ngram" and is_continuation is not None):
            if is_continuation is None:
                raise BertforgeError(f"{masking} masking of whole words needs is_continuation (which ids are '##' "
                                     "pieces)")
            self._continuation = continuation_flags(is_continuation, vocab_size)
        self.word_units = self._continuation is not None  # whole words (whole_word, or ngram counted in words)
        self._spans = NgramSpans(max_ngram, self._continuation, vocab_size)
        if generator is None:
            generator = torch.Generator()
            generator.manual_seed(seed)
        self.generator = generator

    # ------------------------------------------------------------------ padding
    def pad(self, instances: Sequence[Any]) -> dict[str, torch.Tensor]:
        if not instances:
            raise BertforgeError("cannot collate an empty list of instances")
        seqs = [list(_field(inst, "input_ids")) for inst in instances]
        longest = max(map(len, seqs))
        length = longest if self.pad_to is None else self.pad_to
        if longest > length:
            raise BertforgeError(f"an instance has {longest} tokens, more than pad_to={self.pad_to}")
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch = len(seqs)
        input_ids = torch.full((batch, length), self.pad_id, dtype=torch.long)
        token_type_ids = torch.zeros((batch, length), dtype=torch.long)
        attention_mask = torch.zeros((batch, length), dtype=torch.long)
        labels_nsp = []
        for row, (inst, ids) in enumerate(zip(instances, seqs, strict=False)):
            n = len(ids)
            input_ids[row, :n] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, :n] = 1
            if isinstance(inst, Instance):
                token_type_ids[row, inst.num_a : n] = 1
            else:
                types = _field(inst, "token_type_ids")
                if types is not None:
                    token_type_ids[row, :n] = torch.as_tensor(list(types), dtype=torch.long)
            label = _field(inst, "next_sentence_label")
            labels_nsp.append(IGNORE_INDEX if label is None else int(label))
        out = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
        nsp = self.nsp if self.nsp is not None else any(label != IGNORE_INDEX for label in labels_nsp)
        if nsp:
            out["next_sentence_label"] = torch.tensor(labels_nsp, dtype=torch.long)
        return out

    # ------------------------------------------------------------------ masking
    def _counts(self, candidates: torch.Tensor) -> torch.Tensor:
        n = candidates.sum(dim=1)
        k = torch.floor(n.double() * self.mlm_probability + 0.5).long().clamp(min=1)
        if self.max_predictions is not None:
            k = k.clamp(max=self.max_predictions)
        return torch.where(n > 0, k, torch.zeros_like(k))

    def _choose_tokens(self, candidates: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        scores = torch.rand(candidates.shape, generator=self.generator)
        scores = scores.masked_fill(~candidates, 2.0)  # non-candidates sort last
        order = scores.argsort(dim=1)
        ranks = torch.empty_like(order)
        ranks.scatter_(1, order, torch.arange(order.shape[1]).expand_as(order).contiguous())
        return (ranks < k.unsqueeze(1)) & candidates

    def _choose_words(self, input_ids: torch.Tensor, candidates: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        assert self._continuation is not None
        flat = input_ids.clamp(0, self.vocab_size - 1).reshape(-1)
        # index_select, not advanced indexing: the latter is ~1000x slower on CPU for this gather
        cont = (self._continuation.index_select(0, flat).view(input_ids.shape) & candidates).tolist()
        cand = candidates.tolist()
        budgets = k.tolist()
        # One random key per word (indexed by the word's first position): visiting words by increasing key is a
        # uniformly random order.
        keys = torch.rand(candidates.shape, generator=self.generator).tolist()
        rows: list[int] = []
        cols: list[int] = []
        for row in range(input_ids.shape[0]):
            budget = budgets[row]
            if budget == 0:
                continue
            words: list[list[int]] = []
            cont_row, cand_row = cont[row], cand[row]
            for pos, is_cand in enumerate(cand_row):
                if not is_cand:
                    continue
                if words and cont_row[pos] and words[-1][-1] == pos - 1:
                    words[-1].append(pos)
                else:
                    words.append([pos])
            key_row = keys[row]
            words.sort(key=lambda word: key_row[word[0]])
            taken = 0
            for word in words:
                if taken >= budget:
                    break
                if taken + len(word) > budget:
                    continue  # BERT's rule: a word that would overshoot the count is skipped
                cols.extend(word)
                rows.extend([row] * len(word))
                taken += len(word)
        chosen = torch.zeros_like(candidates)
        if rows:
            chosen[torch.tensor(rows), torch.tensor(cols)] = True
        return chosen

    def ngram_draw(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> NgramDraw:
        """The n-gram selection :meth:`mask` would make next (it advances the generator the same way), with its
        spans: for inspection and tests."""
        candidates = self._candidates(input_ids, attention_mask)
        return self._spans.choose(input_ids, candidates, self._counts(candidates), self.generator)

    def _candidates(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        candidates = ~torch.isin(input_ids, self._special)
        if attention_mask is not None:
            candidates &= attention_mask.bool()
        return candidates

    def mask(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (masked input ids, labels); ``input_ids`` is not modified."""
        candidates = self._candidates(input_ids, attention_mask)
        k = self._counts(candidates)
        if self.masking == "ngram":
            chosen = self._spans.choose(input_ids, candidates, k, self.generator).chosen
        elif self.masking == "whole_word":
            chosen = self._choose_words(input_ids, candidates, k)
        else:
            chosen = self._choose_tokens(candidates, k)
        labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
        action = torch.rand(input_ids.shape, generator=self.generator)
        to_mask = chosen & (action < self.mask_token_prob)
        to_random = chosen & (action >= self.mask_token_prob) & (action < self.mask_token_prob + self.random_token_prob)
        pick = torch.randint(len(self._random_pool), input_ids.shape, generator=self.generator)
        masked = input_ids.clone()
        masked[to_mask] = self.mask_id
        masked[to_random] = self._random_pool[pick[to_random]]
        return masked, labels

    def __call__(self, instances: Sequence[Any]) -> dict[str, torch.Tensor]:
        batch = self.pad(instances)
        batch["input_ids"], batch["labels"] = self.mask(batch["input_ids"], batch["attention_mask"])
        return batch

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"generator": generator_state_to_json(self.generator)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        generator_state_from_json(self.generator, state["generator"])
