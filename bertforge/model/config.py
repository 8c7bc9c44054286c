"""`BertConfig`: the model's hyper-parameters, with the field names of Hugging Face's `config.json`."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import BertforgeError
from ..core.io import atomic_write_text, finish_pending_writes
from ..core.ops import ACTIVATIONS  # the activations the model implements, by their Hugging Face names
from .families import ALIASES, FAMILIES, LADDERS, Family, family
from .spec import EncoderSpec
from ..core.hub import model_path

CONFIG_NAME = "config.json"
ADAPTER_CONFIG = "adapter_config.json"  # what marks a PEFT adapter directory (`model.lora`)

ATTENTION_BACKENDS = ("sdpa", "eager")

# (layers, hidden, heads) of the presets; intermediate size is 4 x hidden.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

# Sanity limits: a config beyond them is a corrupt or hostile file, not a model anyone trains.
_MAX_VOCAB = 10_000_000
_MAX_HIDDEN = 65_536
_MAX_LAYERS = 1_000
_MAX_POSITIONS = 1_048_576


@dataclass
class BertConfig:
    vocab_size: int = 30522  # WordPiece vocabulary size, special tokens included
    hidden_size: int = 768  # width of every layer
    num_hidden_layers: int = 12  # encoder blocks
    num_attention_heads: int = 12  # heads per block; must divide hidden_size
    intermediate_size: int = 3072  # feed-forward inner width
    hidden_act: str = "gelu"  # feed-forward and MLM-transform activation (exact erf GELU)
    hidden_dropout_prob: float = 0.1  # dropout after embeddings, attention output and feed-forward
    attention_probs_dropout_prob: float = 0.1  # dropout on attention probabilities
    max_position_embeddings: int = 512  # longest sequence the position table covers
    type_vocab_size: int = 2  # segment ids (0 = sentence A, 1 = sentence B); 0: no token types (DistilBERT)
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02  # std of the normal init
    pad_token_id: int = 0
    num_labels: int = 2  # classification / token-classification heads
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    classifier_dropout: float | None = None  # None: use hidden_dropout_prob
    problem_type: str | None = None  # "regression" | "single_label_classification" | "multi_label_classification"
    attn_implementation: str = "sdpa"  # run-time choice, not written to config.json
    architectures: list[str] | None = None  # the internal (Bert*) class names; the family's names in config.json
    model_type: str = "bert"  # the family (`bertforge.model.families`): bert, roberta, xlm-roberta, distilbert, ...
    embedding_size: int | None = None  # ALBERT: embeddings of width E, projected to hidden_size; None: E = H
    num_hidden_groups: int | None = None  # ALBERT: layers share weights in this many groups; None: no sharing
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # unknown config.json keys, kept for saving

    def __post_init__(self) -> None:
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            self.num_labels = len(self.id2label)
            if self.label2id is None:
                self.label2id = {v: k for k, v in self.id2label.items()}
        if self.label2id is not None:
            self.label2id = {str(k): int(v) for k, v in self.label2id.items()}
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise `BertforgeError` naming the first field that is wrong."""

        def positive_int(name: str, limit: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise BertforgeError(f"config field {name!r} must be an integer, got {value!r}")
            if not 0 < value <= limit:
                raise BertforgeError(f"config field {name!r} must be between 1 and {limit:,}, got {value:,}")

        positive_int("vocab_size", _MAX_VOCAB)
        positive_int("hidden_size", _MAX_HIDDEN)
        positive_int("num_hidden_layers", _MAX_LAYERS)
        positive_int("num_attention_heads", _MAX_HIDDEN)
        positive_int("intermediate_size", 8 * _MAX_HIDDEN)
        positive_int("max_position_embeddings", _MAX_POSITIONS)
        if self.type_vocab_size != 0:  # 0: no token-type embeddings
            positive_int("type_vocab_size", 1024)
        positive_int("num_labels", _MAX_VOCAB)
        if self.model_type not in FAMILIES:
            raise BertforgeError(f"model_type {self.model_type!r} is not supported; supported: {', '.join(FAMILIES)}")
        if self.embedding_size is not None:
            positive_int("embedding_size", _MAX_HIDDEN)
        if self.num_hidden_groups is not None:
            positive_int("num_hidden_groups", self.num_hidden_layers)
        if self.hidden_size % self.num_attention_heads:
            raise BertforgeError(
                f"config field 'hidden_size' ({self.hidden_size}) must be divisible by "
                f"'num_attention_heads' ({self.num_attention_heads})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise BertforgeError(f"config field 'hidden_act' is {self.hidden_act!r}; supported: {', '.join(ACTIVATIONS)}")
        if self.attn_implementation not in ATTENTION_BACKENDS:
            raise BertforgeError(
                f"'attn_implementation' is {self.attn_implementation!r}; supported: {', '.join(ATTENTION_BACKENDS)}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is None and name == "classifier_dropout":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise BertforgeError(f"config field {name!r} must be a number in [0, 1), got {value!r}")
        for name in ("layer_norm_eps", "initializer_range"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < 1) or math.isnan(value):
                raise BertforgeError(f"config field {name!r} must be a small positive number, got {value!r}")
        if self.pad_token_id is not None and (
            isinstance(self.pad_token_id, bool)
            or not isinstance(self.pad_token_id, int)
            or not 0 <= self.pad_token_id < self.vocab_size
        ):
            raise BertforgeError(
                f"config field 'pad_token_id' must be an id in [0, vocab_size={self.vocab_size}), got {self.pad_token_id!r}"
            )
        if self.problem_type not in (None, "regression", "single_label_classification", "multi_label_classification"):
            raise BertforgeError(f"config field 'problem_type' has unknown value {self.problem_type!r}")
        if self.id2label is not None and sorted(self.id2label) != list(range(len(self.id2label))):
            raise BertforgeError("config field 'id2label' must map the ids 0..num_labels-1")
        self.spec  # noqa: B018 (the family reads its parts now: a setting it cannot follow fails here, named with its file)

    # ------------------------------------------------------------------ construction
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def family(self) -> Family:
        """What this model's family changes in the encoder (`bertforge.families`)."""
        return family(self.model_type)

    @property
    def spec(self) -> EncoderSpec:
        """The parts of the encoder this config describes (`bertforge.model.spec`), as its family reads them."""
        return self.family.spec(self)

    @property
    def embedding_dim(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def max_sequence_length(self) -> int:
        """The most tokens one sequence may have: the position table's size, less RoBERTa's offset."""
        return self.max_position_embeddings - self.position_offset

    def check_sequence_length(self, length: int, option: str) -> None:
        """Refuse `option` asking for sequences of `length` tokens beyond `max_sequence_length`, naming that limit."""
        if length > self.max_sequence_length:
            offset = f" less the {self.position_offset} positions its family skips" if self.position_offset else ""
            raise BertforgeError(
                f"{option} {length} exceeds the longest sequence the model takes ({self.max_sequence_length}, from "
                f"its max_position_embeddings {self.max_position_embeddings}{offset})"
            )

    @property
    def position_offset(self) -> int:
        """The first position id (RoBERTa's start after the padding id)."""
        return self.spec.position_offset

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "BertConfig":
        """A named size — tiny, mini, small, medium, base or large (intermediate = 4 x hidden; a family may say
        otherwise: ModernBERT's base and large are its own) — for BERT, or FAMILY-SIZE for another member (`roberta-tiny`, `albert-base`, ...), with that family's usual settings."""
        family_name, _, size = name.rpartition("-")
        if family_name in LADDERS:  # a published series: its sizes alone
            series, ladder = LADDERS[family_name]
            if size not in ladder.sizes:
                raise BertforgeError(f"unknown config preset {name!r}; {family_name} has the sizes "
                                     f"{', '.join(ladder.sizes)}")
            return cls(**{"model_type": series.model_type, **series.preset, **copy.deepcopy(ladder.sizes[size]),
                          **overrides})
        member = FAMILIES.get(family_name or "bert") or ALIASES.get(family_name)
        if member is None or size not in PRESETS and size not in member.sizes:
            sizes = ", ".join(PRESETS) + (f"; {family_name} also {', '.join(member.sizes)}" if member and member.sizes else "")
            raise BertforgeError(
                f"unknown config preset {name!r}; choose a size ({sizes}), optionally after a family and a dash "
                f"({', '.join(f + '-' for f in [*FAMILIES, *ALIASES])}), or a series' name and size "
                f"({', '.join(f'{n}-{next(iter(ladder.sizes))}' for n, (_, ladder) in LADDERS.items())})"
            )
        layers, hidden, heads, intermediate = member.sizes.get(size) or (
            *PRESETS[size], round(member.intermediate_ratio * PRESETS[size][1]))
        kwargs: dict[str, Any] = dict(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=intermediate,
            model_type=member.model_type, **member.preset,
        )
        if member.sized_preset is not None:
            kwargs.update(member.sized_preset(hidden))
        kwargs.update(overrides)
        return cls(**kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "BertConfig":
        if not isinstance(data, dict):
            raise BertforgeError(f"{source}: expected a JSON object, got {type(data).__name__}")
        member = family(data.get("model_type", "bert"), source)
        if data.get("position_embedding_type", "absolute") != "absolute":
            raise BertforgeError(
                f"{source}: position_embedding_type {data['position_embedding_type']!r} is not supported (only 'absolute')"
            )
        if data.get("inner_group_num", 1) != 1:
            raise BertforgeError(f"{source}: inner_group_num {data['inner_group_num']!r} is not supported (only 1)")
        data = {member.config_keys.get(k, k): v for k, v in data.items()}
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {**member.defaults, **{k: v for k, v in data.items() if k in known}}
        kwargs["model_type"] = member.model_type
        if kwargs.get("architectures") is not None and isinstance(kwargs["architectures"], list):
            kwargs["architectures"] = [member.internal_architecture(str(a)) for a in kwargs["architectures"]]
        extra = {k: v for k, v in data.items() if k not in known and k not in member.written}
        try:
            return cls(**kwargs, extra=extra)
        except BertforgeError as err:
            raise BertforgeError(f"{source}: {err}") from None
        except (TypeError, ValueError, AttributeError) as err:
            raise BertforgeError(f"{source}: invalid field value ({err})") from None

    @classmethod
    def from_pretrained(cls, path: str | Path, **overrides: Any) -> "BertConfig":
        """Read `config.json` from a directory (or the file itself); keyword overrides win. A PEFT adapter
        directory's config is its base model's with the head's fields saved beside the adapter (`model.lora`)."""
        path = model_path(path, weights=False)  # a snapshot holding the config only will do
        if path.is_dir() and (path / ADAPTER_CONFIG).is_file() and not (path / CONFIG_NAME).is_file():
            from .lora import adapted_config

            base, saved = adapted_config(path)
            return cls.from_pretrained(base, **{**saved, **overrides})
        file = path / CONFIG_NAME if path.is_dir() else path
        finish_pending_writes(file.parent)  # a save killed between its renames: its files, not a mix of two saves
        if not file.is_file():
            raise BertforgeError(f"{file}: no such config file")
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise BertforgeError(f"{file}: not valid JSON ({err})") from None
        except RecursionError:
            raise BertforgeError(f"{file}: not a model config (JSON nested too deeply)") from None
        except OSError as err:
            raise BertforgeError(f"{file}: cannot read it ({err.strerror or err})") from None
        if not isinstance(data, dict):
            raise BertforgeError(f"{file}: expected a JSON object")
        data.update(overrides)
        return cls.from_dict(data, source=str(file))

    def to_dict(self) -> dict[str, Any]:
        """The `config.json` contents, in the layout the family's `transformers` config class reads."""
        member = self.family
        names = {internal: name for name, internal in member.config_keys.items()}
        out: dict[str, Any] = dict(self.extra)
        for f in dataclasses.fields(self):
            if f.name in ("extra", "attn_implementation") or f.name in member.unused:
                continue
            value = getattr(self, f.name)
            if f.name in ("id2label", "label2id", "problem_type", "architectures", "embedding_size",
                          "num_hidden_groups") and value is None:
                continue
            if f.name == "id2label":
                value = {str(k): v for k, v in value.items()}
            if f.name == "architectures":
                value = [member.architecture(a) for a in value]
            if f.name == "classifier_dropout" and value is None and f.name in names:
                value = self.hidden_dropout_prob  # the family's classes need a number, and this is what None means
            out[names.get(f.name, f.name)] = value
        out.update(member.written)
        if member.write_config is not None:
            out = member.write_config(out, self)
        out.pop("_attn_implementation", None)
        out.pop("attn_implementation", None)
        return dict(sorted(out.items()))

    def save_pretrained(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path / CONFIG_NAME, json.dumps(self.to_dict(), indent=2) + "\n")
