"""How much memory a training run needs, estimated from the config before anything is allocated, and the check that
refuses a run that cannot fit (pretraining and fine-tuning both call `check_training_fits` before they build the
model).

The estimate: 16 bytes per parameter (fp32 weights, gradients and AdamW's two moments; LAMB keeps the same), plus
the activations saved for backward, per sequence:

* per layer, 4 bytes x (18 · S · H + 5 · A · S²): the [S, H]-sized tensors a block keeps (Q, K, V, the attention
  and feed-forward outputs, the 4H-wide intermediate and its activation, LayerNorm inputs, dropout masks) and the
  [A, S, S] attention scores, probabilities and dropout mask;
* once, 4 bytes x (4 · S · H + 2 · 0.15 · S · V): the embeddings, and the MLM logits and their gradient at the
  masked positions.

With gradient checkpointing only each layer's input ([S, H]) is kept, plus one layer's activations while it is
recomputed. Against the measured figures of docs/guides/precision-and-memory.md (fp32, seq 128: mini 16 MiB,
small 30 MiB, base 124 MiB a sequence) this gives 19, 33 and 132 MiB: within a factor 1.25, on the safe side (the
test holds it to that).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .auto import AutoModelForPreTraining, AutoModelForSequenceClassification
from .config import BertConfig
from ..core.errors import BertforgeError
from ..core.system import SKIP_MEMORY_CHECK, memory_check_skipped

BYTES_PER_PARAMETER = 16  # fp32 weight + gradient + two AdamW moments
MLM_FRACTION = 0.15
MiB = 1 << 20
GiB = 1 << 30


def parameter_count(config: BertConfig, head: str = "pretraining", num_labels: int | None = None) -> int:
    """Parameters of the model `config` describes, counted on the model itself built without storage (on the meta
    device): `head` "pretraining" is `AutoModelForPreTraining`'s class (the sentence head where the family has
    one), "classification" the sequence head with `num_labels` outputs (default: the config's)."""
    if head == "pretraining":
        cls: type = AutoModelForPreTraining
    else:
        cls = AutoModelForSequenceClassification
        if num_labels is not None:
            config = dataclasses.replace(config, num_labels=num_labels, id2label=None, label2id=None)
    with torch.device("meta"):
        return cls.from_config(config).num_parameters()  # type: ignore[attr-defined]


def activation_bytes_per_sequence(config: BertConfig, seq_len: int, gradient_checkpointing: bool = False,
                                  head: str = "pretraining") -> int:
    """The activations one sequence of `seq_len` tokens keeps for backward (see the module docstring); a head other
    than "pretraining" has no MLM logits."""
    s, h, a, v = seq_len, config.hidden_size, config.num_attention_heads, config.vocab_size
    layer = 4 * (18 * s * h + 5 * a * s * s)
    once = 4 * (4 * s * h + (2 * MLM_FRACTION * s * v if head == "pretraining" else 0))
    if gradient_checkpointing:
        return int(config.num_hidden_layers * 4 * s * h + layer + once)
    return int(config.num_hidden_layers * layer + once)


@dataclass
class MemoryEstimate:
    parameters: int
    state_bytes: int  # weights, gradients and optimizer state
    per_sequence: int  # activation bytes a sequence
    per_sequence_checkpointed: int
    batch_size: int
    seq_len: int
    gradient_checkpointing: bool

    @property
    def activation_bytes(self) -> int:
        return self.batch_size * (self.per_sequence_checkpointed if self.gradient_checkpointing else self.per_sequence)

    @property
    def total(self) -> int:
        return self.state_bytes + self.activation_bytes


def estimate_training_memory(config: BertConfig, batch_size: int, seq_len: int, *, gradient_checkpointing: bool = False,
                             head: str = "pretraining", shards: int = 1) -> MemoryEstimate:
    """What one training process needs; `shards`: processes the weights and optimizer state are split over (FSDP)."""
    params = parameter_count(config, head)
    return MemoryEstimate(
        parameters=params,
        state_bytes=params * BYTES_PER_PARAMETER // max(1, shards),
        per_sequence=activation_bytes_per_sequence(config, seq_len, head=head),
        per_sequence_checkpointed=activation_bytes_per_sequence(config, seq_len, gradient_checkpointing=True, head=head),
        batch_size=batch_size,
        seq_len=seq_len,
        gradient_checkpointing=gradient_checkpointing,
    )


def available_memory(device) -> tuple[int | None, str]:
    """(bytes this process may still allocate, where): the GPU's free memory for a CUDA device; otherwise the host's
    MemAvailable (or the cgroup's remaining limit, when lower), shared among the processes of this host."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"GPU {device}"
    available = _meminfo_available()
    limit = _cgroup_remaining()
    if limit is not None and (available is None or limit < available):
        available = limit
    if available is None:
        return None, "host"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if local > 1:
        return available // local, f"host (1/{local} of it, one share per process of this host)"
    return available, "host"


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_remaining() -> int | None:
    """cgroup v2: memory.max - memory.current of this process's group, when it has a limit."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text().strip()))
    except (OSError, ValueError):
        return None


def _size(n: float) -> str:
    return f"{n / GiB:,.1f} GiB" if n >= GiB else f"{n / MiB:,.0f} MiB"


def check_fits(estimate: MemoryEstimate, available: int | None, where: str, what: str) -> None:
    """Raise a BertforgeError with the numbers, and the settings that would fit, when `estimate` exceeds `available`."""
    if available is None or estimate.total <= available or memory_check_skipped():
        return
    e = estimate
    per_seq = e.per_sequence_checkpointed if e.gradient_checkpointing else e.per_sequence
    parts = (f"{what} needs about {_size(e.total)}: {e.parameters:,} parameters x {BYTES_PER_PARAMETER} B (weights, "
             f"gradients, optimizer state) = {_size(e.state_bytes)}, plus activations {e.batch_size} x "
             f"{_size(per_seq)} a sequence of {e.seq_len} tokens = {_size(e.activation_bytes)}; the {where} has "
             f"{_size(available)} available")
    room = available - e.state_bytes
    if room <= 0:
        hint = "the parameters alone do not fit: choose a smaller model (--config)"
    else:
        hints = []
        fit = room // per_seq
        if 1 <= fit < e.batch_size:
            hints.append(f"--batch-size {fit} (with --grad-accum for the same effective batch)")
        if not e.gradient_checkpointing:
            fit_ckpt = room // e.per_sequence_checkpointed
            if fit_ckpt >= 1:
                hints.append(f"--gradient-checkpointing ({_size(e.per_sequence_checkpointed)} a sequence; batch up to "
                             f"{fit_ckpt})")
        hints.append("a shorter sequence length or a smaller model")
        hint = "what would fit: " + "; or ".join(hints)
    raise BertforgeError(f"{parts}; {hint} ({SKIP_MEMORY_CHECK}=1 skips this check)")


def check_training_fits(config: BertConfig, batch_size: int, seq_len: int, device, *, gradient_checkpointing: bool = False,
                        head: str = "pretraining", shards: int = 1, what: str = "training") -> MemoryEstimate:
    """Estimate one process's training memory and refuse (BertforgeError) when the device or host cannot hold it."""
    estimate = estimate_training_memory(config, batch_size, seq_len, gradient_checkpointing=gradient_checkpointing,
                                        head=head, shards=shards)
    available, where = available_memory(device)
    check_fits(estimate, available, where, what)
    return estimate
