"""BERT from low-level PyTorch ops, with every head and the Hugging Face parameter names.

Shapes: B = batch, S = sequence length, H = hidden size, nh = heads, hd = head size (H / nh), V = vocabulary,
N = labelled (masked) positions in a batch.

The module tree mirrors `transformers`' BERT so that `state_dict()` keys are the ecosystem's contract as they are
(`bert.encoder.layer.0.attention.self.query.weight`, ...); `bertforge.checkpoint` only has to handle the
variations found in published files (prefix, legacy LayerNorm names, tied decoder).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import BertConfig
from .errors import BertforgeError
from .linear import linear

from .constants import IGNORE_INDEX  # defined there; importable from here too


# ---------------------------------------------------------------------------------------------------- outputs
class ModelOutput:
    """Fields by name (`out.loss`, `out["loss"]`); `to_tuple()` gives the fields that are set, in order."""

    def __getitem__(self, key: str | int) -> Any:
        if isinstance(key, str):
            return getattr(self, key)
        return self.to_tuple()[key]

    def keys(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]  # type: ignore[arg-type]

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(getattr(self, k) for k in self.keys())


@dataclass
class BaseModelOutput(ModelOutput):
    last_hidden_state: Tensor  # [B, S, H]
    pooler_output: Tensor | None = None  # [B, H]
    hidden_states: tuple[Tensor, ...] | None = None  # embeddings + each layer, [B, S, H] each
    attentions: tuple[Tensor, ...] | None = None  # each layer, [B, nh, S, S]


@dataclass
class PreTrainingOutput(ModelOutput):
    loss: Tensor | None = None
    mlm_loss: Tensor | None = None
    nsp_loss: Tensor | None = None
    prediction_logits: Tensor | None = None  # [B, S, V]; [N, V] (labelled positions only) with sparse MLM
    seq_relationship_logits: Tensor | None = None  # [B, 2]
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class MaskedLMOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None  # [B, S, V]; [N, V] with sparse MLM
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class SequenceClassifierOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None  # [B, num_labels] or [B, S, num_labels] for token classification
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


TokenClassifierOutput = SequenceClassifierOutput
NextSentencePredictorOutput = SequenceClassifierOutput


@dataclass
class QuestionAnsweringOutput(ModelOutput):
    loss: Tensor | None = None
    start_logits: Tensor | None = None  # [B, S]
    end_logits: Tensor | None = None  # [B, S]
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


# ---------------------------------------------------------------------------------------------------- building blocks
def activation(name: str, x: Tensor) -> Tensor:
    if name == "gelu":
        return F.gelu(x)
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu(x)
    if name in ("silu", "swish"):
        return F.silu(x)
    if name == "tanh":
        return torch.tanh(x)
    raise ValueError(f"unknown activation {name!r}")


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """`F.dropout` (zero each element with probability p, scale the rest by 1 / (1 - p)), with a cheaper mask on CPU.

    PyTorch draws a CPU dropout mask one element at a time (`bernoulli_`, two 32-bit draws per element, on one
    thread on AMD CPUs): 12 % of a mini training step here. This draws 32 random bits per element, 64 at a time,
    and keeps an element when its bits are at or above p · 2³², so P(drop) = p to within 2⁻³² (3.2x faster
    masks, measured). Other devices (fused kernels) and compiled code use `F.dropout`.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not x.is_floating_point() or not 0.0 < p < 1.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    n = x.numel()
    bits = torch.empty((n + 1) // 2, dtype=torch.int64).random_(-(2**63), None).view(torch.int32)[:n]  # uniform int32
    threshold = round(p * 2**32) - 2**31  # P(bits < threshold) = p
    scale = torch.where(bits.view(x.shape) >= threshold, 1.0 / (1.0 - p), 0.0).to(x.dtype)
    return x * scale


class Dense(nn.Module):
    """y = x Wᵀ + b, parameters named `weight` [out, in] and `bias` [out] like the checkpoints."""

    def __init__(self, n_in: int, n_out: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)  # F.linear, or oneDNN's kernels on CPU (see bertforge.linear)


class LayerNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class Embedding(nn.Module):
    def __init__(self, num: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, dim))

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight)


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.dropout = config.hidden_dropout_prob

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None, position_ids: Tensor | None) -> Tensor:
        seq_len = input_ids.shape[1]
        if seq_len > self.position_embeddings.weight.shape[0]:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_position_embeddings={self.position_embeddings.weight.shape[0]}"
            )
        x = self.word_embeddings(input_ids)  # [B, S, H]
        if position_ids is None:
            x = x + self.position_embeddings.weight[:seq_len]  # broadcast over the batch
        else:
            x = x + self.position_embeddings(position_ids)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        x = self.LayerNorm(x)
        return dropout(x, self.dropout, self.training)


@dataclass
class Unpadded:
    """Where the real tokens of a right- or left-padded [B, S] batch are: the encoder then runs its dense layers,
    LayerNorms, GELU and dropout on the T real rows only ([T, H], T = Σ lengths), and only attention, which needs
    whole sequences, sees the [B, S] layout again. Real tokens get exactly what the padded model computes for them
    (padding keys are masked out either way); no FLOP is spent on padding outside attention."""

    index: Tensor  # [T] flat positions b * S + s of the real tokens
    batch: int
    seq: int

    @classmethod
    def from_mask(cls, attention_mask: Tensor) -> "Unpadded":
        B, S = attention_mask.shape
        return cls(attention_mask.reshape(-1).nonzero().squeeze(1), B, S)

    def unpad(self, x: Tensor) -> Tensor:
        """[B, S, C] or [B*S, C] → [T, C]"""
        return x.reshape(self.batch * self.seq, -1).index_select(0, self.index)

    def pad(self, x: Tensor) -> Tensor:
        """[T, C] → [B, S, C], zeros at padding."""
        full = x.new_zeros(self.batch * self.seq, x.shape[-1]).index_copy(0, self.index, x)
        return full.view(self.batch, self.seq, -1)


class BertSelfAttention(nn.Module):
    """Query, key and value projections (kept apart for checkpoint names, run as one fused matmul)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.query = Dense(h, h)
        self.key = Dense(h, h)
        self.value = Dense(h, h)

    def qkv(self, x: Tensor) -> Tensor:
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])  # [3H, H]
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])  # [3H]
        return linear(x, weight, bias)  # [B, S, 3H]


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Dense(config.hidden_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, config.layer_norm_eps)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)
        self.num_heads = config.num_attention_heads
        self.attn_dropout = config.attention_probs_dropout_prob
        self.hidden_dropout = config.hidden_dropout_prob
        self.backend = config.attn_implementation

    def forward(
        self, x: Tensor, mask: Tensor | None, output_attentions: bool, unpadded: Unpadded | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """x: [B, S, H], or [T, H] with `unpadded` (the projections then skip padding; attention runs on [B, S])."""
        H = x.shape[-1]
        nh = self.num_heads
        qkv = self.self.qkv(x)  # [B, S, 3H] or [T, 3H]
        if unpadded is not None:
            qkv = unpadded.pad(qkv)  # [B, S, 3H], zeros at padding (masked keys; their query rows are dropped)
        B, S = qkv.shape[:2]
        q, k, v = qkv.view(B, S, 3, nh, H // nh).permute(2, 0, 3, 1, 4)  # 3 x [B, nh, S, hd]
        p = self.attn_dropout if self.training else 0.0
        probs = None
        # SDPA with dropout on CPU runs these same ops, with PyTorch's slower mask (see `dropout`)
        explicit = p > 0 and qkv.device.type == "cpu"
        if self.backend == "eager" or output_attentions or explicit:
            scores = q @ k.transpose(-1, -2) / math.sqrt(H // nh)  # [B, nh, S, S]
            if mask is not None:
                scores = scores + mask
            probs = scores.softmax(dim=-1)
            ctx = dropout(probs, p, self.training) @ v  # [B, nh, S, hd]
        else:
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # [B, nh, S, hd]
        ctx = ctx.transpose(1, 2).reshape(B, S, H)  # [B, S, H]
        if unpadded is not None:
            ctx = unpadded.unpad(ctx)  # [T, H]
        out = dropout(self.output.dense(ctx), self.hidden_dropout, self.training)
        return self.output.LayerNorm(out + x), probs


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Dense(config.hidden_size, config.intermediate_size)


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Dense(config.intermediate_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, config.layer_norm_eps)


class BertLayer(nn.Module):
    """Post-LN block: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)
        self.act = config.hidden_act
        self.dropout = config.hidden_dropout_prob

    def forward(
        self, x: Tensor, mask: Tensor | None, output_attentions: bool = False, unpadded: Unpadded | None = None
    ) -> tuple[Tensor, Tensor | None]:
        x, probs = self.attention(x, mask, output_attentions, unpadded)  # [B, S, H] or [T, H]
        h = activation(self.act, self.intermediate.dense(x))  # [B, S, 4H]
        h = dropout(self.output.dense(h), self.dropout, self.training)  # [B, S, H]
        return self.output.LayerNorm(h + x), probs


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        output_attentions: bool,
        output_hidden_states: bool,
        unpadded: Unpadded | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...] | None, tuple[Tensor, ...] | None]:
        hidden = (x,) if output_hidden_states else None
        attentions: tuple[Tensor, ...] | None = () if output_attentions else None
        for layer in self.layer:
            if self.gradient_checkpointing and self.training and not output_attentions:
                x, probs = torch.utils.checkpoint.checkpoint(layer, x, mask, False, unpadded, use_reentrant=False)
            else:
                x, probs = layer(x, mask, output_attentions, unpadded)
            if hidden is not None:
                hidden = hidden + (x,)
            if attentions is not None:
                attentions = attentions + (probs,)
        return x, hidden, attentions


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Dense(config.hidden_size, config.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.dense(x[:, 0]))  # [B, H] from the [CLS] position


def extended_attention_mask(attention_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """[B, S] of 1 (token) / 0 (padding) → additive [B, 1, 1, S] mask, built once per batch.

    Masked keys get the dtype's most negative finite value, not -inf, so a row with every key masked gives a
    uniform softmax instead of NaN. Returns None when nothing is masked (lets SDPA pick its fastest kernel).
    """
    if attention_mask is None or bool(attention_mask.all()):
        return None
    mask = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
    return mask


# ---------------------------------------------------------------------------------------------------- models
class BertPreTrainedModel(nn.Module):
    """Shared init, loading and saving. Subclasses set `base_model_prefix` use ("bert") or not (BertModel)."""

    config: BertConfig
    has_pooler: bool = True

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config

    def init_weights(self) -> None:
        """Truncated normal (±2 std) for matrices and embeddings, LayerNorm 1/0, biases 0, padding row 0."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (Dense, Embedding)):
                nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
            if isinstance(module, Dense) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        pad = self.config.pad_token_id
        if pad is not None:
            with torch.no_grad():
                self.base_model.embeddings.word_embeddings.weight[pad].zero_()
        for name, param in self.named_parameters():
            if name.endswith("predictions.bias"):
                nn.init.zeros_(param)

    @property
    def base_model(self) -> "BertModel":
        return getattr(self, "bert", self)  # type: ignore[return-value]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def set_attn_implementation(self, backend: str) -> None:
        self.config.attn_implementation = backend
        self.config.validate()
        for module in self.modules():
            if isinstance(module, BertAttention):
                module.backend = backend

    def gradient_checkpointing_enable(self) -> None:
        self.base_model.encoder.gradient_checkpointing = True

    @classmethod
    def from_pretrained(cls, path: Any, **overrides: Any) -> Any:
        from .checkpoint import load_pretrained

        return load_pretrained(cls, path, **overrides)

    def save_pretrained(self, path: Any) -> None:
        from .checkpoint import save_pretrained

        save_pretrained(self, path)


class BertModel(BertPreTrainedModel):
    def __init__(self, config: BertConfig, add_pooling_layer: bool = True, *, initialize: bool = True) -> None:
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        if initialize:  # a head class initialises the whole tree once, body included
            self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        *,
        unpad: bool = False,
    ) -> BaseModelOutput:
        """`unpad=True` runs the encoder on the real tokens only (see `Unpadded`) when the batch has padding and no
        per-layer outputs are asked for. The real positions are the same either way; padding positions of
        `last_hidden_state` are then zeros instead of values nobody should use. The heads whose outputs never
        read padding positions (sparse MLM, NSP, sequence classification) turn it on."""
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # [B, S, H]
        mask = extended_attention_mask(attention_mask, x.dtype)  # [B, 1, 1, S] or None
        if unpad and mask is not None and not (output_attentions or output_hidden_states):
            unpadded = Unpadded.from_mask(attention_mask)  # type: ignore[arg-type]
            x, hidden, attentions = self.encoder(unpadded.unpad(x), mask, False, False, unpadded)  # [T, H]
            x = unpadded.pad(x)  # [B, S, H]
        else:
            x, hidden, attentions = self.encoder(x, mask, output_attentions, output_hidden_states)
        pooled = self.pooler(x) if self.pooler is not None else None
        return BaseModelOutput(x, pooled, hidden, attentions)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Dense(config.hidden_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.act = config.hidden_act

    def forward(self, x: Tensor) -> Tensor:
        return self.LayerNorm(activation(self.act, self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """dense → GELU → LayerNorm → decoder whose weight is the word-embedding matrix (tied), plus a bias."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: Tensor, word_embeddings: Tensor) -> Tensor:
        return linear(self.transform(x), word_embeddings, self.bias)  # [..., V]


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, mlm: bool = True, nsp: bool = True) -> None:
        super().__init__()
        if mlm:
            self.predictions = BertLMPredictionHead(config)
        if nsp:
            self.seq_relationship = Dense(config.hidden_size, 2)


def masked_lm(
    head: BertLMPredictionHead, word_embeddings: Tensor, sequence_output: Tensor, labels: Tensor | None, sparse: bool
) -> tuple[Tensor, Tensor | None]:
    """MLM logits and loss. With labels and `sparse`, only labelled positions reach the vocabulary projection:
    the loss is the same as projecting every position, at a fraction of the cost."""
    if labels is None:
        return head(sequence_output, word_embeddings), None  # [B, S, V]
    if sparse:
        labels = labels.reshape(-1)
        keep = (labels != IGNORE_INDEX).nonzero().squeeze(1)  # [N]
        logits = head(sequence_output.reshape(-1, sequence_output.shape[-1])[keep], word_embeddings)  # [N, V]
        target = labels[keep]
    else:
        logits = head(sequence_output, word_embeddings)  # [B, S, V]
        target = labels
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=IGNORE_INDEX)
    return logits, loss


class BertForPreTraining(BertPreTrainedModel):
    """BERT with the MLM and NSP heads; loss = MLM loss + NSP loss."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, initialize=False)
        self.cls = BertPreTrainingHeads(config)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        next_sentence_label: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        sparse_mlm: bool = True,
    ) -> PreTrainingOutput:
        unpad = labels is not None and sparse_mlm  # then only labelled positions and [CLS] are read
        out = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, output_attentions, output_hidden_states, unpad=unpad
        )
        word = self.bert.embeddings.word_embeddings.weight
        logits, mlm_loss = masked_lm(self.cls.predictions, word, out.last_hidden_state, labels, sparse_mlm)
        nsp_logits = self.cls.seq_relationship(out.pooler_output)  # [B, 2]
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label.reshape(-1), ignore_index=IGNORE_INDEX)
        losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
        loss = sum(losses) if losses else None
        return PreTrainingOutput(
            loss, mlm_loss, nsp_loss, logits, nsp_logits, out.hidden_states, out.attentions  # type: ignore[arg-type]
        )


class BertForMaskedLM(BertPreTrainedModel):
    has_pooler = False

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False, initialize=False)
        self.cls = BertPreTrainingHeads(config, nsp=False)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        sparse_mlm: bool = True,
    ) -> MaskedLMOutput:
        unpad = labels is not None and sparse_mlm  # then only labelled positions are read
        out = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, output_attentions, output_hidden_states, unpad=unpad
        )
        word = self.bert.embeddings.word_embeddings.weight
        logits, loss = masked_lm(self.cls.predictions, word, out.last_hidden_state, labels, sparse_mlm)
        return MaskedLMOutput(loss, logits, out.hidden_states, out.attentions)


class BertForNextSentencePrediction(BertPreTrainedModel):
    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, initialize=False)
        self.cls = BertPreTrainingHeads(config, mlm=False)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> SequenceClassifierOutput:
        out = self.bert(  # only [CLS] is read: skip padding
            input_ids, attention_mask, token_type_ids, position_ids, output_attentions, output_hidden_states, unpad=True
        )
        logits = self.cls.seq_relationship(out.pooler_output)  # [B, 2]
        loss = F.cross_entropy(logits.float(), labels.reshape(-1)) if labels is not None else None
        return SequenceClassifierOutput(loss, logits, out.hidden_states, out.attentions)


class _ClassifierMixin:
    def _dropout_p(self) -> float:
        config: BertConfig = self.config  # type: ignore[attr-defined]
        return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


class BertForSequenceClassification(_ClassifierMixin, BertPreTrainedModel):
    """Pooled [CLS] → dropout → linear. Loss: MSE when num_labels == 1 (regression), BCE for multi-label
    (float labels of shape [B, num_labels]), cross-entropy otherwise — or as `config.problem_type` says."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, initialize=False)
        self.classifier = Dense(config.hidden_size, config.num_labels)
        self.init_weights()

    def problem_type(self, labels: Tensor) -> str:
        if self.config.problem_type:
            return self.config.problem_type
        if self.config.num_labels == 1:
            return "regression"
        if labels.dtype in (torch.long, torch.int) and labels.dim() == 1:
            return "single_label_classification"
        return "multi_label_classification"

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> SequenceClassifierOutput:
        out = self.bert(  # only [CLS] is read: skip padding
            input_ids, attention_mask, token_type_ids, position_ids, output_attentions, output_hidden_states, unpad=True
        )
        pooled = dropout(out.pooler_output, self._dropout_p(), self.training)
        logits = self.classifier(pooled)  # [B, num_labels]
        loss = None
        if labels is not None:
            kind = self.problem_type(labels)
            if kind == "regression":
                loss = F.mse_loss(logits.float().reshape(labels.shape), labels.float())
            elif kind == "single_label_classification":
                loss = F.cross_entropy(logits.float(), labels.reshape(-1), ignore_index=IGNORE_INDEX)
            else:
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
        return SequenceClassifierOutput(loss, logits, out.hidden_states, out.attentions)


class BertForTokenClassification(_ClassifierMixin, BertPreTrainedModel):
    has_pooler = False

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False, initialize=False)
        self.classifier = Dense(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> SequenceClassifierOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, output_attentions, output_hidden_states)
        logits = self.classifier(dropout(out.last_hidden_state, self._dropout_p(), self.training))  # [B, S, L]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)
        return SequenceClassifierOutput(loss, logits, out.hidden_states, out.attentions)


class BertForQuestionAnswering(BertPreTrainedModel):
    """Span extraction: a linear layer gives start and end logits per token."""

    has_pooler = False

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        if config.num_labels != 2:
            raise BertforgeError(f"BertForQuestionAnswering needs num_labels == 2 (start, end), got {config.num_labels}")
        self.bert = BertModel(config, add_pooling_layer=False, initialize=False)
        self.qa_outputs = Dense(config.hidden_size, 2)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> QuestionAnsweringOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, output_attentions, output_hidden_states)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).float().unbind(-1)  # [B, S] each
        loss = None
        if start_positions is not None and end_positions is not None:
            seq_len = start_logits.shape[1]  # positions outside the sequence are ignored, as in transformers
            start = start_positions.reshape(-1).clamp(0, seq_len)
            end = end_positions.reshape(-1).clamp(0, seq_len)
            loss = (
                F.cross_entropy(start_logits, start, ignore_index=seq_len)
                + F.cross_entropy(end_logits, end, ignore_index=seq_len)
            ) / 2
        return QuestionAnsweringOutput(loss, start_logits, end_logits, out.hidden_states, out.attentions)


MODEL_CLASSES: dict[str, type[BertPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (
        BertModel,
        BertForPreTraining,
        BertForMaskedLM,
        BertForNextSentencePrediction,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertForQuestionAnswering,
    )
}
