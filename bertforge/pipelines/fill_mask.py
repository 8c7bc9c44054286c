"""Fill-mask: the most likely tokens, with probabilities, for each [MASK] of a text."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.errors import BertforgeError
from ..model import BertForMaskedLM, BertPreTrainedModel
from .base import Feature, Pipeline
from ..model.attention import PackedBatch
from ..model.checkpoint import check_mlm_head


class FillMaskPipeline(Pipeline):
    """`pipeline("fill-mask", model=DIR)`: a text with one or more [MASK] tokens → predictions.

    The result of a text with one mask is a list of `top_k` dicts {"score", "token", "token_str", "sequence"}
    (best first), as transformers' fill-mask pipeline gives; with several masks, one such list per mask. Only the
    masked positions go through the vocabulary projection.

    Args:
        top_k: predictions per mask (default 5).
        targets: restrict predictions to these vocabulary tokens.
    """

    task = "fill-mask"
    model_class = BertForMaskedLM

    def __init__(self, model: Any, *, top_k: int = 5, targets: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.mask_id = self.tokenizer.mask_token_id
        self.set_top_k(top_k)
        self.set_targets(targets)

    call_options = (*Pipeline.call_options, "top_k", "targets")
    refused_options = {
        **Pipeline.refused_options,
        "tokenizer_kwargs": "texts are tokenized as the model's tokenizer does and cut at max_length; set that "
                            "with max_length=N",
    }

    def set_top_k(self, top_k: Any) -> None:
        """Predictions per mask (at most the vocabulary's, or the targets', size)."""
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise BertforgeError(f"fill-mask: top_k must be a positive integer, got {top_k!r}")
        self.top_k = top_k

    def set_targets(self, targets: Any) -> None:
        """Restrict the predictions to these vocabulary tokens (a token, or a list of them; None: any)."""
        self.target_ids: Tensor | None = None
        if targets is None:
            return
        if isinstance(targets, str):
            targets = [targets]  # as transformers takes one target
        vocab = self.tokenizer.get_vocab()
        unknown = [t for t in targets if t not in vocab]
        if unknown or not targets:
            raise BertforgeError(f"fill-mask: targets must be vocabulary tokens; not in the vocabulary: {unknown}")
        self.target_ids = torch.tensor(sorted({vocab[t] for t in targets}))

    def check_model(self, model: BertPreTrainedModel, source: str) -> None:
        check_mlm_head(model, source)

    def check_input(self, item: Any, index: int) -> None:
        super().check_input(item, index)
        if self.tokenizer.mask_token not in item:
            raise BertforgeError(f"fill-mask: input {index} has no {self.tokenizer.mask_token} token: {item[:80]!r}")

    def featurize(self, inputs: list[str]) -> tuple[list[Feature], int]:
        enc, truncated = self.encode(inputs)
        features = [Feature(i, ids) for i, ids in enumerate(enc["input_ids"])]
        for f in features:
            if self.mask_id not in f.input_ids:  # it was there before truncation
                raise BertforgeError(
                    f"fill-mask: every {self.tokenizer.mask_token} of input {f.item} lies beyond "
                    f"max_length={self.max_length} tokens"
                )
        return features, truncated

    def head(self, batch: PackedBatch, hidden: Tensor, features: list[Feature]) -> list[tuple[np.ndarray, np.ndarray]]:
        rows = (batch.input_ids == self.mask_id).nonzero().squeeze(1)  # [N] packed positions of the masks
        model: BertForMaskedLM = self.model  # type: ignore[assignment]
        logits = model.mlm_logits(hidden[rows])  # type: ignore[misc]  # [N, V] (BertForPreTraining's method, shared)
        probs = logits.float().softmax(dim=-1)
        if self.target_ids is not None:
            probs = probs[:, self.target_ids.to(probs.device)]
        scores, ids = probs.topk(min(self.top_k, probs.shape[-1]), dim=-1)  # [N, k]
        if self.target_ids is not None:
            ids = self.target_ids[ids.cpu()]
        counts = [seq.count(self.mask_id) for seq in (f.input_ids for f in features)]
        top_scores, top_ids = scores.cpu().numpy(), ids.cpu().numpy()
        return list(zip(np.split(top_scores, np.cumsum(counts)[:-1]), np.split(top_ids, np.cumsum(counts)[:-1])))

    def postprocess(self, item: str, outputs: list[Any], features: list[Feature]) -> list[Any]:
        scores, ids = outputs[0]  # [masks, k] each
        input_ids = np.array(features[0].input_ids)
        positions = np.flatnonzero(input_ids == self.mask_id)
        single = len(positions) == 1
        pad = self.tokenizer.pad_token_id
        result = []
        for position, row_scores, row_ids in zip(positions, scores, ids):
            predictions = []
            for score, token in zip(row_scores.tolist(), row_ids.tolist()):
                filled = input_ids.copy()
                filled[position] = token
                filled = filled[filled != pad]
                predictions.append({
                    "score": score,
                    "token": token,
                    "token_str": self.tokenizer.decode([token], skip_special_tokens=False),
                    "sequence": self.tokenizer.decode(filled.tolist(), skip_special_tokens=single),
                })
            result.append(predictions)
        return result[0] if single else result

