"""Replaced-token detection (ELECTRA, Clark et al., 2020) as DeBERTa-v3 trains it (He et al., 2021): a generator
(an MLM model as wide as the discriminator, half as deep by default) fills the masked positions with tokens sampled
from its softmax, and a discriminator tells, for every real token, whether it is the original or a replacement.

The two networks share their word embeddings by gradient-disentangled embedding sharing (GDES): the discriminator's
table is stop-gradient(E_G) + E_Δ, E_G the generator's table and E_Δ a residual of the discriminator's own,
initialised to zero. The generator's MLM loss trains E_G; the discriminator's loss trains E_Δ and never reaches E_G.
A discriminator saved on its own (`ReplacedTokenDetection.exports`) holds E_G + E_Δ folded into one table, as
Microsoft's released checkpoints do, so it loads as any DeBERTa-v2 model.

The discriminator's head is Microsoft's `LMMaskPredictionHead`, under its checkpoint name `mask_predictions`: LayerNorm
of each hidden state plus token 0's → dense → activation → one logit per token.

Shapes: B = batch, S = sequence length, H = hidden size, V = vocabulary, N = masked positions in a batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.constants import IGNORE_INDEX
from ..core.errors import BertforgeError
from .config import BertConfig
from .encoder import BertLayer
from .models import BertForMaskedLM, BertModel, BertPreTrainedModel
from .outputs import BaseModelOutput, ModelOutput, SequenceClassifierOutput
from .parts import Dense, Embedding, norm
from .spec import EncoderSpec

_WORDS = "bert.embeddings.word_embeddings."  # the word table's parameters in a model's state dict


class ReplacedTokenHead(nn.Module):
    """Microsoft's RTD head: LayerNorm(h_i + h_0) → dense → activation → classifier, one logit per position."""

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        h = spec.hidden_size
        self.dense = Dense(h, h, act=spec.activation, role="head")
        self.LayerNorm = norm(spec, h)
        self.classifier = Dense(h, 1, role="final")

    def forward(self, hidden: Tensor) -> Tensor:
        x = self.LayerNorm(hidden[:, :1] + hidden)  # [B, S, H]: each token with the first one's context
        return self.classifier(self.dense(x)).squeeze(-1)  # [B, S]


class BertForReplacedTokenDetection(BertPreTrainedModel):
    """The discriminator: the encoder and the RTD head. Labels [B, S]: 1 replaced, 0 original, IGNORE_INDEX for
    padding; the loss is the mean binary cross-entropy over the labelled positions."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False, initialize=False)
        self.mask_predictions = ReplacedTokenHead(self.bert.spec)
        self.init_weights()

    def skips_padding(self, labels: Tensor | None, **targets: Any) -> bool:
        return labels is not None  # padding positions carry no label and are never read

    def head(self, out: BaseModelOutput, labels: Tensor | None,  # type: ignore[override]
             attention_mask: Tensor | None = None) -> SequenceClassifierOutput:
        logits = self.mask_predictions(out.last_hidden_state).float()  # [B, S]
        loss = None
        if labels is not None:
            real = labels != IGNORE_INDEX
            loss = F.binary_cross_entropy_with_logits(logits[real], labels[real].float())
        return SequenceClassifierOutput(loss, logits, out.hidden_states, out.attentions)


class DisentangledEmbedding(nn.Module):
    """GDES's word table: stop-gradient(`shared`.weight) + `delta`. `shared` (the generator's table) is held, not
    registered: the generator owns it, and the discriminator's state holds only `delta`."""

    def __init__(self, shared: Embedding, delta: Tensor) -> None:
        super().__init__()
        self.delta = nn.Parameter(delta)
        object.__setattr__(self, "shared", shared)

    @property
    def weight(self) -> Tensor:
        return self.shared.weight.detach() + self.delta  # type: ignore[union-attr, operator]  # [V, E]

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight)


@dataclass
class ReplacedTokenOutput(ModelOutput):
    loss: Tensor | None = None  # mlm_loss + rtd_loss (unweighted; the objective weighs them)
    mlm_loss: Tensor | None = None  # the generator's, per masked token
    rtd_loss: Tensor | None = None  # the discriminator's, per real token
    prediction_logits: Tensor | None = None  # the generator's [N, V], masked positions only
    rtd_logits: Tensor | None = None  # [B, S]
    rtd_labels: Tensor | None = None  # [B, S]: 1 replaced, 0 original, IGNORE_INDEX at padding


def generator_config(config: BertConfig, layers: int | None = None) -> BertConfig:
    """The generator's config: the discriminator's, with `layers` blocks (default: half of its, at least one)."""
    depth = config.num_hidden_layers
    layers = max(1, depth // 2) if layers is None else layers
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= depth:
        raise BertforgeError(f"--generator-layers {layers!r}: the generator needs 1 to {depth} layers (the model "
                             f"has {depth}; the generator is at most as deep, half by default)")
    return dataclasses.replace(config, num_hidden_layers=layers, extra=dict(config.extra), architectures=None)


class ReplacedTokenDetection(nn.Module):
    """A generator (`BertForMaskedLM`) and a discriminator (`BertForReplacedTokenDetection`) with GDES between
    them: one module, so that DDP, FSDP, the optimizer and the checkpoints see both networks' parameters.

    `forward` with MLM labels: the generator's loss and samples, the discriminator on the sampled sequence; without
    labels, the generator's output (its vocabulary logits: the demo's predictions). `exports(state)` gives the two
    models to save from a state dict of this module."""

    def __init__(self, generator: BertForMaskedLM, discriminator: BertForReplacedTokenDetection,
                 keep_embeddings: bool = False) -> None:
        """`keep_embeddings`: E_Δ = E_D - E_G, keeping the discriminator's table (continuing a pair); else E_Δ = 0
        (a new pair, or a discriminator whose table the generator has just been given)."""
        super().__init__()
        g, d = generator.config, discriminator.config
        if (g.vocab_size, g.embedding_dim, g.hidden_size) != (d.vocab_size, d.embedding_dim, d.hidden_size):
            raise BertforgeError(f"the generator (vocabulary {g.vocab_size}, width {g.hidden_size}) and the "
                                 f"discriminator (vocabulary {d.vocab_size}, width {d.hidden_size}) must share "
                                 "their vocabulary and width to share embeddings")
        self.generator, self.discriminator = generator, discriminator
        self.config = d
        shared = generator.bert.embeddings.word_embeddings
        own = discriminator.bert.embeddings.word_embeddings.weight
        with torch.no_grad():
            delta = own - shared.weight if keep_embeddings else torch.zeros_like(own)
        discriminator.bert.embeddings.word_embeddings = DisentangledEmbedding(shared, delta)  # type: ignore[assignment]

    @classmethod
    def build(cls, config: BertConfig, generator_layers: int | None = None) -> "ReplacedTokenDetection":
        """A new pair: the discriminator of `config`, its generator `generator_layers` deep (half by default)."""
        discriminator = BertForReplacedTokenDetection(config)
        return cls(BertForMaskedLM(generator_config(config, generator_layers)), discriminator)

    @classmethod
    def around(cls, discriminator: BertForReplacedTokenDetection, generator: BertForMaskedLM | None,
               generator_layers: int | None = None) -> "ReplacedTokenDetection":
        """A pair continuing a trained discriminator: with its `generator` (E_Δ = E_D - E_G), or a new one of
        `generator_layers` whose E_G is the discriminator's table (E_Δ = 0: the discriminator is unchanged)."""
        if generator is not None:
            return cls(generator, discriminator, keep_embeddings=True)
        generator = BertForMaskedLM(generator_config(discriminator.config, generator_layers))
        with torch.no_grad():
            generator.bert.embeddings.word_embeddings.weight.copy_(discriminator.input_embeddings())
        return cls(generator, discriminator)

    def blocks(self) -> list[BertLayer]:
        """Both networks' encoder layers (what FSDP wraps)."""
        return self.generator.blocks() + self.discriminator.blocks()

    def gradient_checkpointing_enable(self) -> None:
        self.generator.gradient_checkpointing_enable()
        self.discriminator.gradient_checkpointing_enable()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                labels: Tensor | None = None, **_: Any) -> ModelOutput:
        """`labels`: the MLM labels (the original id at masked positions, IGNORE_INDEX elsewhere). The samples are
        drawn from torch's default generator of the device (a checkpoint saves its state)."""
        gen = self.generator(input_ids, attention_mask, token_type_ids, labels=labels)
        if labels is None:
            return gen
        masked = labels != IGNORE_INDEX  # [B, S]
        with torch.no_grad():
            probs = gen.logits.detach().float().softmax(-1)  # [N, V]
            sampled = torch.multinomial(probs, 1).squeeze(1)  # [N]: drawn, not the argmax
            corrupted = input_ids.masked_scatter(masked, sampled.to(input_ids.dtype))  # [B, S]
            original = torch.where(masked, labels, input_ids)
            rtd_labels = (corrupted != original).long()  # a sample equal to the original counts as original
            if attention_mask is not None:
                rtd_labels = rtd_labels.masked_fill(attention_mask == 0, IGNORE_INDEX)
        disc = self.discriminator(corrupted, attention_mask, token_type_ids, labels=rtd_labels)
        return ReplacedTokenOutput(gen.loss + disc.loss, gen.loss, disc.loss, gen.logits, disc.logits, rtd_labels)

    def exports(self, state: dict[str, Tensor]) -> dict[str, BertPreTrainedModel]:
        """The models to save, from a full state dict of this module, by name: "" the discriminator with E_G + E_Δ
        folded into its word table, "generator" the generator. Built on the meta device (no initialisation, which
        would draw from the training RNG) and given the tensors of `state`."""
        parts: dict[str, dict[str, Tensor]] = {"generator": {}, "discriminator": {}}
        for key, value in state.items():
            network, _, name = key.partition(".")
            parts[network][name] = value
        disc, gen = parts["discriminator"], parts["generator"]
        disc[_WORDS + "weight"] = gen[_WORDS + "weight"] + disc.pop(_WORDS + "delta")
        with torch.device("meta"):
            models = {"": BertForReplacedTokenDetection(self.discriminator.config),
                      "generator": BertForMaskedLM(self.generator.config)}
        models[""].load_state_dict(disc, assign=True)
        models["generator"].load_state_dict(gen, assign=True)
        return models


__all__ = ["BertForReplacedTokenDetection", "DisentangledEmbedding", "ReplacedTokenDetection", "ReplacedTokenHead",
           "ReplacedTokenOutput", "generator_config"]
