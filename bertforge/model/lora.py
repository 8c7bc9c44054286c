"""Low-rank adapters (LoRA, Hu et al., 2021) on the encoder's dense layers, in PEFT's layout on disk.

A LoRA on a dense layer y = x Wᵀ + b adds (α / r) · B A dropout(x), with A [r, in] drawn as PEFT draws it and
B [out, r] zero, so that training starts from the base model's outputs; only A and B (and the task head) train.
`add_adapters(model, LoraSettings(...))` attaches them to the blocks' projections named by role (`ROLES`: query,
key, value, attention_out, ffn_in, ffn_out), in place; `merge_adapters` folds them into the weights (a plain model
again, as fast as the base); `save_adapter` / `load_adapter` write and read PEFT's directory
(`adapter_config.json` + `adapter_model.safetensors`) that `peft.PeftModel.from_pretrained` loads onto the
family's `transformers` class, and that `peft` writes.

PEFT adapts the modules of the `transformers` class, which may fuse the encoder's projections (ModernBERT's
`attn.Wqkv`) or split them otherwise (NomicBERT's and GTE's separate `gate_proj` and `up_proj`, the halves of the
encoder's one gated layer). Which rows of which module each projection's output is comes from the family's own
checkpoint adapter (`checkpoint.file_state` with `in_memory`, run once on tensors that carry their own name and
row: `file_layers`), never from a table here. One adapter is then one PEFT module: a fused layer's A is shared by
its projections and its B cut by their rows. Such a layer can only be adapted whole (query, key and value together
for ModernBERT). In a shared layer each projection
draws its own dropout mask on the input, where PEFT draws one for the fused layer; with dropout 0 (and in
evaluation always) the outputs are PEFT's.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn

from ..core.errors import BertforgeError
from ..core.hub import looks_like_hub_id, split_revision
from ..core.io import atomic_write_files
from ..core.linear import linear
from ..core.ops import activation_fn, dropout
from .config import ADAPTER_CONFIG
from .checkpoint import _read_safetensors, convert_state_dict, file_state, nonfinite_tensors
from .parts import Dense

#: the dense layers of a block an adapter can attach to (`BertLayer.projections`)
ROLES = ("query", "key", "value", "attention_out", "ffn_in", "ffn_out")
DEFAULT_TARGETS = ("query", "value")  # PEFT's (and the LoRA paper's) default for BERT
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTED_CONFIG = "adapted_config.json"  # bertforge's: the adapted model's config fields its base lacks (labels)
#: the config.json fields `ADAPTED_CONFIG` keeps: what the task head adds to the base model's config
HEAD_FIELDS = ("architectures", "num_labels", "id2label", "label2id", "problem_type", "classifier_dropout",
               "finetuning_task")
PEFT_PREFIX = "base_model.model."  # PEFT's names: this, then the `transformers` module's, then lora_A.weight
#: PEFT's task_type by the internal class of the model adapted
TASK_TYPES = {"BertForSequenceClassification": "SEQ_CLS", "BertForTokenClassification": "TOKEN_CLS",
              "BertForQuestionAnswering": "QUESTION_ANS", "BertModel": "FEATURE_EXTRACTION"}
M = TypeVar("M", bound=nn.Module)
_ROW_BITS = 24  # a tagged tensor's value: (key index << 24) + row (float64 holds it exactly)


@dataclass(frozen=True)
class LoraSettings:
    """What `--lora-rank`, `--lora-alpha`, `--lora-dropout` and `--lora-targets` say: adapters of rank `rank`
    scaled by alpha / rank, with dropout on their input, on the projections `targets` (of `ROLES`) of every
    block."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise BertforgeError(f"lora rank must be a positive integer, got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise BertforgeError(f"lora alpha must be a positive number, got {self.alpha!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise BertforgeError(f"lora dropout must be in [0, 1), got {self.dropout!r}")
        targets = tuple(self.targets)
        unknown = [t for t in targets if t not in ROLES]
        if not targets or unknown:
            raise BertforgeError(f"lora targets must name some of {', '.join(ROLES)}; got {list(targets)!r}")
        object.__setattr__(self, "targets", tuple(dict.fromkeys(targets)))


class LoRA(nn.Module):
    """One adapter, PEFT's module: lora_A [r, in] (Kaiming-uniform, PEFT's draw) and lora_B [out, r] (zero).
    `name`: the `transformers` module it adapts (its PEFT name without the prefix)."""

    def __init__(self, name: str, n_in: int, n_out: int, rank: int, alpha: float, p: float = 0.0) -> None:
        super().__init__()
        self.name = name
        self.lora_A = nn.Parameter(torch.empty(rank, n_in))
        self.lora_B = nn.Parameter(torch.zeros(n_out, rank))
        self.rank, self.alpha, self.p = rank, float(alpha), float(p)
        self.scale = self.alpha / rank
        if not self.lora_A.is_meta:
            self.init_parameter("lora_A", self.lora_A, None)

    def init_parameter(self, name: str, param: Tensor, spec: Any) -> None:
        with torch.no_grad():
            if name == "lora_A":
                nn.init.kaiming_uniform_(param, a=math.sqrt(5))
            else:
                param.zero_()

    def forward(self, x: Tensor, rows: slice) -> Tensor:
        """x [..., in] → scale · B[rows] A dropout(x) [..., len(rows)]."""
        h = linear(dropout(x, self.p, self.training), self.lora_A)  # [..., r]
        return linear(h, self.lora_B[rows]) * self.scale

    def delta(self, rows: slice) -> Tensor:
        """scale · B[rows] A: what merging adds to the weight's matching rows, [len(rows), in]."""
        return (self.lora_B[rows] @ self.lora_A) * self.scale


@dataclass(frozen=True)
class Piece:
    """Rows `source` of an adapter's output are rows `target` of a projection's."""

    lora: LoRA
    source: slice
    target: slice


class LoraDense(Dense):
    """A projection with adapters: act(x Wᵀ + b + its pieces' outputs on their rows) (+ residual). The weight and
    bias are the base layer's parameters under the same names; the adapters it owns are `adapters`, those it
    shares with another projection of a fused file layer (owned by the first) are only among its `pieces`."""

    def __init__(self, base: Dense, pieces: list[Piece], owned: list[LoRA]) -> None:
        nn.Module.__init__(self)
        self.weight, self.bias, self.act, self.role = base.weight, base.bias, base.act, base.role
        self.adapters = nn.ModuleList(owned)
        self.pieces = pieces  # a plain list: the modules are registered once, by their owners

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        y = linear(x, self.weight, self.bias)  # [..., out]
        n = y.shape[-1]
        for piece in self.pieces:
            d = piece.lora(x, piece.source)
            start, stop, _ = piece.target.indices(n)
            y = y + (d if (start, stop) == (0, n) else F.pad(d, (start, n - stop)))
        if self.act is not None:
            y = activation_fn(self.act)(y)
        return y if residual is None else y + residual

    def merged(self) -> Dense:
        """A plain `Dense` whose weight is W plus every piece's delta on its rows."""
        out = Dense(self.weight.shape[1], self.weight.shape[0], self.bias is not None, act=self.act, role=self.role)
        with torch.no_grad():
            weight = self.weight.detach().clone()
            for piece in self.pieces:
                weight[piece.target] += piece.lora.delta(piece.source).to(weight.dtype)
            out.weight = nn.Parameter(weight, requires_grad=self.weight.requires_grad)
            out.bias = self.bias
        return out


# ------------------------------------------------------------------------------------- which file layer is which
@dataclass(frozen=True)
class Run:
    """Rows `source` of the file layer are rows `target` of the internal projection `dense` (a module name)."""

    dense: str
    source: tuple[int, int]
    target: tuple[int, int]


def projection_names(model: nn.Module) -> dict[str, str]:
    """The internal module name of each block's projection → its role."""
    names = {id(m): n for n, m in model.named_modules()}
    return {names[id(m)]: role for block in model.blocks() for role, m in block.projections().items()}  # type: ignore[operator]


def _tagged_file_state(model: nn.Module) -> tuple[list[str], dict[str, Tensor]]:
    """The model's internal keys (adapters left out), and its state under its `transformers` class's module names
    with each tensor [rows, 1, ...] holding (the index of its internal key << 24) + its row there, in float64."""
    own = {k: v for k, v in model.state_dict().items() if ".adapters." not in k}
    keys = list(own)
    tagged = {}
    for i, key in enumerate(keys):
        shape = own[key].shape
        if shape:
            rows = torch.arange(shape[0], dtype=torch.float64) + float(i << _ROW_BITS)
            tagged[key] = rows.view(-1, *([1] * (len(shape) - 1)))
    return keys, file_state(model, tagged, in_memory=True)


def file_layers(model: nn.Module) -> dict[str, list[Run]]:
    """Each `transformers` module (PEFT's name, without its prefix) holding rows of the blocks' projections → where
    its rows are: the family's checkpoint adapter run on tensors that carry their own key and row."""
    keys, tagged = _tagged_file_state(model)
    weights = {f"{name}.weight": name for name in projection_names(model)}
    layers: dict[str, list[Run]] = {}
    for file_key, tensor in tagged.items():
        if not file_key.endswith(".weight") or tensor.dim() != 2:
            continue
        values = tensor[:, 0].long()
        index, row = (values >> _ROW_BITS).tolist(), (values & ((1 << _ROW_BITS) - 1)).tolist()
        sources = {keys[i] for i in index}
        if not sources & set(weights):
            continue
        if not sources <= set(weights):
            continue  # a layer mixing projections with other weights: not adaptable here
        runs: list[Run] = []
        start = 0
        for r in range(1, len(row) + 1):  # cut where the source key changes or its rows stop being consecutive
            if r == len(row) or index[r] != index[start] or row[r] != row[r - 1] + 1:
                runs.append(Run(weights[keys[index[start]]], (start, r), (row[start], row[r - 1] + 1)))
                start = r
        layers[file_key.removesuffix(".weight")] = runs
    return layers


def _adapt(model: nn.Module, layers: dict[str, list[Run]], make: Any) -> list[LoRA]:
    """Attach one `LoRA` (made by `make(name, n_in, n_out)`) per file layer of `layers`, in place."""
    pieces: dict[str, list[Piece]] = {}
    owned: dict[str, list[LoRA]] = {}
    made = []
    for name, runs in layers.items():
        first: Any = model.get_submodule(runs[0].dense)
        n_out = max(run.source[1] for run in runs)
        lora = make(name, first.weight.shape[1], n_out)
        made.append(lora)
        owned.setdefault(runs[0].dense, []).append(lora)
        for run in runs:
            pieces.setdefault(run.dense, []).append(Piece(lora, slice(*run.source), slice(*run.target)))
    for dense, its in pieces.items():
        module: Any = model.get_submodule(dense)
        if isinstance(module, LoraDense):
            raise BertforgeError(f"{dense}: this model has adapters already (merge them first)")
        owner, _, attr = dense.rpartition(".")
        setattr(model.get_submodule(owner), attr, LoraDense(module, its, owned.get(dense, [])))
    return made


def _check_whole(model: nn.Module, layers: dict[str, list[Run]], targets: tuple[str, ...]) -> dict[str, list[Run]]:
    """The file layers whose rows all come from targeted projections; an error for one that is only in part."""
    roles = projection_names(model)
    chosen = {}
    for name, runs in layers.items():
        its = {roles[run.dense] for run in runs}
        if its <= set(targets):
            chosen[name] = runs
        elif its & set(targets):
            family = model.config.family.name  # type: ignore[union-attr]
            raise BertforgeError(f"lora targets: {family}'s checkpoints fuse {', '.join(sorted(its))} into one layer "
                                 f"({name}); target all of them or none")
    return chosen


def add_adapters(model: nn.Module, settings: LoraSettings) -> list[LoRA]:
    """Attach adapters to the projections `settings.targets` of every block, in place: everything else of the
    encoder frozen, the task head (`head_prefixes`) trainable. Returns the adapters."""
    layers = _check_whole(model, file_layers(model), settings.targets)
    weight = model.input_embeddings()  # type: ignore[operator]

    def make(name: str, n_in: int, n_out: int) -> LoRA:
        with torch.device(weight.device):
            return LoRA(name, n_in, n_out, settings.rank, settings.alpha, settings.dropout).to(weight.dtype)

    made = _adapt(model, layers, make)
    freeze_for_adapters(model)
    return made


def freeze_for_adapters(model: nn.Module) -> None:
    """Only the adapters and the task head (`head_prefixes`, decided here once) train."""
    heads = head_prefixes(model)
    model.adapter_head = heads  # type: ignore[assignment]
    for name, param in model.named_parameters():
        param.requires_grad_(name.startswith(heads) or ".adapters." in name)


def head_prefixes(model: nn.Module) -> tuple[str, ...]:
    """The task head's parameter prefixes: what trains beside the adapters and is saved with them. The base
    model's pooler only where its checkpoint lacked it (else it stays frozen, as PEFT leaves it): a pooler drawn
    at random must be saved, or the adapter would not compute the same anywhere else."""
    chosen = getattr(model, "adapter_head", None)  # decided when the adapters came (the loader's report changes)
    if chosen is not None:
        return chosen
    if model is getattr(model, "base_model", model):
        return ()
    fresh = getattr(getattr(model, "loading_info", None), "missing_keys", [])
    return tuple(p for p in model.head_prefixes()  # type: ignore[operator]
                 if not p.startswith("bert.") or any(k.startswith(p) for k in fresh))


def adapters(model: nn.Module) -> list[LoRA]:
    """The model's adapters, each once, in module order."""
    return [m for m in model.modules() if isinstance(m, LoRA)]


def has_adapters(model: nn.Module) -> bool:
    return any(isinstance(m, LoraDense) for m in model.modules())


def merge_adapters(model: M) -> M:
    """Fold every adapter into its projections' weights, in place: plain dense layers again. Returns `model`."""
    for name, module in list(model.named_modules()):
        if isinstance(module, LoraDense):
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, module.merged())
    return model


# ---------------------------------------------------------------------------------------------- PEFT's directory
def _head_state(model: nn.Module) -> dict[str, Tensor]:
    """The trainable head's tensors under the family's file names (PEFT's `modules_to_save`)."""
    heads = head_prefixes(model)
    return file_state(model, {k: v for k, v in model.state_dict().items() if heads and k.startswith(heads)},
                      in_memory=True)


def _target_modules(names: list[str], every: list[str]) -> list[str]:
    """PEFT's `target_modules` for the file layers `names`: the part of each name after its layer number where
    those suffixes match exactly `names` among all the file layers `every`, else the full names."""
    suffixes = sorted({re.split(r"\.\d+\.", n)[-1] for n in names})

    def matches(n: str) -> bool:
        return any(n == s or n.endswith("." + s) for s in suffixes)

    return suffixes if {n for n in every if matches(n)} == set(names) else sorted(names)


def _outermost(key: str, head: set[str], names: list[str]) -> str:
    """The shortest module path above `key` under which every tensor of `names` is one of `head`: the module
    PEFT's `modules_to_save` names (`classifier`, not `classifier.dense`; `bert.pooler`, not `bert`)."""
    parts = key.split(".")
    for n in range(1, len(parts)):
        module = ".".join(parts[:n])
        if all(k in head for k in names if k.startswith(module + ".")):
            return module
    return key.rpartition(".")[0]


def adapter_config(model: nn.Module, base: str | None = None) -> dict[str, Any]:
    """`adapter_config.json`'s content for the model's adapters (all of one rank, alpha and dropout)."""
    made = adapters(model)
    if not made:
        raise BertforgeError("this model has no adapters to save")
    kinds = {(m.rank, m.alpha, m.p) for m in made}
    if len(kinds) > 1:
        raise BertforgeError(f"adapters of several ranks or scales ({sorted(kinds)}) are not supported in one file")
    rank, alpha, p = kinds.pop()
    names = list(_tagged_file_state(model)[1])
    every = [k.removesuffix(".weight") for k in names if k.endswith(".weight")]
    head = set(_head_state(model))
    heads = sorted({_outermost(k, head, names) for k in head})
    base, revision = hub_base(base)
    return {
        "peft_type": "LORA", "task_type": TASK_TYPES.get(type(model).__name__), "base_model_name_or_path": base,
        "r": rank, "lora_alpha": alpha, "lora_dropout": p, "bias": "none", "fan_in_fan_out": False,
        "target_modules": _target_modules([m.name for m in made], every), "modules_to_save": heads or None,
        "inference_mode": True, "init_lora_weights": True, "use_rslora": False, "use_dora": False,
        "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None, "layers_pattern": None,
        "revision": revision,
    }


def hub_base(base: str | None) -> tuple[str | None, str | None]:
    """PEFT's (base_model_name_or_path, revision) of a base model: a Hub id bertforge pinned (`org/name@<commit>`,
    `core.hub.pin_revision`) is split into the id and its commit, so that PEFT, and bertforge reading the adapter back,
    load the weights the adapter was trained on even after the branch moves; a path stays as it is."""
    if base is None or Path(base).exists() or not looks_like_hub_id(base):
        return base, None
    return split_revision(base)


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """The adapters' and the head's tensors under PEFT's names (`base_model.model.<module>.lora_A.weight`)."""
    state: dict[str, Tensor] = {}
    for lora in adapters(model):
        state[f"{PEFT_PREFIX}{lora.name}.lora_A.weight"] = lora.lora_A
        state[f"{PEFT_PREFIX}{lora.name}.lora_B.weight"] = lora.lora_B
    state.update({PEFT_PREFIX + k: v for k, v in _head_state(model).items()})
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def save_adapter(model: nn.Module, path: str | Path, base: str | None = None) -> None:
    """Write PEFT's adapter directory for `model`'s adapters (and its task head) into `path`; `base`: the base
    model's directory or Hub id, as `base_model_name_or_path`."""
    config_text = json.dumps(adapter_config(model, base), indent=2) + "\n"
    state = adapter_state(model)
    config: Any = model.config
    written = replace(config, architectures=[type(model).__name__]).to_dict()
    head_text = json.dumps({k: written[k] for k in HEAD_FIELDS if k in written}, indent=2) + "\n"
    atomic_write_files(Path(path), {
        ADAPTER_WEIGHTS: lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}),
        ADAPTER_CONFIG: lambda tmp: tmp.write_text(config_text, encoding="utf-8"),
        ADAPTED_CONFIG: lambda tmp: tmp.write_text(head_text, encoding="utf-8"),
    })


@dataclass(frozen=True)
class AdapterFile:
    """A PEFT LoRA directory as read: its config, its adapters' tensors by module and its head's by file name."""

    path: Path
    config: dict[str, Any]
    layers: dict[str, dict[str, Tensor]] = field(default_factory=dict)  # module -> {"lora_A": .., "lora_B": ..}
    head: dict[str, Tensor] = field(default_factory=dict)

    @property
    def base(self) -> str | None:
        return self.config.get("base_model_name_or_path")


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def read_adapter(path: str | Path) -> AdapterFile:
    """Read and check a PEFT LoRA directory (only what bertforge computes as PEFT does: plain LoRA)."""
    path = Path(path)
    file = path / ADAPTER_CONFIG
    config = _read_json(file)
    if config.get("peft_type") != "LORA":
        raise BertforgeError(f"{file}: peft_type {config.get('peft_type')!r} is not supported (only LORA)")
    refused = {"use_dora": False, "fan_in_fan_out": False, "bias": "none", "lora_bias": False,
               "alpha_pattern": {}, "layer_replication": None}
    for key, plain in refused.items():
        if config.get(key, plain) not in (plain, None) and not (plain == {} and not config.get(key)):
            raise BertforgeError(f"{file}: {key}={config[key]!r} is not supported (only plain LoRA: {key}={plain!r})")
    weights = path / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise BertforgeError(f"{path}: no {ADAPTER_WEIGHTS} beside {ADAPTER_CONFIG}")
    layers: dict[str, dict[str, Tensor]] = {}
    head: dict[str, Tensor] = {}
    for key, tensor in _read_safetensors(weights).items():
        if not key.startswith(PEFT_PREFIX):
            raise BertforgeError(f"{weights}: key {key!r} does not start with {PEFT_PREFIX!r} (PEFT's names)")
        name = key[len(PEFT_PREFIX):]
        found = re.fullmatch(r"(.+)\.(lora_A|lora_B)(?:\.default)?\.weight", name)
        if found:
            layers.setdefault(found[1], {})[found[2]] = tensor
        elif re.search(r"\.lora_\w+\.", name):
            raise BertforgeError(f"{weights}: {key!r} is not a LoRA matrix bertforge reads (lora_A, lora_B)")
        else:
            head[name.replace(".modules_to_save.default.", ".")] = tensor
    for name, pair in layers.items():
        if set(pair) != {"lora_A", "lora_B"} or pair["lora_A"].shape[0] != pair["lora_B"].shape[1]:
            raise BertforgeError(f"{weights}: {name} needs lora_A [r, in] and lora_B [out, r]")
    bad = nonfinite_tensors({**{f"{n}.{k}": t for n, p in layers.items() for k, t in p.items()}, **head})
    if bad:
        raise BertforgeError(f"{weights}: the adapter contains NaN or infinite values (first: {bad[0]!r})")
    return AdapterFile(path, config, layers, head)


def adapted_config(path: str | Path, base: str | Path | None = None) -> tuple[str | Path, dict[str, Any]]:
    """The base model of the adapter directory `path` (`base`, else its `base_model_name_or_path`) and the
    config fields bertforge saved beside the adapter (`ADAPTED_CONFIG`: the head's labels; {} if none)."""
    path = Path(path)
    if base is None:
        config = _read_json(path / ADAPTER_CONFIG)
        base, revision = config.get("base_model_name_or_path"), config.get("revision")
        if isinstance(base, str) and isinstance(revision, str) and revision and "@" not in base \
                and looks_like_hub_id(base) and not Path(base).exists():
            base = f"{base}@{revision}"  # the commit the adapter was trained on
    if not base:
        raise BertforgeError(f"{path / ADAPTER_CONFIG}: no base_model_name_or_path: name the base model too "
                             "(pipeline(task, model=BASE, adapter=DIR), serve --model BASE --adapter NAME=DIR)")
    saved = _read_json(path / ADAPTED_CONFIG) if (path / ADAPTED_CONFIG).is_file() else {}
    return base, {k: v for k, v in saved.items() if k in HEAD_FIELDS}


def _read_json(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        assert isinstance(data, dict)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, AssertionError):
        raise BertforgeError(f"{file}: not a readable JSON object") from None
    return data


def load_adapted(cls: type[M], path: str | Path, base: str | Path | None = None, *, quiet: bool = False,
                 **overrides: Any) -> M:
    """`cls` built from a base checkpoint with the PEFT LoRA directory `path` on it: the base is `base`, else the
    adapter's `base_model_name_or_path` (as peft's `AutoPeftModel` finds it); the config fields bertforge saved
    beside the adapter (its labels, `ADAPTED_CONFIG`) and then `overrides` apply to the base's config."""
    from .checkpoint import _report, load_pretrained

    adapter = read_adapter(path)
    found, saved = adapted_config(adapter.path, base)
    model = load_pretrained(cls, found, ignore_mismatched_sizes=bool(adapter.head), quiet=True,
                            **{**saved, **overrides})
    load_adapter(model, adapter)
    _report(cls.__name__, model.loading_info, quiet)  # type: ignore[arg-type]
    return model


def with_adapter(model: M, path: str | Path) -> M:
    """A model of `model`'s class sharing its weights (no copy), with the adapters of the PEFT directory `path`
    on it and the adapter's own head (its labels too, where saved beside it): several adapters on one base model
    in memory (`bertforge serve --adapter NAME=DIR`). `model` is left as it is."""
    from .checkpoint import LoadingInfo, initialise_missing
    from .config import BertConfig

    adapter = read_adapter(path)
    saved = adapted_config(adapter.path, base="(given)")[1]
    base_config: Any = model.config
    config = BertConfig.from_dict({**base_config.to_dict(), **saved}) if saved else base_config
    with torch.device("meta"):
        new = type(model)(config)
    own = new.state_dict()
    shared = {k: v for k, v in model.state_dict().items() if k in own and own[k].shape == v.shape}
    new.load_state_dict(shared, strict=False, assign=True)  # the same storage: nothing is copied
    new.loading_info = LoadingInfo(initialise_missing(new), [], str(adapter.path))  # type: ignore[assignment]
    load_adapter(new, adapter)
    return new.train(model.training)


def _scale(config: dict[str, Any], rank: int) -> float:
    alpha = config.get("lora_alpha", 8)
    return float(alpha) / (math.sqrt(rank) if config.get("use_rslora") else rank)


def load_adapter(model: nn.Module, path: str | Path | AdapterFile) -> nn.Module:
    """Attach the adapters of a PEFT LoRA directory (and load its task head) onto `model`, in place; the result
    computes what `peft.PeftModel.from_pretrained` does on the family's `transformers` class. Returns `model`."""
    adapter = path if isinstance(path, AdapterFile) else read_adapter(path)
    source = str(adapter.path / ADAPTER_WEIGHTS)
    layers = file_layers(model)
    unknown = sorted(set(adapter.layers) - set(layers))
    if unknown:
        raise BertforgeError(f"{source}: adapts {unknown[0]!r}, which is no projection of this "
                             f"{model.config.family.name} model's blocks"  # type: ignore[union-attr]
                             f"{f' ({len(unknown) - 1} more)' if len(unknown) > 1 else ''}; adaptable: "
                             f"{', '.join(sorted(layers)[:4])}, ...")
    dropout_p = float(adapter.config.get("lora_dropout") or 0.0)
    weight = model.input_embeddings()  # type: ignore[operator]

    def make(name: str, n_in: int, n_out: int) -> LoRA:
        pair = adapter.layers[name]
        a, b = pair["lora_A"], pair["lora_B"]
        if tuple(a.shape[1:]) != (n_in,) or b.shape[0] != n_out:
            raise BertforgeError(f"{source}: {name} has lora_A {list(a.shape)} and lora_B {list(b.shape)}; this "
                                 f"model's layer is [{n_out}, {n_in}] (an adapter of another base model?)")
        rank = a.shape[0]
        with torch.device("meta"):
            lora = LoRA(name, n_in, n_out, rank, _scale(adapter.config, rank) * rank, dropout_p)
        lora.lora_A = nn.Parameter(a.to(weight.device, weight.dtype))
        lora.lora_B = nn.Parameter(b.to(weight.device, weight.dtype))
        return lora

    _adapt(model, {name: layers[name] for name in adapter.layers}, make)
    freeze_for_adapters(model)  # the head as the base's loading left it (a fresh pooler included)
    if adapter.head:
        try:
            mapped, info = convert_state_dict(adapter.head, model, source)
        except BertforgeError as err:  # peft's files keep no labels: its head may have others than the config
            raise BertforgeError(f"{err}; an adapter without {ADAPTED_CONFIG} (one peft wrote) says nothing of its "
                                 "labels: load it with num_labels=N (load_adapted(cls, DIR, num_labels=N))") from None
        if info.unexpected_keys:
            raise BertforgeError(f"{source}: weights {info.unexpected_keys[:3]} belong to no part of this "
                                 f"{type(model).__name__}")
        own = model.state_dict()  # new tensors, not written into the old: a model sharing its base's keeps those
        model.load_state_dict({k: t.to(own[k].device, own[k].dtype) for k, t in mapped.items()}, strict=False,
                              assign=True)
        loading = getattr(model, "loading_info", None)
        if loading is not None:  # the head is the adapter's now, not newly initialised
            loading.missing_keys = [k for k in loading.missing_keys if k not in mapped]
    return model


__all__ = ["ADAPTED_CONFIG", "ADAPTER_CONFIG", "HEAD_FIELDS", "ADAPTER_WEIGHTS", "DEFAULT_TARGETS", "PEFT_PREFIX", "ROLES", "AdapterFile", "LoRA",
           "LoraDense", "LoraSettings", "Piece", "Run", "adapted_config", "adapter_config", "adapter_state", "adapters", "add_adapters",
           "file_layers", "freeze_for_adapters", "has_adapters", "is_adapter_dir", "load_adapted", "load_adapter", "merge_adapters",
           "projection_names", "read_adapter", "save_adapter", "with_adapter"]
