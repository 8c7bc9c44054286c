"""Replaced-token detection (ELECTRA, Clark et al., 2020; DeBERTa-v3, He et al., 2021): a generator (a small MLM
model) fills the masked positions with tokens sampled from its softmax, and a discriminator tells, for every real
token, whether it is the original or a replacement. The family's recipe (`Family.recipe.generator`) says the
generator's shape and how the two share embeddings, an entry of `SHARINGS`:

* "gdes", DeBERTa-v3's gradient-disentangled embedding sharing, with a generator as wide as the discriminator and half
  as deep: the discriminator's word table is stop-gradient(E_G) + E_Δ, E_G the generator's table and E_Δ a residual
  of the discriminator's own, initialised to zero. The generator's MLM loss trains E_G; the discriminator's loss
  trains E_Δ and never reaches E_G. A discriminator saved on its own (`ReplacedTokenDetection.exports`) holds
  E_G + E_Δ folded into one table, as Microsoft's released checkpoints do, so it loads as any DeBERTa-v2 model.
* "tied", ELECTRA's, with a generator as deep as the discriminator and a quarter as wide: the two read the same
  token and position tables (of width E; each network projects them to its own width), which both losses train.

The discriminator's head (`ReplacedTokenHead`, named `mask_predictions` inside): DeBERTa's `LMMaskPredictionHead`,
LayerNorm of each hidden state plus token 0's → dense → activation → one logit per token; ELECTRA's
`discriminator_predictions`, the same without the norm (`HeadSpec.rtd_context`).

Shapes: B = batch, S = sequence length, H = hidden size, V = vocabulary, N = masked positions in a batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from collections.abc import Callable
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

_TABLES = "bert.embeddings."  # the embedding tables' modules in a model's state dict: bert.embeddings.NAME.weight


class ReplacedTokenHead(nn.Module):
    """The RTD head, one logit per position: (LayerNorm(h_i + h_0) →, DeBERTa's) dense → activation → classifier."""

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        h = spec.hidden_size
        self.dense = Dense(h, h, act=spec.activation, role="head")
        self.LayerNorm = norm(spec, h) if spec.heads.rtd_context else None
        self.classifier = Dense(h, 1, role="final")

    def forward(self, hidden: Tensor) -> Tensor:
        if self.LayerNorm is not None:
            hidden = self.LayerNorm(hidden[:, :1] + hidden)  # [B, S, H]: each token with the first one's context
        return self.classifier(self.dense(hidden)).squeeze(-1)  # [B, S]


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


class TiedEmbedding(nn.Module):
    """A table the generator owns, read as it is: held, not registered, so the pair's state and optimizer hold it
    once (under the generator) and the discriminator's state lacks it until it is exported."""

    def __init__(self, shared: Embedding) -> None:
        super().__init__()
        object.__setattr__(self, "shared", shared)

    @property
    def weight(self) -> Tensor:
        return self.shared.weight  # type: ignore[union-attr, return-value]  # [rows, E]

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight)


@dataclass(frozen=True)
class Sharing:
    """How a generator and a discriminator share embedding tables (`bertforge.model.families.Generator.sharing`)."""

    tables: tuple[str, ...]  # the shared tables, modules of `BertEmbeddings`
    # (the generator's table, the discriminator's own, keep it) -> the module the discriminator reads instead
    view: Callable[[Embedding, Tensor, bool], nn.Module]
    # (the generator's state, the discriminator's, both of one table's keys without ".weight") -> the discriminator's
    # state with that table as a model on its own holds it
    fold: Callable[[dict[str, Tensor], dict[str, Tensor], str], None]


def _gdes_view(shared: Embedding, own: Tensor, keep: bool) -> nn.Module:
    with torch.no_grad():  # E_Δ = E_D - E_G keeps the discriminator's table; else E_Δ = 0
        delta = own - shared.weight if keep else torch.zeros_like(own)
    return DisentangledEmbedding(shared, delta)


def _gdes_fold(gen: dict[str, Tensor], disc: dict[str, Tensor], table: str) -> None:
    disc[table + ".weight"] = gen[table + ".weight"] + disc.pop(table + ".delta")


def _tied_view(shared: Embedding, own: Tensor, keep: bool) -> nn.Module:
    if keep:  # the discriminator's table becomes the one both read
        with torch.no_grad():
            shared.weight.copy_(own)
    return TiedEmbedding(shared)


def _tied_fold(gen: dict[str, Tensor], disc: dict[str, Tensor], table: str) -> None:
    disc[table + ".weight"] = gen[table + ".weight"]


#: `Generator.sharing` names -> how the two networks share embeddings
SHARINGS: dict[str, Sharing] = {
    "gdes": Sharing(("word_embeddings",), _gdes_view, _gdes_fold),  # DeBERTa-v3's
    "tied": Sharing(("word_embeddings", "position_embeddings"), _tied_view, _tied_fold),  # ELECTRA's
}


def sharing(config: BertConfig) -> Sharing:
    """The embedding sharing of `config`'s family (its recipe's generator), or an error naming the known ones."""
    name = config.family.recipe.generator.sharing
    if name not in SHARINGS:
        raise BertforgeError(f"{config.family.name}: embedding sharing {name!r} is not one of {', '.join(SHARINGS)}")
    return SHARINGS[name]


@dataclass
class ReplacedTokenOutput(ModelOutput):
    loss: Tensor | None = None  # mlm_loss + rtd_loss (unweighted; the objective weighs them)
    mlm_loss: Tensor | None = None  # the generator's, per masked token
    rtd_loss: Tensor | None = None  # the discriminator's, per real token
    prediction_logits: Tensor | None = None  # the generator's [N, V], masked positions only
    rtd_logits: Tensor | None = None  # [B, S]
    rtd_labels: Tensor | None = None  # [B, S]: 1 replaced, 0 original, IGNORE_INDEX at padding


def generator_config(config: BertConfig, layers: int | None = None) -> BertConfig:
    """The generator's config: the discriminator's at the family's generator shape (`Family.recipe.generator`:
    DeBERTa-v3's half as deep, ELECTRA's a quarter as wide, heads and feed-forward too, at least one head, and as
    wide embeddings), with `layers` blocks if given."""
    shape = config.family.recipe.generator
    depth = config.num_hidden_layers
    default = max(1, int(depth * shape.depth))
    layers = default if layers is None else layers
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= depth:
        raise BertforgeError(f"--generator-layers {layers!r}: the generator needs 1 to {depth} layers (the model "
                             f"has {depth}; the generator is at most as deep, {default} by default)")
    width: dict[str, Any] = {}
    if shape.width != 1.0:
        hidden = max(1, int(config.hidden_size * shape.width))
        heads = max(1, int(config.num_attention_heads * shape.width))
        while hidden % heads:
            heads -= 1
        width = dict(hidden_size=hidden, num_attention_heads=heads, embedding_size=config.embedding_dim,
                     intermediate_size=max(1, int(config.intermediate_size * shape.width)))
    return dataclasses.replace(config, num_hidden_layers=layers, extra=dict(config.extra), architectures=None,
                               **width)


class ReplacedTokenDetection(nn.Module):
    """A generator (`BertForMaskedLM`) and a discriminator (`BertForReplacedTokenDetection`) sharing embeddings
    as their family does (`SHARINGS`): one module, so that DDP, FSDP, the optimizer and the checkpoints see both
    networks' parameters.

    `forward` with MLM labels: the generator's loss and samples, the discriminator on the sampled sequence; without
    labels, the generator's output (its vocabulary logits: the demo's predictions). `exports(state)` gives the two
    models to save from a state dict of this module."""

    def __init__(self, generator: BertForMaskedLM, discriminator: BertForReplacedTokenDetection,
                 keep_embeddings: bool = False) -> None:
        """`keep_embeddings`: the discriminator's tables stay what they are (continuing a pair: GDES's E_Δ = E_D - E_G);
        else they become the generator's (a new pair, or a discriminator whose tables the generator has just been
        given: E_Δ = 0)."""
        super().__init__()
        d = discriminator.config
        self.generator, self.discriminator = generator, discriminator
        self.config = d
        self.sharing = sharing(d)
        ours, theirs = generator.bert.embeddings, discriminator.bert.embeddings
        for table in self.sharing.tables:
            shared, own = getattr(ours, table), getattr(theirs, table)
            if shared is None or own is None or shared.weight.shape != own.weight.shape:
                shapes = [None if t is None else tuple(t.weight.shape) for t in (shared, own)]
                raise BertforgeError(f"the generator's {table} ({shapes[0]}) and the discriminator's ({shapes[1]}) "
                                     "must be of one shape to be shared (the same vocabulary, positions and "
                                     "embedding width)")
            setattr(theirs, table, self.sharing.view(shared, own.weight, keep_embeddings))

    @classmethod
    def build(cls, config: BertConfig, generator_layers: int | None = None) -> "ReplacedTokenDetection":
        """A new pair: the discriminator of `config`, its generator `generator_layers` deep (half by default)."""
        discriminator = BertForReplacedTokenDetection(config)
        return cls(BertForMaskedLM(generator_config(config, generator_layers)), discriminator)

    @classmethod
    def around(cls, discriminator: BertForReplacedTokenDetection, generator: BertForMaskedLM | None,
               generator_layers: int | None = None) -> "ReplacedTokenDetection":
        """A pair continuing a trained discriminator: with its `generator` (the discriminator's tables kept), or a
        new one of `generator_layers` given the discriminator's shared tables (the discriminator is unchanged)."""
        if generator is not None:
            return cls(generator, discriminator, keep_embeddings=True)
        generator = BertForMaskedLM(generator_config(discriminator.config, generator_layers))
        with torch.no_grad():
            for table in sharing(discriminator.config).tables:
                getattr(generator.bert.embeddings, table).weight.copy_(
                    getattr(discriminator.bert.embeddings, table).weight)
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
        """The models to save, from a full state dict of this module, by name: "" the discriminator with its shared
        tables as a model on its own holds them (GDES: E_G + E_Δ folded into its word table), "generator" the
        generator. Built on the meta device (no initialisation, which would draw from the training RNG) and given
        the tensors of `state`."""
        parts: dict[str, dict[str, Tensor]] = {"generator": {}, "discriminator": {}}
        for key, value in state.items():
            network, _, name = key.partition(".")
            parts[network][name] = value
        disc, gen = parts["discriminator"], parts["generator"]
        for table in self.sharing.tables:
            self.sharing.fold(gen, disc, _TABLES + table)
        with torch.device("meta"):
            models = {"": BertForReplacedTokenDetection(self.discriminator.config),
                      "generator": BertForMaskedLM(self.generator.config)}
        models[""].load_state_dict(disc, assign=True)
        models["generator"].load_state_dict(gen, assign=True)
        return models


__all__ = ["SHARINGS", "BertForReplacedTokenDetection", "DisentangledEmbedding", "ReplacedTokenDetection",
           "ReplacedTokenHead", "ReplacedTokenOutput", "Sharing", "TiedEmbedding", "generator_config", "sharing"]
