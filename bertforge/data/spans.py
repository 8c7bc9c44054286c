"""N-gram span masking (ALBERT's, after SpanBERT): the spans of up to ``max_ngram`` units that
:class:`~bertforge.data.masking.MaskingCollator` masks with ``masking="ngram"``.

The candidates are cut into spans of ``n`` units, ``n`` in ``1..max_ngram`` drawn with ``p(n) ∝ 1/n``; a unit is a
token, or a whole word when the continuation flags are given. Each segment (a run of candidates between two special
tokens) is tiled from its start, so no span crosses a special token; the spans are then taken in a uniformly random
order until the row's count is reached (see the module docstring of :mod:`bertforge.data.masking` for the rule at the
count). Every step is a batched tensor operation; the randomness comes from the generator each call is handed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class NgramDraw:
    """One n-gram selection (:meth:`NgramSpans.choose`, :meth:`MaskingCollator.ngram_draw`), all [batch, length]:
    ``chosen`` the masked positions; ``tile`` the span each candidate position belongs to (-1 elsewhere), spans
    numbered per row; indexed by span number: ``drawn`` the drawn n, ``units`` the units the span has (less than
    ``drawn`` where the segment ended), ``taken`` the units of it that were masked (0 for a span not taken)."""

    chosen: torch.Tensor
    tile: torch.Tensor
    drawn: torch.Tensor
    units: torch.Tensor
    taken: torch.Tensor


class NgramSpans:
    """Draws n-gram spans: ``max_ngram`` the longest n; ``continuation`` the [vocab_size] flags of the ids that
    continue a word (units are then whole words, n counted in words), or None (units are tokens)."""

    def __init__(self, max_ngram: int, continuation: torch.Tensor | None, vocab_size: int) -> None:
        self.max_ngram = max_ngram
        self.continuation = continuation
        self.vocab_size = vocab_size
        inverse = 1.0 / torch.arange(1, max_ngram + 1, dtype=torch.float64)
        # p(n) ∝ 1/n as the upper ends of n = 1 .. max_ngram - 1 on [0, 1): n = 1 + #(ends <= u) for a uniform u
        self.ends = (inverse.cumsum(0) / inverse.sum())[:-1].float()

    def units(self, input_ids: torch.Tensor, candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(unit starts, segment starts), [B, L] bool: a unit is a token, or a word when whole words are known (a
        continuation piece right after a candidate joins its word); a segment is a run of candidates."""
        prev = F.pad(candidates[:, :-1], (1, 0), value=False)  # the position before is a candidate
        unit_start = candidates
        if self.continuation is not None:
            flat = input_ids.clamp(0, self.vocab_size - 1).reshape(-1)
            cont = self.continuation.index_select(0, flat).view(input_ids.shape)
            unit_start = candidates & ~(cont & prev)
        return unit_start, candidates & ~prev

    def tiles(self, unit_start: torch.Tensor, seg_start: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Tile every segment from its start with spans of n units, n drawn with p(n) ∝ 1/n. Returns [B, L]: the
        drawn n of the span starting at each position, 0 where none starts.

        Units are numbered along the row; a segment of units f .. f+U-1 takes its spans' lengths from the draws
        numbered f, f+1, ... (it needs at most U), so segments never share a draw and one [B, L] draw serves them
        all: the j-th span of the segment starts at unit f + (d[f] + ... + d[f+j-1]) if that is still inside it."""
        batch, length = unit_start.shape
        arange = torch.arange(length + 1)
        unit = unit_start.cumsum(1) - 1  # unit number per position
        slot = unit.masked_fill(~unit_start, length)  # where a unit's first position writes (`length`: a dump)
        first_flag = torch.zeros(batch, length + 1, dtype=torch.bool).scatter_(1, slot, seg_start)
        first_of = (arange * first_flag).cummax(1).values  # per unit: the first unit of its segment
        uniform = torch.rand(batch, length + 1, generator=generator)
        drawn = torch.ones(batch, length + 1, dtype=torch.long)
        for end in self.ends.tolist():  # n = 1 + #(ends <= u)
            drawn += uniform >= end
        before = drawn.cumsum(1) - drawn
        target = first_of + before - before.gather(1, first_of)  # where the span of draw u starts
        inside = (target < unit_start.sum(1, keepdim=True)) & (arange < length)
        target = target.clamp(max=length)
        inside &= first_of.gather(1, target) == first_of  # still in the same segment
        span_n = torch.zeros(batch, length + 1, dtype=torch.long).scatter_(1, target.masked_fill(~inside, length),
                                                                          drawn)
        return span_n.gather(1, unit.clamp(min=0)).masked_fill_(~unit_start, 0)

    def choose(
        self, input_ids: torch.Tensor, candidates: torch.Tensor, k: torch.Tensor, generator: torch.Generator
    ) -> NgramDraw:
        """The spans of every row and the positions they mask: `k` [B] tokens per row among `candidates` [B, L]."""
        batch, length = input_ids.shape
        if not candidates.any():
            empty = torch.zeros(batch, length, dtype=torch.long)
            return NgramDraw(torch.zeros_like(candidates), empty - 1, empty, empty, empty)
        unit_start, seg_start = self.units(input_ids, candidates)
        drawn = self.tiles(unit_start, seg_start, generator)
        tile_start = drawn > 0
        off = ~candidates
        tile = (tile_start.cumsum(1) - 1).masked_fill_(off, length)  # span number per row; `length` off candidates
        unit = (unit_start.cumsum(1) - 1).masked_fill_(off, length)
        ordinal = candidates.cumsum(1) - 1  # candidate number per row
        n_spans = tile_start.sum(1, keepdim=True)
        most = int(n_spans.max())
        tokens = torch.zeros(batch, length + 1, dtype=torch.long).scatter_add_(1, tile, candidates.long())[:, :most]
        # the spans in a uniformly random order; `before`: tokens of the spans that come before each one
        key = torch.rand(batch, most, generator=generator)
        key = key.masked_fill_(torch.arange(most) >= n_spans, 2.0)  # no such span: last
        order = key.argsort(1)
        in_order = tokens.gather(1, order)
        before = torch.zeros(batch, length + 1, dtype=torch.long)
        before[:, :most].scatter_(1, order, in_order.cumsum(1) - in_order)
        span_first = torch.zeros(batch, length + 1, dtype=torch.long)
        span_first.scatter_(1, tile.masked_fill(~tile_start, length), ordinal)
        unit_last = torch.zeros(batch, length + 1, dtype=torch.long).scatter_reduce_(1, unit, ordinal, "amax")
        # a token is masked when its whole unit, and every unit before it in its span, fit in the count
        end_in_span = unit_last.gather(1, unit) - span_first.gather(1, tile) + 1
        chosen = candidates & (before.gather(1, tile) + end_in_span <= k.unsqueeze(1))
        if self.continuation is not None:
            unit_first = torch.zeros_like(unit_last).scatter_(1, unit.masked_fill(~unit_start, length), ordinal)
            word_len = (unit_last - unit_first + 1).gather(1, unit)  # tokens in the word of each position
            chosen = self.fill_words(chosen, unit_start, unit, word_len, k, generator)

        def per_span(values: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(batch, length + 1, dtype=torch.long)
            return out.scatter_add_(1, tile, values.long().masked_fill(off, 0))[:, :length]

        return NgramDraw(chosen, tile.masked_fill(off, -1), per_span(drawn), per_span(unit_start),
                         per_span(unit_start & chosen))

    def fill_words(
        self,
        chosen: torch.Tensor,
        unit_start: torch.Tensor,
        unit: torch.Tensor,
        word_len: torch.Tensor,
        k: torch.Tensor,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """BERT's rule for the words the spans left: while a sequence is short of its count, add a random whole
        word that still fits (one per sequence per round; a round per token missing at most)."""
        rest = k - chosen.sum(1)
        while True:
            fits = unit_start & ~chosen & (word_len <= rest.unsqueeze(1))
            has = fits.any(1)
            if not has.any():
                return chosen
            key = torch.rand(chosen.shape, generator=generator).masked_fill_(~fits, -1.0)
            pick = key.argmax(1, keepdim=True)
            chosen = chosen | ((unit == unit.gather(1, pick)) & has.unsqueeze(1))
            rest = rest - word_len.gather(1, pick).squeeze(1) * has
