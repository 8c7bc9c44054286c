"""`Family`: what one member of the family changes, declared as data.

bertforge has one encoder (`bertforge.model.encoder`) assembled from the parts an `EncoderSpec` names. A `Family`
holds, for one member: how its config reads into that spec (`read_spec`: positions, norms, feed-forward, attention
kinds, ...), the shape of its heads, its `config.json` field names and defaults, its presets and recipe, and its
checkpoint adapter — a table translating its Hugging Face parameter names to the encoder's own (BERT's) names, plus
functions for what a table of names cannot say (`unfuse` splits a fused tensor of a file into the encoder's
parameters, `fuse` joins them back when saving). Adding a member is a module in this package with its `Family`
value, plus a part in `bertforge.model` only where it truly needs one.

Key tables: `(hf, internal)` pairs of key prefixes, `{n}` standing for a layer number. Reading a checkpoint, a key
first has the family's prefix (`roberta.`, `albert.`, ...) replaced by `bert.`, then the first rule whose `hf` side
matches it and whose result is a parameter of the model being loaded renames it (so DistilBERT's `classifier.` can
be the sequence head's output layer or the token classifier, whichever the model has). Saving runs the same table
the other way. Keys matched by no rule keep their name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...core.errors import BertforgeError
from ..spec import ChoiceHeadName, EncoderSpec, HeadSpec, PositionName, SequenceHeadName

if TYPE_CHECKING:
    from ..config import BertConfig

INTERNAL_PREFIX = "bert"  # the encoder's attribute in every head class, so `bert.` in internal parameter names
INTERNAL_LAYER = "bert.encoder.layer.{n}."  # the internal names of block n's parameters start so
#: what a BERT-like config.json says that no config field holds (bertforge has absolute positions and a tied decoder)
WRITTEN: dict[str, Any] = {"position_embedding_type": "absolute", "tie_word_embeddings": True}


@dataclass(frozen=True)
class BertParts:
    """What a member read by `bert_spec` changes in BERT's encoder and heads (a family with its own `read_spec`
    decides its whole spec there)."""

    positions: PositionName = "absolute"  # "after-padding": RoBERTa's ids from pad_token_id + 1
    pooler: bool = True  # a tanh dense layer on the first token in the base model
    sequence_head: SequenceHeadName = "pooler"  # "pooler": dropout → linear on the pooled output; "first-token": an MLP
    sequence_act: str = "tanh"  # the first-token head's hidden activation (RoBERTa tanh, DistilBERT relu)
    dropout_before_dense: bool = True  # RoBERTa drops out token 0 before the head's dense layer, DistilBERT not
    mlm_act: str | None = None  # the MLM transform's activation; None: the config's hidden_act
    rtd_context: bool = True  # the replaced-token head norms h_i + h_0 first (DeBERTa's); False: ELECTRA's, without
    choice_head: ChoiceHeadName = "sequence"  # the multiple-choice head (`spec.CHOICE_HEADS`)


@dataclass(frozen=True)
class Generator:
    """Replaced-token detection's generator as a family's recipe builds it from the discriminator's config."""

    depth: float = 0.5  # its layers, as a share of the discriminator's (DeBERTa-v3: half)
    width: float = 1.0  # its hidden size, feed-forward width and heads, as a share of the discriminator's
    sharing: str = "gdes"  # how the two share embeddings: a name in `bertforge.model.rtd.SHARINGS`


@dataclass(frozen=True)
class Recipe:
    """A family's pretraining recipe: what the `bertforge pretrain` settings left at "auto" become for it."""

    objective: str | None = None  # an --objective name; None: MLM with the family's sentence objective (NSP, SOP)
    masking: str = "token"  # "token" or "ngram" (ALBERT's)
    mlm_probability: float = 0.15
    adam_beta2: float = 0.999
    decay: str = "linear"  # the learning-rate decay after warmup (ModernBERT's: "wsd-sqrt")
    packing: str = "stream"  # how MLM-only rows are cut: "stream", or "documents" (ModernBERT's)
    generator: Generator = Generator()  # replaced-token detection's generator, where the family pretrains with it


@dataclass(frozen=True)
class Ladder:
    """A published series of one family's models with shapes of their own (Ettin, mmBERT: ModernBERT's
    architecture): `--config NAME-SIZE` builds one. Each size is the config fields it sets over the family's
    `preset`; the series' pretraining recipe replaces the family's where it has one."""

    name: str  # the presets' prefix: "ettin" in ettin-17m
    sizes: dict[str, dict[str, Any]]  # size -> config fields (layers, widths, vocabulary, ...)
    recipe: Recipe | None = None  # None: the family's
    tokenizer: str = ""  # the tokenizer kind its models pretrain with; "": the family's
    source: str = ""  # where the shapes and the recipe are published


@dataclass(frozen=True)
class Family:
    model_type: str  # "model_type" in config.json
    name: str  # as messages and the documentation name it
    class_prefix: str  # of its `transformers` classes: "Roberta" + "ForMaskedLM"
    prefix: str  # its base model's attribute in `transformers`' head classes: "roberta.encoder.layer.0..."
    body: tuple[str, ...] = ("embeddings", "encoder", "pooler")  # first key segments of a bare base model's file
    parts: BertParts = BertParts()  # what it changes in BERT's encoder, as `bert_spec` reads it (else: `read_spec`)
    sentence_head: str | None = "NSP"  # the pretraining sentence objective ("NSP", "SOP") or None: MLM only
    # config.json
    config_keys: dict[str, str] = field(default_factory=dict)  # its field name -> the internal (BertConfig) name
    defaults: dict[str, Any] = field(default_factory=dict)  # `transformers`' defaults for fields a file may omit
    unused: tuple[str, ...] = ()  # internal fields the family does not have (not written to its config.json)
    written: dict[str, Any] = field(default_factory=lambda: dict(WRITTEN))  # fixed keys its config.json gets
    write_config: Callable[[dict[str, Any], "BertConfig"], dict[str, Any]] | None = None  # completes config.json's dict
    special_ids: tuple[str, ...] = ()  # config.json's token-id fields besides pad (ModernBERT's bos/eos/cls/sep)
    # parameter names
    keys: tuple[tuple[str, str], ...] = ()  # (hf, internal) key prefixes, {n} = a layer number
    dropped: tuple[str, ...] = ()  # regexes of file keys that are not parameters here (tied decoders)
    unfuse: Callable[[dict[str, Tensor]], dict[str, Tensor]] | None = None  # a file's tensors, fused ones split
    fuse: Callable[[dict[str, Tensor]], dict[str, Tensor]] | None = None  # the inverse, on the file's names
    # the layer layout its `transformers` class holds in memory where that differs from its files' (PEFT names those
    # modules): (hf, internal) key prefixes preferred to `keys` when naming, and what splits its fused tensors
    memory_keys: tuple[tuple[str, str], ...] = ()
    memory_fuse: Callable[[dict[str, Tensor]], dict[str, Tensor]] | None = None
    preset: dict[str, Any] = field(default_factory=dict)  # what `--config FAMILY-SIZE` sets besides the size
    sized_preset: Callable[[int], dict[str, Any]] | None = None  # preset fields that follow the hidden size
    sizes: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)  # (layers, hidden, heads, intermediate)
    intermediate_ratio: float = 4.0  # a preset's feed-forward width over its hidden size
    ladders: tuple[Ladder, ...] = ()  # published series of this family with shapes of their own (`--config ettin-17m`)
    recipe: Recipe = Recipe()  # what the pretraining settings left at "auto" become
    objectives: tuple[str, ...] = ()  # `--objective` names it pretrains with besides MLM and its sentence head's
    read_spec: Callable[["Family", "BertConfig"], EncoderSpec] | None = None  # config → parts; None: `bert_spec`
    # rotary positions: the config.json keys that give the global layers' θ (context extension); None: no rotary
    global_theta_keys: Callable[["BertConfig", float], dict[str, Any]] | None = None
    # config fields besides the depth that say which layers a model has (ModernBERT's `layer_types`), for a model made
    # of some of another's layers (a distilled student): (config, kept layer indices) -> fields; None: depth alone
    layer_fields: Callable[["BertConfig", list[int]], dict[str, Any]] | None = None
    # a distilled student of a teacher of this family, (teacher config, its kept layers) -> the student's config;
    # None: a model of this family made of those layers (relative attention, rotary positions stay as they are)
    student: Callable[["BertConfig", list[int]], "BertConfig"] | None = None
    tokenizer: str = ""  # the name of its tokenizer kind (`bertforge.tokenizer.kinds`); "": its model_type
    # internal class names its `transformers` classes spell otherwise than class_prefix + the task (ELECTRA's
    # discriminator, BertForReplacedTokenDetection, is ElectraForPreTraining)
    class_names: dict[str, str] = field(default_factory=dict)
    # whether its `transformers` library has a ForMultipleChoice class: without one, a `BertForMultipleChoice` of it
    # still builds and reloads here, but the directory it saves names a class `transformers` lacks, so
    # `finetune --task multiple-choice` refuses the family
    multiple_choice: bool = True

    @property
    def tokenizer_kind(self) -> str:
        """The tokenizer kind a model of this family pretrains with (`kinds.kind_by_name`)."""
        return self.tokenizer or self.model_type

    def keep_layers(self, config: BertConfig, layers: list[int]) -> BertConfig:
        """The config of a model of this family made of `config`'s layers `layers` (in that order), each keeping
        what its own layer was (its attention kind, ...)."""
        fields = self.layer_fields(config, layers) if self.layer_fields is not None else {}
        return replace(config, num_hidden_layers=len(layers), **fields)

    def student_config(self, config: BertConfig, layers: list[int]) -> BertConfig:
        """The config of a distilled student of a teacher `config` that starts from its layers `layers`: the
        family's `student` (BERT's and RoBERTa's: a DistilBERT), else a model of this family (`keep_layers`)."""
        return (self.student or self.keep_layers)(config, layers)

    def spec(self, config: BertConfig) -> EncoderSpec:
        """The encoder a `BertConfig` of this family describes."""
        return (self.read_spec or bert_spec)(self, config)

    def file_state(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """A checkpoint's tensors with fused ones split (`unfuse`), before the key table renames them."""
        return self.unfuse(state) if self.unfuse is not None else state

    def saved_state(self, state: dict[str, Tensor], in_memory: bool = False) -> dict[str, Tensor]:
        """Tensors under the family's file names, with what it fuses joined (`fuse`), as they are written;
        `in_memory`: in the layout of its `transformers` class's modules (`memory_keys`, `memory_fuse`)."""
        fuse = (self.memory_fuse if self.memory_keys else self.fuse) if in_memory else self.fuse
        return fuse(state) if fuse is not None else state

    def architecture(self, internal: str) -> str:
        """`transformers`' class name for an internal class name: BertForMaskedLM -> RobertaForMaskedLM."""
        if internal in self.class_names:
            return self.class_names[internal]
        return self.class_prefix + internal.removeprefix("Bert") if internal.startswith("Bert") else internal

    def internal_architecture(self, name: str) -> str:
        """The inverse of `architecture`: RobertaForMaskedLM -> BertForMaskedLM."""
        renamed = {hf: internal for internal, hf in self.class_names.items()}
        if name in renamed:
            return renamed[name]
        return "Bert" + name.removeprefix(self.class_prefix) if name.startswith(self.class_prefix) else name

    @cached_property
    def _rules(self) -> tuple[list[tuple[re.Pattern[str], str]], ...]:
        def compile_rule(src: str, dst: str) -> tuple[re.Pattern[str], str]:
            pattern = "^" + re.escape(src).replace(r"\{n\}", r"(?P<n>\d+)")
            return re.compile(pattern), dst.replace("{n}", r"\g<n>")

        load = [compile_rule(hf, internal) for hf, internal in self.keys]
        save = [compile_rule(internal, hf) for hf, internal in self.keys]
        return load, save, [compile_rule(internal, hf) for hf, internal in self.memory_keys] + save

    def to_internal(self, key: str, own: dict[str, Any] | None = None) -> str | None:
        """A file key (legacy renames already applied) -> the internal name with the `bert.` prefix; None: not a
        parameter. `own`: the model's parameter names (with `bert.`), to choose between rules that both match."""
        if any(re.search(pattern, key) for pattern in self.dropped):
            return None
        if key.startswith(self.prefix + "."):
            key = INTERNAL_PREFIX + key[len(self.prefix) :]
        elif key.split(".", 1)[0] in self.body:
            key = f"{INTERNAL_PREFIX}.{key}"
        for pattern, repl in self._rules[0]:
            if pattern.match(key):
                new = pattern.sub(repl, key, count=1)
                if own is None or new in own:
                    return new
        return key

    def to_hf(self, key: str, in_memory: bool = False) -> str:
        """An internal name (with the `bert.` prefix) -> the family's file key (with its prefix); `in_memory`: the
        name in its `transformers` class's modules (`memory_keys`)."""
        for pattern, repl in self._rules[2 if in_memory else 1]:
            if pattern.match(key):
                key = pattern.sub(repl, key, count=1)
                break
        if key.startswith(INTERNAL_PREFIX + "."):
            key = self.prefix + key[len(INTERNAL_PREFIX) :]
        return key


def _parts(key: str, name: str) -> tuple[str, str] | None:
    """(stem, kind) where `key` is stem + name + "." + kind with `name` a whole segment path, else None."""
    stem, found, kind = key.rpartition(name + ".")
    return (stem, kind) if found and (not stem or stem.endswith(".")) else None


def split(state: dict[str, Tensor], fused: str, names: tuple[str, ...]) -> dict[str, Tensor]:
    """Each tensor `…fused.KIND` (a weight or bias) cut along its rows into len(names) equal pieces `…name.KIND`,
    in order: a checkpoint's fused projections, split for the encoder (and back, with `join`)."""
    out = {}
    for key, tensor in state.items():
        parts = _parts(key, fused)
        if parts is None:
            out[key] = tensor
            continue
        if tensor.shape[0] % len(names):
            raise BertforgeError(f"weight {key!r} has {tensor.shape[0]} rows, not {len(names)} pieces of equal size")
        stem, kind = parts
        for name, piece in zip(names, tensor.chunk(len(names))):
            out[f"{stem}{name}.{kind}"] = piece.contiguous()
    return out


def join(state: dict[str, Tensor], names: tuple[str, ...], fused: str) -> dict[str, Tensor]:
    """The inverse of `split`: the tensors `…name.KIND` of `names`, stacked in order into `…fused.KIND`."""
    out = {}
    for key, tensor in state.items():
        parts = _parts(key, names[0])
        if parts is None:
            if not any(_parts(key, name) for name in names[1:]):
                out[key] = tensor
            continue
        stem, kind = parts
        missing = [f"{stem}{name}.{kind}" for name in names[1:] if f"{stem}{name}.{kind}" not in state]
        if missing:
            raise BertforgeError(f"weight {key!r} has no {missing[0]!r} beside it")
        out[f"{stem}{fused}.{kind}"] = torch.cat([state[f"{stem}{name}.{kind}"] for name in names])
    return out


def bert_spec(family: Family, config: BertConfig) -> EncoderSpec:
    """BERT's encoder (post-LN, learned positions, a dense feed-forward, biases everywhere) with the member's
    positions and pooler, and ALBERT's factorised embeddings and shared layers where the config has them."""
    return EncoderSpec(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads, intermediate_size=config.intermediate_size,
        activation=config.hidden_act, max_positions=config.max_position_embeddings,
        embedding_size=config.embedding_size, type_vocab_size=config.type_vocab_size,
        pad_token_id=config.pad_token_id, positions=family.parts.positions,
        norm_eps=config.layer_norm_eps, layer_groups=config.num_hidden_groups,
        hidden_dropout=config.hidden_dropout_prob, attention_dropout=config.attention_probs_dropout_prob,
        pooler=family.parts.pooler, init_std=config.initializer_range,
        heads=HeadSpec(mlm_act=family.parts.mlm_act or config.hidden_act, sequence=family.parts.sequence_head,
                       sequence_act=family.parts.sequence_act, dropout_before_dense=family.parts.dropout_before_dense,
                       rtd_context=family.parts.rtd_context, choice=family.parts.choice_head),
    )


__all__ = ["INTERNAL_LAYER", "INTERNAL_PREFIX", "WRITTEN", "BertParts", "Family", "Generator", "Ladder", "Recipe", "bert_spec", "join", "split"]
