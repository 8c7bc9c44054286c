"""BERT from low-level PyTorch ops, with every head and the Hugging Face parameter names.

Shapes: B = batch, S = sequence length, H = hidden size, nh = heads, hd = head size (H / nh), V = vocabulary,
N = labelled (masked) positions in a batch.

The module tree mirrors `transformers`' BERT so that `state_dict()` keys are the ecosystem's contract as they are
(`bert.encoder.layer.0.attention.self.query.weight`, ...); `bertforge.checkpoint` only has to handle the
variations found in published files (prefix, legacy LayerNorm names, tied decoder).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import Layout, Packed, PackedBatch, Padded, Unpadded, extended_attention_mask, static_graph
from .config import BertConfig
from .errors import BertforgeError
from .linear import linear
from .ops import activation_fn, dropout

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

    # PreTrainingOutput's names, so that pretraining reads an MLM-only family's output as it reads BERT's
    mlm_loss = property(lambda self: self.loss)
    prediction_logits = property(lambda self: self.logits)
    nsp_loss = None
    seq_relationship_logits = None


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
class Dense(nn.Module):
    """y = act(x Wᵀ + b) (+ a residual), parameters named `weight` [out, in] and `bias` [out] like the checkpoints.

    `act` is a `hidden_act` name or None, resolved once here; the matrix multiply is `bertforge.linear.linear`
    (`F.linear`, or oneDNN's kernels on CPU, which fuse the activation or the residual add at inference)."""

    def __init__(self, n_in: int, n_out: int, bias: bool = True, act: str | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None
        self.act = act
        if act is not None:
            activation_fn(act)  # an unknown name fails at construction, not at the first batch

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        return linear(x, self.weight, self.bias, act=self.act, residual=residual)


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
    """Word + position (+ token type) embeddings → LayerNorm → dropout, of width E = `config.embedding_dim` (H, or
    ALBERT's smaller E, projected to H by the encoder). The family chooses how positions are counted (from 0, or
    RoBERTa's from pad_token_id + 1 with padding kept at pad_token_id) and whether token types exist."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        e = config.embedding_dim
        self.word_embeddings = Embedding(config.vocab_size, e)
        self.position_embeddings = Embedding(config.max_position_embeddings, e)
        self.token_type_embeddings = Embedding(config.type_vocab_size, e) if config.type_vocab_size else None
        self.LayerNorm = LayerNorm(e, config.layer_norm_eps)
        self.dropout = config.hidden_dropout_prob
        self.pad_token_id = config.pad_token_id
        self.positions_after_padding = config.family.positions_after_padding

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None, position_ids: Tensor | None) -> Tensor:
        """input_ids [B, S] (positions counted by the family unless given), or packed [T] with `position_ids` [T]
        → [..., E]. Token types are ignored by a family without them (DistilBERT)."""
        x = self.word_embeddings(input_ids)  # [B, S, E] or [T, E]
        limit = self.position_embeddings.weight.shape[0]
        if position_ids is None and self.positions_after_padding:
            position_ids = padded_position_ids(input_ids, self.pad_token_id)  # [B, S]
            if input_ids.shape[-1] + self.pad_token_id >= limit:
                raise ValueError(
                    f"sequence length {input_ids.shape[-1]} exceeds max_position_embeddings={limit} less the "
                    f"{self.pad_token_id + 1} positions before the first token"
                )
        if position_ids is None:
            seq_len = input_ids.shape[-1]
            if seq_len > limit:
                raise ValueError(f"sequence length {seq_len} exceeds max_position_embeddings={limit}")
            x = x + self.position_embeddings.weight[:seq_len]  # broadcast over the batch
        else:
            x = x + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                x = x + self.token_type_embeddings.weight[0]
            else:
                x = x + self.token_type_embeddings(token_type_ids)
        x = self.LayerNorm(x)
        return dropout(x, self.dropout, self.training)


def padded_position_ids(input_ids: Tensor, pad_token_id: int) -> Tensor:
    """RoBERTa's positions: pad_token_id + 1, + 2, ... over the real tokens; padding tokens get pad_token_id."""
    real = (input_ids != pad_token_id).long()
    return torch.cumsum(real, dim=-1) * real + pad_token_id


class BertSelfAttention(nn.Module):
    """Query, key and value projections (kept apart for checkpoint names, run as one fused matmul)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.query = Dense(h, h)
        self.key = Dense(h, h)
        self.value = Dense(h, h)

    def forward(self, x: Tensor) -> Tensor:
        """[..., H] → [..., 3H]: query, key, value side by side, from one matrix multiply. The weights are stacked
        on every call (a copy of 3H × H, small beside the multiply; a cache would go stale: fused AdamW updates
        parameters in place without bumping their version counters)."""
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])  # [3H, H]
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])  # [3H]
        return linear(x, weight, bias)


class BertResidualOutput(nn.Module):
    """LN(residual + dropout(dense(x))): the end of both sublayers (`attention.output` and `output`)."""

    def __init__(self, config: BertConfig, n_in: int) -> None:
        super().__init__()
        self.dense = Dense(n_in, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.dropout = config.hidden_dropout_prob

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        if self.training or torch.is_grad_enabled():
            return self.LayerNorm(dropout(self.dense(x), self.dropout, self.training) + residual)
        return self.LayerNorm(self.dense(x, residual=residual))  # inference: the add fused into the matmul (oneDNN)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertResidualOutput(config, config.hidden_size)
        self.num_heads = config.num_attention_heads
        self.attn_dropout = config.attention_probs_dropout_prob
        self.backend = config.attn_implementation

    def forward(self, x: Tensor, layout: Layout, output_attentions: bool = False) -> tuple[Tensor, Tensor | None]:
        """x: rows in `layout` ([B, S, H] padded, [T, H] unpadded or packed) → the same rows, and the attention
        probabilities [B, nh, S, S] when asked for."""
        explicit = self.backend == "eager" or output_attentions
        ctx, probs = layout.attend(self.self(x), self.num_heads, self.attn_dropout, self.training, explicit)
        return self.output(ctx, x), probs


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Dense(config.hidden_size, config.intermediate_size, act=config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        return self.dense(x)  # [..., I]


class BertLayer(nn.Module):
    """Post-LN block: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertResidualOutput(config, config.intermediate_size)

    def forward(self, x: Tensor, layout: Layout, output_attentions: bool = False) -> tuple[Tensor, Tensor | None]:
        x, probs = self.attention(x, layout, output_attentions)  # [B, S, H] or [T, H]
        return self.output(self.intermediate(x), x), probs


class BertEncoder(nn.Module):
    """The blocks, in order. ALBERT's parts: embeddings narrower than H are projected to H first, and with
    `num_hidden_groups` the L blocks share the weights of that many layers (block i runs layer i * G // L)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        e, h, n = config.embedding_dim, config.hidden_size, config.num_hidden_layers
        self.embedding_projection = Dense(e, h) if e != h else None
        groups = config.num_hidden_groups or n
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(groups))
        self.schedule = [i * groups // n for i in range(n)]  # the layer each block runs
        self.gradient_checkpointing = False

    def forward(
        self, x: Tensor, layout: Layout, output_attentions: bool = False, output_hidden_states: bool = False,
        depth: int | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...] | None, tuple[Tensor, ...] | None]:
        """`depth`: run only the first `depth` blocks (0: the projected embeddings), None: all of them."""
        if self.embedding_projection is not None:
            x = self.embedding_projection(x)  # [..., E] -> [..., H]
        hidden = (x,) if output_hidden_states else None
        attentions: tuple[Tensor, ...] | None = () if output_attentions else None
        for layer in (self.layer[i] for i in self.schedule[:depth]):
            if self.gradient_checkpointing and self.training and not output_attentions:
                x, probs = torch.utils.checkpoint.checkpoint(layer, x, layout, False, use_reentrant=False)
            else:
                x, probs = layer(x, layout, output_attentions)
            if hidden is not None:
                hidden = hidden + (x,)
            if attentions is not None:
                attentions = attentions + (probs,)
        return x, hidden, attentions


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Dense(config.hidden_size, config.hidden_size, act="tanh")

    def forward(self, first: Tensor) -> Tensor:
        """tanh(dense(each sequence's first ([CLS]) hidden state [B, H])) → [B, H]."""
        return self.dense(first)


# ---------------------------------------------------------------------------------------------------- models
class BertPreTrainedModel(nn.Module):
    """Shared init, loading and saving. Subclasses set `base_model_prefix` use ("bert") or not (BertModel)."""

    config: BertConfig
    has_pooler: bool = True

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config

    def init_weights(self, only: Collection[str] | None = None) -> None:
        """N(0, initializer_range²) for matrices and embeddings (as `transformers` does; a truncated normal, BERT's
        TensorFlow init, gave fine-tuning heads 0.6 F1 points less on CoNLL-2003 over 3 seeds), LayerNorm 1/0,
        biases 0, padding row 0.

        `only`: the parameter names to initialise (the loader initialises just what a checkpoint lacks)."""
        std = self.config.initializer_range
        pad = self.config.pad_token_id
        for prefix, module in self.named_modules():
            for name, param in module.named_parameters(recurse=False):
                if only is not None and (f"{prefix}.{name}" if prefix else name) not in only:
                    continue
                with torch.no_grad():
                    if isinstance(module, LayerNorm):
                        param.fill_(1.0 if name == "weight" else 0.0)
                    elif name == "bias":  # dense layers' and the MLM decoder's
                        param.zero_()
                    else:  # dense and embedding matrices
                        nn.init.normal_(param, std=std)
                        if module is self.base_model.embeddings.word_embeddings and pad is not None:
                            param[pad].zero_()

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

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, labels: Tensor | None = None, output_attentions: bool = False,
                output_hidden_states: bool = False, **targets: Any) -> ModelOutput:
        """Every head's forward, with Hugging Face's keywords: the encoder, then the head (`head`). `targets`
        are the head's other inputs (`next_sentence_label`, `start_positions` / `end_positions`, `sparse_mlm`);
        the encoder skips padding when the head reads no padded position (`skips_padding`)."""
        out = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, output_attentions, output_hidden_states,
            unpad=self.skips_padding(labels, **targets),
        )
        return self.head(out, labels, **targets)

    def skips_padding(self, labels: Tensor | None, **targets: Any) -> bool:
        """Whether the head reads no padded position of the encoder's output (then the encoder runs unpadded)."""
        return False

    def head(self, out: BaseModelOutput, labels: Tensor | None, **targets: Any) -> ModelOutput:
        raise NotImplementedError(f"{type(self).__name__} has no task head")

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
        self.pooler = BertPooler(config) if add_pooling_layer and config.family.pooler else None
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
        if unpad and mask is not None and not (output_attentions or output_hidden_states or static_graph()):
            layout = Unpadded.from_mask(attention_mask, mask)  # type: ignore[arg-type]
            x, _, _ = self.encoder(layout.unpad(x), layout)  # [T, H]
            x, hidden, attentions = layout.pad(x), None, None  # [B, S, H]
        else:
            x, hidden, attentions = self.encoder(x, Padded(mask), output_attentions, output_hidden_states)
        pooled = self.pooler(x[:, 0]) if self.pooler is not None else None
        return BaseModelOutput(x, pooled, hidden, attentions)

    def forward_packed(self, batch: PackedBatch, max_padding: float = 0.0, depth: int | None = None) -> Tensor:
        """Last hidden states [T, H] of a `PackedBatch` (sequences end to end, no padding: the inference path of
        the pipelines). `max_padding`: see `bertforge.attention.attention_plan`. Apply the pooler to
        `hidden[batch.starts]` for each sequence's pooled output. `depth`: the hidden states after that many
        blocks instead (`hidden_states[depth]` of `forward`), the blocks above it not run."""
        offset = self.config.position_offset  # RoBERTa counts from pad_token_id + 1
        positions = batch.position_ids + offset if offset else batch.position_ids
        x = self.embeddings(batch.input_ids, batch.token_type_ids, positions)  # [T, E]
        layout = Packed.from_lengths(batch.lengths, max_padding, merge_short=self.training)  # training: SDPA for all
        x, _, _ = self.encoder(x, layout, depth=depth)
        return x

    def pool(self, first: Tensor) -> Tensor:
        """Each sequence's first hidden state [B, H] → the pooled output (the family's pooler, if it has one)."""
        return self.pooler(first) if self.pooler is not None else first


class BertPredictionHeadTransform(nn.Module):
    """dense (H → E) → activation → LayerNorm: the MLM head's transform, to the width of the word embeddings."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        act = config.family.mlm_head_act or config.hidden_act
        self.dense = Dense(config.hidden_size, config.embedding_dim, act=act)
        self.LayerNorm = LayerNorm(config.embedding_dim, config.layer_norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.LayerNorm(self.dense(x))


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


def require_sentence_head(config: BertConfig, cls: str, kinds: tuple[str, ...]) -> None:
    """Refuse a sentence-level pretraining head the family does not have (RoBERTa and DistilBERT: none)."""
    if config.family.sentence_head not in kinds:
        raise BertforgeError(
            f"{cls} needs a family with a {' or '.join(kinds)} head; {config.family.name} is pretrained with "
            f"{config.family.sentence_head or 'MLM only'} (use BertForMaskedLM)"
        )


class BertForPreTraining(BertPreTrainedModel):
    """The MLM head and the sentence head on the pooled output (BERT: next-sentence prediction; ALBERT:
    sentence-order prediction, the same head); loss = MLM loss + sentence loss."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        require_sentence_head(config, type(self).__name__, ("NSP", "SOP"))
        self.bert = BertModel(config, initialize=False)
        self.cls = BertPreTrainingHeads(config)
        self.init_weights()

    def skips_padding(self, labels: Tensor | None, sparse_mlm: bool = True, **targets: Any) -> bool:
        return labels is not None and sparse_mlm  # then only labelled positions and [CLS] are read

    def head(  # type: ignore[override]
        self,
        out: BaseModelOutput,
        labels: Tensor | None,
        next_sentence_label: Tensor | None = None,
        sparse_mlm: bool = True,
    ) -> PreTrainingOutput:
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

    skips_padding = BertForPreTraining.skips_padding  # only labelled positions are read

    def head(  # type: ignore[override]
        self, out: BaseModelOutput, labels: Tensor | None, sparse_mlm: bool = True
    ) -> MaskedLMOutput:
        word = self.bert.embeddings.word_embeddings.weight
        logits, loss = masked_lm(self.cls.predictions, word, out.last_hidden_state, labels, sparse_mlm)
        return MaskedLMOutput(loss, logits, out.hidden_states, out.attentions)


class BertForNextSentencePrediction(BertPreTrainedModel):
    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        require_sentence_head(config, type(self).__name__, ("NSP",))
        self.bert = BertModel(config, initialize=False)
        self.cls = BertPreTrainingHeads(config, mlm=False)
        self.init_weights()

    def skips_padding(self, labels: Tensor | None, **targets: Any) -> bool:
        return True  # only [CLS] is read

    def head(self, out: BaseModelOutput, labels: Tensor | None) -> SequenceClassifierOutput:  # type: ignore[override]
        logits = self.cls.seq_relationship(out.pooler_output)  # [B, 2]
        loss = F.cross_entropy(logits.float(), labels.reshape(-1)) if labels is not None else None
        return SequenceClassifierOutput(loss, logits, out.hidden_states, out.attentions)


class _ClassifierMixin:
    def _dropout_p(self) -> float:
        config: BertConfig = self.config  # type: ignore[attr-defined]
        return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


class FirstTokenHead(nn.Module):
    """The sequence head of RoBERTa and DistilBERT, on the first token's hidden state (they have no pooler there):
    (dropout →) dense → tanh or ReLU → dropout → out_proj."""

    def __init__(self, config: BertConfig, p: float) -> None:
        super().__init__()
        h = config.hidden_size
        self.dense = Dense(h, h, act=config.family.sequence_head_act)
        self.out_proj = Dense(h, config.num_labels)
        self.p = p
        self.dropout_first = config.family.dropout_before_head_dense

    def forward(self, first: Tensor) -> Tensor:
        if self.dropout_first:
            first = dropout(first, self.p, self.training)
        return self.out_proj(dropout(self.dense(first), self.p, self.training))


class BertForSequenceClassification(_ClassifierMixin, BertPreTrainedModel):
    """Pooled [CLS] → dropout → linear (BERT, ALBERT), or the `FirstTokenHead` (RoBERTa, DistilBERT). Loss: MSE
    when num_labels == 1 (regression), BCE for multi-label (float labels of shape [B, num_labels]), cross-entropy
    otherwise — or as `config.problem_type` says."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        pooled = config.family.sequence_head == "pooler"
        self.bert = BertModel(config, add_pooling_layer=pooled, initialize=False)
        self.classifier: nn.Module = Dense(config.hidden_size, config.num_labels) if pooled else FirstTokenHead(
            config, self._dropout_p()
        )
        self.init_weights()

    def classify(self, pooled: Tensor) -> Tensor:
        """Logits [B, num_labels] from `BertModel.pool` of each sequence's first hidden state."""
        if isinstance(self.classifier, FirstTokenHead):
            return self.classifier(pooled)
        return self.classifier(dropout(pooled, self._dropout_p(), self.training))

    def problem_type(self, labels: Tensor) -> str:
        if self.config.problem_type:
            return self.config.problem_type
        if self.config.num_labels == 1:
            return "regression"
        if labels.dtype in (torch.long, torch.int) and labels.dim() == 1:
            return "single_label_classification"
        return "multi_label_classification"

    skips_padding = BertForNextSentencePrediction.skips_padding  # only [CLS] is read

    def head(self, out: BaseModelOutput, labels: Tensor | None) -> SequenceClassifierOutput:  # type: ignore[override]
        pooled = out.pooler_output if out.pooler_output is not None else out.last_hidden_state[:, 0]
        logits = self.classify(pooled)  # [B, num_labels]
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

    def skips_padding(self, labels: Tensor | None, **targets: Any) -> bool:
        return labels is not None  # with labels (training, evaluation), padding is never read

    def head(self, out: BaseModelOutput, labels: Tensor | None) -> SequenceClassifierOutput:  # type: ignore[override]
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

    def head(  # type: ignore[override]
        self,
        out: BaseModelOutput,
        labels: None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
    ) -> QuestionAnsweringOutput:
        if labels is not None:
            raise BertforgeError("BertForQuestionAnswering takes start_positions and end_positions, not labels")
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
