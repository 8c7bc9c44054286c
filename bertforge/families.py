"""The BERT family, declared as data: what each member changes, in one place.

bertforge has one encoder (`model.py`) whose parts are chosen by the config: how positions are counted, whether
there are token types and a pooler, embedding factorisation (E → H), layer sharing, the activation of the MLM head,
the shape of the sequence-classification head. A `Family` names those choices for one member, its `config.json`
field names and defaults, and one declarative table translating its Hugging Face parameter names to the encoder's
own (BERT's) names. Adding a member is a `Family` value, plus a part in `model.py` only where it truly needs one.

Key tables: `(hf, internal)` pairs of key prefixes, `{n}` standing for a layer number. Reading a checkpoint, a key
first has the family's prefix (`roberta.`, `albert.`, ...) replaced by `bert.`, then the first rule whose `hf` side
matches it and whose result is a parameter of the model being loaded renames it (so DistilBERT's `classifier.` can
be the sequence head's output layer or the token classifier, whichever the model has). Saving runs the same table
the other way. Keys matched by no rule keep their name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .errors import BertforgeError

INTERNAL_PREFIX = "bert"  # the encoder's attribute in every head class, so `bert.` in internal parameter names


@dataclass(frozen=True)
class Family:
    model_type: str  # "model_type" in config.json
    name: str  # as messages and the README name it
    class_prefix: str  # of its `transformers` classes: "Roberta" + "ForMaskedLM"
    prefix: str  # its base model's attribute in `transformers`' head classes: "roberta.encoder.layer.0..."
    body: tuple[str, ...] = ("embeddings", "encoder", "pooler")  # first key segments of a bare base model's file
    # parts of the encoder
    positions_after_padding: bool = False  # RoBERTa: position ids count from pad_token_id + 1, padding keeps pad_token_id
    pooler: bool = True  # a tanh dense layer on the first token in the base model
    sequence_head: str = "pooler"  # "pooler": dropout → linear on the pooled output; "first-token": an MLP on token 0
    sequence_head_act: str = "tanh"  # the first-token head's hidden activation (RoBERTa tanh, DistilBERT relu)
    dropout_before_head_dense: bool = True  # RoBERTa drops out token 0 before the head's dense layer, DistilBERT not
    mlm_head_act: str | None = None  # the MLM transform's activation; None: the config's hidden_act
    sentence_head: str | None = "NSP"  # the pretraining sentence objective ("NSP", "SOP") or None: MLM only
    # config.json
    config_keys: dict[str, str] = field(default_factory=dict)  # its field name -> the internal (BertConfig) name
    defaults: dict[str, Any] = field(default_factory=dict)  # `transformers`' defaults for fields a file may omit
    unused: tuple[str, ...] = ()  # internal fields the family does not have (not written to its config.json)
    # parameter names
    keys: tuple[tuple[str, str], ...] = ()  # (hf, internal) key prefixes, {n} = a layer number
    dropped: tuple[str, ...] = ()  # regexes of file keys that are not parameters here (tied decoders)
    preset: dict[str, Any] = field(default_factory=dict)  # what `--config FAMILY-SIZE` sets besides the size
    recipe: dict[str, Any] = field(default_factory=dict)  # pretraining settings "auto" means: masking, adam_beta2

    def architecture(self, internal: str) -> str:
        """`transformers`' class name for an internal class name: BertForMaskedLM -> RobertaForMaskedLM."""
        return self.class_prefix + internal.removeprefix("Bert") if internal.startswith("Bert") else internal

    def internal_architecture(self, name: str) -> str:
        """The inverse of `architecture`: RobertaForMaskedLM -> BertForMaskedLM."""
        return "Bert" + name.removeprefix(self.class_prefix) if name.startswith(self.class_prefix) else name

    @cached_property
    def _rules(self) -> tuple[list[tuple[re.Pattern[str], str]], list[tuple[re.Pattern[str], str]]]:
        def compile_rule(src: str, dst: str) -> tuple[re.Pattern[str], str]:
            pattern = "^" + re.escape(src).replace(r"\{n\}", r"(?P<n>\d+)")
            return re.compile(pattern), dst.replace("{n}", r"\g<n>")

        load = [compile_rule(hf, internal) for hf, internal in self.keys]
        save = [compile_rule(internal, hf) for hf, internal in self.keys]
        return load, save

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

    def to_hf(self, key: str) -> str:
        """An internal name (with the `bert.` prefix) -> the family's file key (with its prefix)."""
        for pattern, repl in self._rules[1]:
            if pattern.match(key):
                key = pattern.sub(repl, key, count=1)
                break
        if key.startswith(INTERNAL_PREFIX + "."):
            key = self.prefix + key[len(INTERNAL_PREFIX) :]
        return key


BERT = Family(model_type="bert", name="BERT", class_prefix="Bert", prefix="bert")

_ROBERTA_KEYS = (
    ("lm_head.dense.", "cls.predictions.transform.dense."),
    ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
    ("lm_head.bias", "cls.predictions.bias"),
)
_ROBERTA_PARTS: dict[str, Any] = dict(
    prefix="roberta",
    positions_after_padding=True,
    sequence_head="first-token",
    mlm_head_act="gelu",
    sentence_head=None,
    keys=_ROBERTA_KEYS,
    dropped=(r"^lm_head\.decoder\.(weight|bias)$",),
    # roberta-base's: 512 positions after the padding offset, one token type, eps 1e-5
    preset=dict(max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1),
    recipe=dict(adam_beta2=0.98),  # the RoBERTa paper's, for stability with large batches
)
# `transformers.RobertaConfig`'s defaults (roberta-base itself sets 514 positions, 1 token type, eps 1e-5)
_ROBERTA_DEFAULTS: dict[str, Any] = dict(vocab_size=50265, pad_token_id=1)

ROBERTA = Family(
    model_type="roberta", name="RoBERTa", class_prefix="Roberta", defaults=_ROBERTA_DEFAULTS, **_ROBERTA_PARTS
)
XLM_ROBERTA = Family(
    model_type="xlm-roberta",
    name="XLM-RoBERTa",
    class_prefix="XLMRoberta",
    defaults=dict(_ROBERTA_DEFAULTS, vocab_size=30522),
    **_ROBERTA_PARTS,
)

_DISTIL_LAYER = "bert.transformer.layer.{n}."
_BERT_LAYER = "bert.encoder.layer.{n}."
DISTILBERT = Family(
    model_type="distilbert",
    name="DistilBERT",
    class_prefix="DistilBert",
    prefix="distilbert",
    body=("embeddings", "transformer"),
    pooler=False,
    sequence_head="first-token",
    sequence_head_act="relu",
    dropout_before_head_dense=False,
    sentence_head=None,
    config_keys=dict(
        dim="hidden_size",
        n_layers="num_hidden_layers",
        n_heads="num_attention_heads",
        hidden_dim="intermediate_size",
        activation="hidden_act",
        dropout="hidden_dropout_prob",
        attention_dropout="attention_probs_dropout_prob",
        seq_classif_dropout="classifier_dropout",
    ),
    defaults=dict(
        vocab_size=30522, hidden_size=768, num_hidden_layers=6, num_attention_heads=12, intermediate_size=3072,
        hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, classifier_dropout=0.2,
        type_vocab_size=0, layer_norm_eps=1e-12,
    ),
    unused=("type_vocab_size", "layer_norm_eps", "embedding_size", "num_hidden_groups"),
    keys=(
        (_DISTIL_LAYER + "attention.q_lin.", _BERT_LAYER + "attention.self.query."),
        (_DISTIL_LAYER + "attention.k_lin.", _BERT_LAYER + "attention.self.key."),
        (_DISTIL_LAYER + "attention.v_lin.", _BERT_LAYER + "attention.self.value."),
        (_DISTIL_LAYER + "attention.out_lin.", _BERT_LAYER + "attention.output.dense."),
        (_DISTIL_LAYER + "sa_layer_norm.", _BERT_LAYER + "attention.output.LayerNorm."),
        (_DISTIL_LAYER + "ffn.lin1.", _BERT_LAYER + "intermediate.dense."),
        (_DISTIL_LAYER + "ffn.lin2.", _BERT_LAYER + "output.dense."),
        (_DISTIL_LAYER + "output_layer_norm.", _BERT_LAYER + "output.LayerNorm."),
        ("vocab_transform.", "cls.predictions.transform.dense."),
        ("vocab_layer_norm.", "cls.predictions.transform.LayerNorm."),
        ("vocab_projector.bias", "cls.predictions.bias"),
        ("pre_classifier.", "classifier.dense."),
        ("classifier.", "classifier.out_proj."),  # the sequence head's; a token classifier keeps `classifier.`
    ),
    dropped=(r"^vocab_projector\.weight$",),
    preset=dict(type_vocab_size=0, classifier_dropout=0.2),
)

_ALBERT_LAYER = "bert.encoder.albert_layer_groups.{n}.albert_layers.0."
ALBERT = Family(
    model_type="albert",
    name="ALBERT",
    class_prefix="Albert",
    prefix="albert",
    sentence_head="SOP",
    config_keys=dict(classifier_dropout_prob="classifier_dropout"),
    defaults=dict(  # `transformers.AlbertConfig`'s (albert-xxlarge's sizes)
        vocab_size=30000, embedding_size=128, hidden_size=4096, num_hidden_layers=12, num_hidden_groups=1,
        num_attention_heads=64, intermediate_size=16384, hidden_act="gelu_new", hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, classifier_dropout=0.1,
    ),
    keys=(
        ("bert.encoder.embedding_hidden_mapping_in.", "bert.encoder.embedding_projection."),
        (_ALBERT_LAYER + "attention.query.", _BERT_LAYER + "attention.self.query."),
        (_ALBERT_LAYER + "attention.key.", _BERT_LAYER + "attention.self.key."),
        (_ALBERT_LAYER + "attention.value.", _BERT_LAYER + "attention.self.value."),
        (_ALBERT_LAYER + "attention.dense.", _BERT_LAYER + "attention.output.dense."),
        (_ALBERT_LAYER + "attention.LayerNorm.", _BERT_LAYER + "attention.output.LayerNorm."),
        (_ALBERT_LAYER + "ffn.", _BERT_LAYER + "intermediate.dense."),
        (_ALBERT_LAYER + "ffn_output.", _BERT_LAYER + "output.dense."),
        (_ALBERT_LAYER + "full_layer_layer_norm.", _BERT_LAYER + "output.LayerNorm."),
        ("bert.pooler.", "bert.pooler.dense."),
        ("predictions.dense.", "cls.predictions.transform.dense."),
        ("predictions.LayerNorm.", "cls.predictions.transform.LayerNorm."),
        ("predictions.bias", "cls.predictions.bias"),
        ("sop_classifier.classifier.", "cls.seq_relationship."),
    ),
    dropped=(r"^predictions\.decoder\.(weight|bias)$",),
    # ALBERT v2's: one shared layer group, GELU (tanh), no dropout; E = 128 (less for the small sizes)
    preset=dict(
        num_hidden_groups=1, hidden_act="gelu_new", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        classifier_dropout=0.1,
    ),
    recipe=dict(masking="ngram"),
)

FAMILIES: dict[str, Family] = {f.model_type: f for f in (BERT, ROBERTA, XLM_ROBERTA, DISTILBERT, ALBERT)}


def family(model_type: str | None, source: str = "config") -> Family:
    """The `Family` of a config's `model_type` (None: BERT), or an error naming the supported ones."""
    if model_type is None:
        return BERT
    try:
        return FAMILIES[model_type]
    except (KeyError, TypeError):
        raise BertforgeError(
            f"{source}: model_type {model_type!r} is not supported; supported: {', '.join(FAMILIES)}"
        ) from None


__all__ = ["ALBERT", "BERT", "DISTILBERT", "FAMILIES", "Family", "ROBERTA", "XLM_ROBERTA", "family"]
