"""Hugging Face checkpoint directories, both ways: `config.json` + `model.safetensors` (or shards, or a
`pytorch_model.bin` read with `weights_only=True`).

The variation found in published BERT files (TF-era names, buffers, tied decoders) is handled by one declarative
table, `KEY_RULES`, applied to every key of a checkpoint; then the family's adapter (`bertforge.model.families`)
splits what its files fuse and translates its names (`roberta.`, DistilBERT's `q_lin`, ALBERT's layer groups, ...)
to the encoder's, and back when saving.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .card import CARD_NAME, ModelCard, card_text, may_write_card
from .config import ADAPTER_CONFIG, CONFIG_NAME, BertConfig
from ..core.errors import BertforgeError
from .families import INTERNAL_PREFIX
from ..core.io import atomic_write_files
from ..core.linear import Int8Weight
from ..core.hub import model_path
from ..core.constants import PICKLE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

log = logging.getLogger("bertforge")


# (pattern, replacement) applied in order to each checkpoint key; a replacement of None drops the key.
KEY_RULES: list[tuple[str, str | None]] = [
    (r"^(.*LayerNorm)\.gamma$", r"\1.weight"),  # TF-era names
    (r"^(.*LayerNorm)\.beta$", r"\1.bias"),
    (r"(^|\.)embeddings\.(position_ids|token_type_ids)$", None),  # buffers, not weights
    (r"^cls\.predictions\.decoder\.weight$", None),  # tied to the word embeddings
    (r"^cls\.predictions\.decoder\.bias$", None),  # the same tensor as cls.predictions.bias
]
_BODY = ("embeddings.", "encoder.", "pooler.")  # the encoder's own (internal) parameter names start so


@dataclass
class LoadingInfo:
    missing_keys: list[str] = field(default_factory=list)  # initialised from scratch
    unexpected_keys: list[str] = field(default_factory=list)  # in the file, not used by this class
    source: str = ""
    mismatched_keys: list[str] = field(default_factory=list)  # head weights of another shape, initialised anew


def missing_weights(model: torch.nn.Module, prefix: str) -> bool:
    """Whether weights named `prefix...` were initialised because the checkpoint `model` was loaded from lacked
    them (its `loading_info`)."""
    info = getattr(model, "loading_info", None)
    return info is not None and any(key.startswith(prefix) for key in info.missing_keys)


def check_mlm_head(model: Any, source: str) -> None:
    """Raise BertforgeError when `model`'s MLM head was not in its checkpoint (what reads its logits: fill-mask,
    SPLADE's pipeline and training)."""
    if missing_weights(model, "cls.predictions."):
        architectures = ", ".join(model.config.architectures or []) or "no head"
        raise BertforgeError(
            f"{source} has no MLM head (cls.predictions.*; the checkpoint is {architectures}): pretrain one with "
            f"`bertforge pretrain --corpus FILE ...`, or use a checkpoint saved from BertForMaskedLM or "
            f"BertForPreTraining"
        )


def rename_key(key: str) -> str | None:
    for pattern, repl in KEY_RULES:
        if re.search(pattern, key):
            if repl is None:
                return None
            key = re.sub(pattern, repl, key)
    return key


def _checked_name(root: Path, name: Any, what: str) -> Path:
    """A file named inside a checkpoint must stay inside the checkpoint directory."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", "..") or "\0" in name:
        raise BertforgeError(f"{root / WEIGHTS_INDEX_NAME}: {what} {name!r} is not a plain file name in the model directory")
    return root / name


def read_state_dict(path: str | Path) -> tuple[dict[str, torch.Tensor], str]:
    """Read the weights of a checkpoint directory (or a single .safetensors/.bin file)."""
    path = Path(path)
    if path.is_dir():
        if (path / WEIGHTS_NAME).is_file():
            file = path / WEIGHTS_NAME
        elif (path / WEIGHTS_INDEX_NAME).is_file():
            return _read_sharded(path), str(path / WEIGHTS_INDEX_NAME)
        elif (path / PICKLE_WEIGHTS_NAME).is_file():
            file = path / PICKLE_WEIGHTS_NAME
        else:
            raise BertforgeError(f"{path}: no {WEIGHTS_NAME}, {WEIGHTS_INDEX_NAME} or {PICKLE_WEIGHTS_NAME} in this directory")
    elif path.is_file():
        file = path
    else:
        raise BertforgeError(f"{path}: no such model directory or file")
    if file.suffix == ".bin":
        return _read_pickle_weights(file), str(file)
    return _read_safetensors(file), str(file)


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise BertforgeError(f"{file}: not a readable safetensors file ({err})") from None


def _read_pickle_weights(file: Path) -> dict[str, torch.Tensor]:
    """`pytorch_model.bin` only through PyTorch's restricted unpickler: tensors and plain containers, no code."""
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=False)
    except Exception as err:  # the restricted unpickler raises many types; all mean "refused"
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        # PyTorch's message opens with advice to turn the check off and ends with a pointer to its docs; the line
        # between them names what was refused ("unsupported GLOBAL posix.system ...")
        advice = ("Weights only load failed", "Please file an issue", "Check the documentation")
        reason = next((line for line in lines if not line.startswith(advice)), lines[0] if lines else type(err).__name__)
        raise BertforgeError(f"{file}: refused to load (only plain tensors are accepted; {reason})") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise BertforgeError(f"{file}: expected a dictionary of named tensors")
    return state


def _read_sharded(root: Path) -> dict[str, torch.Tensor]:
    index_file = root / WEIGHTS_INDEX_NAME
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
        weight_map = index["weight_map"]
        assert isinstance(weight_map, dict)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, KeyError, TypeError, AssertionError):
        raise BertforgeError(f"{index_file}: not a valid shard index (expected a JSON object with 'weight_map')") from None
    names = list(weight_map.values())
    for shard in names:  # every name is checked before set() could meet an unhashable one (a list, a dict)
        _checked_name(root, shard, "shard")
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(names)):
        file = root / shard
        if not file.is_file():
            raise BertforgeError(f"{index_file}: shard {shard!r} is missing")
        state.update(_read_safetensors(file))
    return state


def convert_state_dict(
    state: dict[str, torch.Tensor], model: torch.nn.Module, source: str, ignore_mismatched_sizes: bool = False
) -> tuple[dict[str, torch.Tensor], LoadingInfo]:
    """Map checkpoint keys onto `model`'s names; check shapes. Returns the usable tensors and what was missing.

    A shape mismatch is an error, except that with `ignore_mismatched_sizes` a head weight (a classifier with
    another number of labels) is left out, to be initialised anew; the encoder's weights must always fit."""
    own = model.state_dict()
    member: Any = model.config.family  # type: ignore[union-attr]
    with_prefix = any(k.startswith("bert.") for k in own)
    own_full = set(own) if with_prefix else {f"{INTERNAL_PREFIX}.{k}" for k in own}  # with the `bert.` prefix
    mapped: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    mismatched: list[str] = []  # "name [file shape] -> [model shape]"
    replaced: set[str] = set()  # their names
    for key, tensor in member.file_state(state).items():
        new = rename_key(key)
        new = member.to_internal(new, own_full) if new is not None else None
        if new is None:
            continue
        if not with_prefix:
            new = new.removeprefix(INTERNAL_PREFIX + ".")
        if new not in own:
            unexpected.append(key)
            continue
        if tuple(tensor.shape) != tuple(own[new].shape):
            in_body = new.removeprefix("bert.").startswith(_BODY)
            if ignore_mismatched_sizes and not in_body:
                mismatched.append(f"{new} {list(tensor.shape)} -> {list(own[new].shape)}")
                replaced.add(new)
                continue
            hint = (
                "does config.json match the weights?"
                if in_body
                else "a head trained for other labels? ignore_mismatched_sizes=True replaces it with a new one"
            )
            raise BertforgeError(
                f"{source}: weight {key!r} has shape {list(tensor.shape)}, the model expects {list(own[new].shape)} ({hint})"
            )
        if not tensor.is_floating_point():  # complex would lose its imaginary part without a word
            raise BertforgeError(f"{source}: weight {key!r} has non-float dtype {tensor.dtype}")
        mapped[new] = tensor
    missing = [k for k in own if k not in mapped and k not in replaced]
    return mapped, LoadingInfo(missing, unexpected, source, mismatched)


M = TypeVar("M", bound=torch.nn.Module)


def load_pretrained(
    cls: type[M], path: str | Path, *, ignore_mismatched_sizes: bool = False, quiet: bool = False, **overrides: Any
) -> M:
    """Build `cls` from a checkpoint directory; heads absent from the file are initialised and reported.

    The one loader every caller uses (`from_pretrained`, fine-tuning, the pipelines, ONNX export). `overrides`
    change config fields (`num_labels=5`, ...). `ignore_mismatched_sizes=True` lets a head of another shape in the
    file (a classifier trained for other labels) be replaced by a new one instead of an error. `quiet` leaves the
    "newly initialised" warning out (for callers that check `model.loading_info` themselves).

    The model is built without storage (on the meta device) and matched against the file first: a config.json
    whose sizes disagree with the weights (or a hostile one: a 10-million-word vocabulary, 1,000 layers) is refused
    before anything is allocated. Then the file's tensors become the parameters, and only the weights the file
    lacks are allocated and initialised (no random init of a vocabulary-sized embedding that is overwritten).
    """
    path = model_path(path)
    if not path.exists():
        raise BertforgeError(f"{path}: no such model directory")
    if path.is_dir() and (path / ADAPTER_CONFIG).is_file() and not (path / CONFIG_NAME).is_file():
        from .lora import load_adapted  # a PEFT adapter directory: its base model with the adapters on it

        return load_adapted(cls, path, quiet=quiet, **overrides)
    config_dir = path if path.is_dir() else path.parent
    config = BertConfig.from_pretrained(config_dir, **overrides)
    state, source = read_state_dict(path)
    with torch.device("meta"):
        model = cls(config)
    mapped, info = convert_state_dict(state, model, source, ignore_mismatched_sizes)
    if not mapped:
        raise BertforgeError(f"{source}: none of its weights belong to a {config.family.name} model")
    body_missing = [k for k in info.missing_keys if k.removeprefix("bert.").startswith(("embeddings.", "encoder."))]
    if body_missing:
        raise BertforgeError(
            f"{source}: the encoder weights are incomplete; missing {body_missing[:3]} and "
            f"{len(body_missing) - len(body_missing[:3])} more (does config.json match the weights?)"
        )
    model.load_state_dict(_own_tensors(mapped, model.state_dict(), source), strict=False, assign=True)
    initialise_missing(model)
    model.loading_info = info  # type: ignore[assignment]
    _report(cls.__name__, info, quiet)
    return model


def initialise_missing(model: torch.nn.Module) -> list[str]:
    """Allocate and initialise the parameters of a model built on the meta device that were given no tensor
    (missing from a file, or of another shape); returns their names."""
    fresh = [name for name, p in model.named_parameters() if p.is_meta]
    for name in fresh:
        owner, _, attr = name.rpartition(".")
        old = getattr(model.get_submodule(owner), attr)
        setattr(model.get_submodule(owner), attr, torch.nn.Parameter(torch.empty(old.shape, dtype=old.dtype)))
    model.init_weights(only=set(fresh))  # type: ignore[operator]
    return fresh


def _own_tensors(mapped: dict[str, torch.Tensor], own: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """The file's tensors in the model's dtypes, each with storage of its own, all finite."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, tensor in mapped.items():
        t = tensor.to(own[key].dtype).contiguous()
        if t.data_ptr() in seen:  # a pickle may store two weights as one tensor: parameters must not share it
            t = t.clone()
        seen.add(t.data_ptr())
        out[key] = t
    bad = nonfinite_tensors(out)  # in the model's dtype: float64 beyond float32's range only becomes inf there
    if bad:
        raise BertforgeError(f"{source}: the weights contain NaN or infinite values (first: {bad[0]!r})")
    return out


def nonfinite_tensors(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors of `tensors` (a state dict) holding a NaN or an infinity."""
    return [k for k, v in tensors.items() if torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(v).all())]


def _report(name: str, info: LoadingInfo, quiet: bool) -> None:
    if info.missing_keys and not quiet:
        log.warning(
            "%s: weights not in the checkpoint, newly initialised (train them before use): %s",
            name,
            ", ".join(info.missing_keys),
        )
    if info.mismatched_keys:
        log.warning("%s: checkpoint head weights of another shape, newly initialised: %s", name, ", ".join(info.mismatched_keys))
    if info.unexpected_keys:
        log.info("%s: checkpoint weights not used by this class: %s", name, ", ".join(info.unexpected_keys))


def file_state(model: torch.nn.Module, state: dict[str, torch.Tensor], in_memory: bool = False) -> dict[str, torch.Tensor]:
    """`state` (some of `model`'s tensors, by internal name) under the names its family's files give them, with
    what the family fuses joined: what `save_pretrained` writes; `in_memory`: as its `transformers` class holds
    them (the modules PEFT adapts)."""
    member: Any = model.config.family  # type: ignore[union-attr]
    with_prefix = any(k.startswith(INTERNAL_PREFIX + ".") for k in model.state_dict())

    def file_key(key: str) -> str:
        key = member.to_hf(key if with_prefix else f"{INTERNAL_PREFIX}.{key}", in_memory)
        return key if with_prefix else key.removeprefix(member.prefix + ".")

    return member.saved_state({file_key(k): v for k, v in state.items()}, in_memory)


def save_pretrained(model: torch.nn.Module, path: str | Path, card: ModelCard | None = None) -> None:
    """Write `config.json` + `model.safetensors` that the family's `transformers` class of the same task (BertForMaskedLM
    → RobertaForMaskedLM for a RoBERTa config) loads as they are: parameter names through the family's table; and the
    model card, README.md (`card`: what the caller knows of the model; a README.md bertforge did not write stays)."""
    path = Path(path)
    if any(isinstance(getattr(m, "weight", None), Int8Weight) for m in model.modules()):
        raise BertforgeError(f"{path}: not saved: the model's dense layers are quantized to int8 for inference "
                             "(its checkpoint would lack them); save the float32 model it was made from")
    from .lora import has_adapters

    if has_adapters(model):
        raise BertforgeError(f"{path}: not saved: the model has low-rank adapters; save them with lora.save_adapter, "
                             "or merge them into the weights first (lora.merge_adapters)")
    # the file's config names the class; the model's own config is left as it is (loaded configs are not changed)
    loaded: BertConfig = model.config  # type: ignore[assignment]
    config = dataclasses.replace(loaded, architectures=[type(model).__name__])
    state = file_state(model, {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()})
    config_text = json.dumps(config.to_dict(), indent=2) + "\n"
    # both files are written before either replaces its old version: a full disk cannot leave new weights
    # beside an old config.json (or the reverse)
    files = {
        WEIGHTS_NAME: lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}),
        CONFIG_NAME: lambda tmp: tmp.write_text(config_text, encoding="utf-8"),
    }
    if may_write_card(path):
        from .. import __version__

        card_md = card_text(model, card or ModelCard(), __version__)
        files[CARD_NAME] = lambda tmp: tmp.write_text(card_md, encoding="utf-8")
    atomic_write_files(path, files)


__all__ = ["KEY_RULES", "LoadingInfo", "file_state", "initialise_missing", "load_pretrained", "read_state_dict", "save_pretrained", "CONFIG_NAME"]
