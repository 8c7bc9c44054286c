"""The models: the encoder (`BertModel`) and one class per task, each the encoder plus a head, with
`transformers`' keywords and outputs. Which parts the encoder has is the config's spec (`BertConfig.spec`, from
its family); these classes are the same for every family (`save_pretrained` writes the family's class names).

Shapes: B = batch, S = sequence length, H = hidden size, V = vocabulary, N = labelled (masked) positions.

The module tree mirrors `transformers`' BERT so that BERT's `state_dict()` keys are the ecosystem's names as they
are (`bert.encoder.layer.0.attention.self.query.weight`, ...); every other family's adapter translates its names
to these and back (`bertforge.families`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import BertConfig
from ..core.constants import IGNORE_INDEX
from ..core.errors import BertforgeError
from ..core.ops import dropout
from .pooling import pool
from .attention import (Packed, PackedBatch, Padded, Unpadded, document_layout, extended_attention_mask,
                        static_graph)
from .encoder import BertAttention, BertEmbeddings, BertEncoder, BertLayer, BertPooler
from .heads import (BertPredictionHeadTransform, BertPreTrainingHeads, FirstTokenHead, masked_lm, pool_padded,
                    require_sentence_head)
from .outputs import (BaseModelOutput, MaskedLMOutput, ModelOutput, PreTrainingOutput, QuestionAnsweringOutput,
                      SequenceClassifierOutput)
from .parts import Dense, init_matrix
from .spec import EncoderSpec


class BertPreTrainedModel(nn.Module):
    """Shared init, loading and saving, and what code outside the model may ask of it (its blocks, its input
    embeddings, the depth of each parameter) instead of naming its submodules."""

    config: BertConfig

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config

    def init_weights(self, only: Collection[str] | None = None) -> None:
        """Each part initialises its own parameters by the spec's init rule (`init_parameter`: `parts.Dense`,
        `parts.Embedding`, the norms, ...; `parts.INIT_RULES`); a parameter of a module that is no part (the MLM
        decoder's bias, RTD's embedding delta) is zero if a bias, else drawn as a matrix.

        `only`: the parameter names to initialise (the loader initialises just what a checkpoint lacks)."""
        spec = self.base_model.spec
        for prefix, module in self.named_modules():
            own_rule = getattr(module, "init_parameter", None)
            for name, param in module.named_parameters(recurse=False):
                if param.is_meta or (only is not None and (f"{prefix}.{name}" if prefix else name) not in only):
                    continue  # a model built without storage (the loader's, the memory estimate's) has none to fill
                with torch.no_grad():
                    if own_rule is not None:
                        own_rule(name, param, spec)
                    elif name == "bias":
                        param.zero_()
                    else:
                        init_matrix(param, spec, "in")

    @property
    def base_model(self) -> "BertModel":
        return getattr(self, "bert", self)  # type: ignore[arg-type]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def blocks(self) -> list[BertLayer]:
        """The encoder's layers, each once (what FSDP wraps, int8 quantises and a student copies)."""
        return list(self.base_model.encoder.blocks())

    def input_embeddings(self) -> Tensor:
        """The word-embedding matrix [V, E] (tied to the MLM decoder)."""
        return self.base_model.embeddings.word_embeddings.weight

    def parameter_depths(self) -> tuple[int, dict[int, int]]:
        """L, the number of blocks, and the depth of each encoder parameter, by `id`: 0 for the embeddings (ALBERT's
        E -> H projection and DeBERTa's relative table included), i for the layer block i runs (a layer shared by
        several blocks takes the topmost one's). Parameters not listed (final norm, pooler, heads) sit above."""
        bert = self.base_model
        encoder = bert.encoder
        depth = {id(p): 0 for p in bert.embeddings.parameters()}
        for part in encoder.shared_parts():
            depth.update((id(p), 0) for p in part.parameters())
        for block, index in enumerate(encoder.schedule, start=1):  # a later (higher) block overwrites a shared layer's
            depth.update((id(p), block) for p in encoder.layer[index].parameters())
        return len(encoder.schedule), depth

    def head_prefixes(self) -> tuple[str, ...]:
        """The `state_dict` prefixes of the task head's weights (everything beside the encoder, and the pooler where
        the head reads it): what a checkpoint must hold for the head to be trained, not fresh."""
        own = tuple(f"{name}." for name, _ in self.named_children() if name != "bert")
        pooler = "bert.pooler." if getattr(self.base_model, "pooler", None) is not None and self is not self.base_model else None
        return own + ((pooler,) if pooler else ())

    def set_attn_implementation(self, backend: str) -> None:
        """Run attention with `backend` ("sdpa", "eager"): every model of the tree gets a new config saying so (the
        one it was built with is not changed) and every attention module the backend."""
        config = dataclasses.replace(self.config, attn_implementation=backend)  # validated: a bad name fails here
        for module in self.modules():
            if isinstance(module, BertPreTrainedModel):
                module.config = config
            elif isinstance(module, BertAttention):
                module.backend = backend

    def gradient_checkpointing_enable(self) -> None:
        self.base_model.encoder.gradient_checkpointing = True

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, labels: Tensor | None = None, output_attentions: bool = False,
                output_hidden_states: bool = False, document_ids: Tensor | None = None, **targets: Any) -> ModelOutput:
        """Every head's forward, with Hugging Face's keywords: the encoder, then the head (`head`). `targets`
        are the head's other inputs (`next_sentence_label`, `start_positions` / `end_positions`, `sparse_mlm`);
        the encoder skips padding when the head reads no padded position (`skips_padding`). `document_ids`: rows
        that pack several documents (see `BertModel.forward`)."""
        out = self.bert(  # type: ignore[operator]
            input_ids, attention_mask, token_type_ids, position_ids, output_attentions, output_hidden_states,
            unpad=self.skips_padding(labels, **targets), document_ids=document_ids,
        )
        return self.head(out, labels, attention_mask=attention_mask, **targets)

    def skips_padding(self, labels: Tensor | None, **targets: Any) -> bool:
        """Whether the head reads no padded position of the encoder's output (then the encoder runs unpadded)."""
        return False

    def head(self, out: BaseModelOutput, labels: Tensor | None, attention_mask: Tensor | None = None,
             **targets: Any) -> ModelOutput:
        """The head's outputs and loss from the encoder's `out`; `attention_mask` [B, S] for heads that pool."""
        raise NotImplementedError(f"{type(self).__name__} has no task head")

    @classmethod
    def from_pretrained(cls, path: Any, **overrides: Any) -> Any:
        from .checkpoint import load_pretrained

        return load_pretrained(cls, path, **overrides)

    def save_pretrained(self, path: Any, card: Any = None) -> None:
        """config.json, model.safetensors and the model card (`card`: a `card.ModelCard`) in `path`."""
        from .checkpoint import save_pretrained

        save_pretrained(self, path, card)


class BertModel(BertPreTrainedModel):
    def __init__(self, config: BertConfig, add_pooling_layer: bool | None = None, *, initialize: bool = True,
                 spec: EncoderSpec | None = None) -> None:
        """`add_pooling_layer`: None for the family's base model (a pooler where `spec.pooler`), True where a head
        reads the pooler (a NomicBERT classifier: its base model has none). `spec`: the encoder's parts, if not
        the ones the config's family reads (an encoder no family has)."""
        super().__init__(config)
        spec = spec or config.spec
        self.spec = spec
        self.embeddings = BertEmbeddings(spec)
        self.encoder = BertEncoder(spec, config.attn_implementation)
        pooled = spec.pooler if add_pooling_layer is None else add_pooling_layer
        self.pooler = BertPooler(spec) if pooled else None
        if initialize:  # a head class initialises the whole tree once, body included
            self.init_weights()

    def forward(  # type: ignore[override]
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        *,
        unpad: bool = False,
        document_ids: Tensor | None = None,
    ) -> BaseModelOutput:
        """`unpad=True` runs the encoder on the real tokens only (see `Unpadded`) when the batch has padding and no
        per-layer outputs are asked for. The real positions are the same either way; padding positions of
        `last_hidden_state` are then zeros instead of values nobody should use. The heads whose outputs never
        read padding positions (sparse MLM, NSP, sequence classification) turn it on. `document_ids` [B, S]: rows
        that pack several documents (`forward_documents`)."""
        if document_ids is not None:
            if output_attentions or output_hidden_states or position_ids is not None:
                raise BertforgeError("document_ids (rows packing several documents) gives no per-layer outputs and "
                                     "counts positions itself: leave out output_attentions, output_hidden_states "
                                     "and position_ids")
            return self.forward_documents(input_ids, attention_mask, token_type_ids, document_ids)
        x = self.embeddings(input_ids, token_type_ids, position_ids, attention_mask)  # [B, S, E]
        mask = extended_attention_mask(attention_mask, x.dtype)  # [B, 1, 1, S] or None
        if unpad and mask is not None and not (output_attentions or output_hidden_states or static_graph()):
            layout = Unpadded.from_mask(attention_mask, mask)  # type: ignore[arg-type]
            x, _, _ = self.encoder(layout.unpad(x), layout)  # [T, H]
            x, hidden, attentions = layout.pad(x), None, None  # [B, S, H]
        else:
            x, hidden, attentions = self.encoder(x, Padded(mask), output_attentions, output_hidden_states)
        pooled = self.pooler(x[:, 0]) if self.pooler is not None else None
        return BaseModelOutput(x, pooled, hidden, attentions)

    def forward_documents(self, input_ids: Tensor, attention_mask: Tensor | None, token_type_ids: Tensor | None,
                          document_ids: Tensor) -> BaseModelOutput:
        """Rows [B, S] that pack several documents (`document_ids` [B, S]: the tokens of a row with one id, side
        by side, are one document), each attending only within itself, its positions (a position table's, rotary
        ones, windows) counted from its own start: every token gets what the document alone would give it. The
        encoder runs on the real tokens, the documents end to end by length ([T, H], `attention.document_layout`);
        padding rows come back as zeros and the pooled output is each row's first token's."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        rows = Unpadded.from_mask(attention_mask, None)  # [B, S] ↔ [T], row order
        layout, order, positions = document_layout(rows.index, document_ids, merge_short=self.training)  # type: ignore[arg-type]
        position_ids = None
        if self.spec.position_kind.table:  # each document counts from 0 (RoBERTa from the padding id + 1)
            position_ids = positions + self.spec.position_offset

        def packed(t: Tensor) -> Tensor:  # [B, S] → [T] in the layout's order (documents by length)
            return rows.unpad(t[..., None]).squeeze(1).index_select(0, order)

        types = packed(token_type_ids) if token_type_ids is not None else None
        x = self.embeddings(packed(input_ids), types, position_ids)  # [T, E]
        x, _, _ = self.encoder(x, layout)  # [T, H]
        x = rows.pad(x.index_select(0, torch.argsort(order)))  # [B, S, H], row order
        pooled = self.pooler(x[:, 0]) if self.pooler is not None else None
        return BaseModelOutput(x, pooled, None, None)

    def forward_packed(self, batch: PackedBatch, max_padding: float = 0.0, depth: int | None = None) -> Tensor:
        """Last hidden states [T, H] of a `PackedBatch` (sequences end to end, no padding: the inference path of
        the pipelines). `max_padding`: see `bertforge.model.attention.attention_plan`. Apply the pooler to
        `hidden[batch.starts]` for each sequence's pooled output. `depth`: the hidden states after that many
        blocks instead (`hidden_states[depth]` of `forward`), the blocks above it not run."""
        positions = batch.position_ids + self.spec.position_offset  # RoBERTa counts from pad_token_id + 1
        x = self.embeddings(batch.input_ids, batch.token_type_ids, positions)  # [T, E]
        layout = Packed.from_lengths(batch.lengths, max_padding, merge_short=self.training)  # training: SDPA for all
        x, _, _ = self.encoder(x, layout, depth=depth)
        return x

    def pool(self, first: Tensor) -> Tensor:
        """Each sequence's first hidden state [B, H] → the pooled output (the family's pooler, if it has one)."""
        return self.pooler(first) if self.pooler is not None else first


class BertForPreTraining(BertPreTrainedModel):
    """The MLM head and the sentence head on the pooled output (BERT: next-sentence prediction; ALBERT:
    sentence-order prediction, the same head); loss = MLM loss + sentence loss."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        require_sentence_head(config, type(self).__name__, ("NSP", "SOP"))
        self.bert = BertModel(config, initialize=False)
        self.cls = BertPreTrainingHeads(self.bert.spec)
        self.init_weights()

    def skips_padding(self, labels: Tensor | None, sparse_mlm: bool = True, **targets: Any) -> bool:
        return labels is not None and sparse_mlm  # then only labelled positions and [CLS] are read

    def mlm_head(self) -> nn.Module:
        """The MLM head (transform and decoder bias; the decoder's weight is the word embeddings)."""
        return self.cls.predictions

    def sentence_head_parts(self) -> tuple[nn.Module, ...]:
        """The modules only the sentence objective trains (the pooler and the NSP / SOP classifier)."""
        return tuple(m for m in (self.bert.pooler, self.cls.seq_relationship) if m is not None)

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """Vocabulary logits [..., V] of final hidden states [..., H]."""
        return self.cls.predictions(hidden, self.input_embeddings())

    def head(  # type: ignore[override]
        self,
        out: BaseModelOutput,
        labels: Tensor | None,
        attention_mask: Tensor | None = None,
        next_sentence_label: Tensor | None = None,
        sparse_mlm: bool = True,
    ) -> PreTrainingOutput:
        logits, mlm_loss = masked_lm(self.cls.predictions, self.input_embeddings(), out.last_hidden_state, labels, sparse_mlm)
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
    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False, initialize=False)
        self.cls = BertPreTrainingHeads(self.bert.spec, nsp=False)
        self.init_weights()

    skips_padding = BertForPreTraining.skips_padding  # only labelled positions are read
    mlm_head = BertForPreTraining.mlm_head
    mlm_logits = BertForPreTraining.mlm_logits

    def head(  # type: ignore[override]
        self, out: BaseModelOutput, labels: Tensor | None, attention_mask: Tensor | None = None, sparse_mlm: bool = True
    ) -> MaskedLMOutput:
        logits, loss = masked_lm(self.cls.predictions, self.input_embeddings(), out.last_hidden_state, labels, sparse_mlm)
        return MaskedLMOutput(loss, logits, out.hidden_states, out.attentions)


class BertForNextSentencePrediction(BertPreTrainedModel):
    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        require_sentence_head(config, type(self).__name__, ("NSP",))
        self.bert = BertModel(config, initialize=False)
        self.cls = BertPreTrainingHeads(self.bert.spec, mlm=False)
        self.init_weights()

    def skips_padding(self, labels: Tensor | None, **targets: Any) -> bool:
        return True  # only [CLS] is read

    def head(self, out: BaseModelOutput, labels: Tensor | None,  # type: ignore[override]
             attention_mask: Tensor | None = None) -> SequenceClassifierOutput:
        logits = self.cls.seq_relationship(out.pooler_output)  # [B, 2]
        loss = F.cross_entropy(logits.float(), labels.reshape(-1)) if labels is not None else None
        return SequenceClassifierOutput(loss, logits, out.hidden_states, out.attentions)


class _ClassifierMixin:
    def _dropout_p(self) -> float:
        config: BertConfig = self.config  # type: ignore[attr-defined]
        return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob

    def _transform(self, hidden: Tensor) -> Tensor:
        """ModernBERT's head transform and dropout before a classifier (`HeadSpec.token_transform`), or the
        dropout alone."""
        if self.head_transform is not None:  # type: ignore[attr-defined]
            hidden = self.head_transform(hidden)  # type: ignore[attr-defined]
        return dropout(hidden, self._dropout_p(), self.training)  # type: ignore[attr-defined]

    def _head_transform(self, sequences: bool = False) -> BertPredictionHeadTransform | None:
        """The transform before this head's classifier, if the spec gives it one (`sequences`: the sequence head's,
        else the token and span heads')."""
        spec = self.bert.spec  # type: ignore[attr-defined]
        heads = spec.heads
        wanted = heads.sequence_kind.transform if sequences else heads.token_transform
        return BertPredictionHeadTransform(spec, spec.hidden_size, heads.sequence_act, heads.transform_norm) if wanted else None


class BertForSequenceClassification(_ClassifierMixin, BertPreTrainedModel):
    """Pooled [CLS] → dropout → linear (BERT, ALBERT), the `FirstTokenHead` (RoBERTa, DistilBERT), or the
    sequences pooled as the spec says (token 0 or the mean) → transform → dropout → linear (ModernBERT). Loss:
    MSE when num_labels == 1 (regression), BCE for multi-label (float labels of shape [B, num_labels]),
    cross-entropy otherwise — or as `config.problem_type` says."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        kind = config.spec.heads.sequence_kind
        self.bert = BertModel(config, add_pooling_layer=kind.pooler, initialize=False)
        spec = self.bert.spec
        self.head_transform = self._head_transform(sequences=True)
        self.classifier: nn.Module = FirstTokenHead(spec, config.num_labels, self._dropout_p()) if kind.first_token else (
            Dense(config.hidden_size, config.num_labels, role="final"))
        self.init_weights()

    def classify(self, pooled: Tensor) -> Tensor:
        """Logits [B, num_labels] from each sequence's pooled vector (`BertModel.pool` of its first hidden state,
        or the pooling the spec names)."""
        if isinstance(self.classifier, FirstTokenHead):
            return self.classifier(pooled)
        return self.classifier(self._transform(pooled))

    def packed_logits(self, hidden: Tensor, batch: PackedBatch) -> Tensor:
        """Logits [B, num_labels] from packed last hidden states [T, H] (`BertModel.forward_packed`): of each
        sequence's pooler output or first token, or of the mean where the spec pools so (ModernBERT's
        `classifier_pooling`), or each token's logits averaged ("late": EuroBERT's)."""
        heads = self.bert.spec.heads
        if heads.pooling == "late":
            return pool(self.classify(hidden), batch.lengths, batch.starts, "mean")
        if heads.sequence_kind.transform:
            return self.classify(pool(hidden, batch.lengths, batch.starts, heads.pooling))
        return self.classify(self.bert.pool(hidden[batch.starts]))

    def problem_type(self, labels: Tensor) -> str:
        if self.config.problem_type:
            return self.config.problem_type
        if self.config.num_labels == 1:
            return "regression"
        if labels.dtype in (torch.long, torch.int) and labels.dim() == 1:
            return "single_label_classification"
        return "multi_label_classification"

    skips_padding = BertForNextSentencePrediction.skips_padding  # only [CLS] is read

    def head(self, out: BaseModelOutput, labels: Tensor | None,  # type: ignore[override]
             attention_mask: Tensor | None = None) -> SequenceClassifierOutput:
        pooling = self.bert.spec.heads.pooling
        if pooling == "late":  # every token classified, the logits averaged over the real ones
            logits = pool_padded(self.classify(out.last_hidden_state), attention_mask, pooling)
        else:
            pooled = out.pooler_output if out.pooler_output is not None else pool_padded(
                out.last_hidden_state, attention_mask, pooling)
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


class BertForMultipleChoice(_ClassifierMixin, BertPreTrainedModel):
    """Each example's choices, input_ids [B, C, S], scored by one logit each: logits [B, C], and the cross-entropy
    of the right choice's index (labels [B]). The head on each (example, choice) sequence is the spec's
    `HeadSpec.choice`: the family's sequence head with one label, the pooled first token → dropout → linear
    (RoBERTa, MPNet), or ELECTRA's summary: token 0 → dense → GELU → dropout → linear."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        heads = config.spec.heads
        kind = heads.sequence_kind
        self.choice = heads.choice
        pooler = self.choice == "pooler" or (self.choice == "sequence" and kind.pooler)
        self.bert = BertModel(config, add_pooling_layer=pooler, initialize=False)
        spec = self.bert.spec
        h = config.hidden_size
        self.head_transform = self._head_transform(sequences=True) if self.choice == "sequence" else None
        self.summary = Dense(h, h, act=heads.sequence_act, role="head") if self.choice == "summary" else None
        first_token = self.choice == "sequence" and kind.first_token
        self.classifier: nn.Module = FirstTokenHead(spec, 1, self._dropout_p()) if first_token else Dense(h, 1, role="final")
        self.init_weights()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,  # type: ignore[override]
                token_type_ids: Tensor | None = None, position_ids: Tensor | None = None, labels: Tensor | None = None,
                output_attentions: bool = False, output_hidden_states: bool = False, **targets: Any) -> ModelOutput:
        choices = input_ids.shape[1]

        def flat(t: Tensor | None) -> Tensor | None:  # [B, C, S] -> [B * C, S]
            return None if t is None else t.reshape(-1, t.shape[-1])

        out = super().forward(flat(input_ids), flat(attention_mask), flat(token_type_ids),  # type: ignore[arg-type]
                              flat(position_ids), None, output_attentions, output_hidden_states, **targets)
        logits = out.logits.view(-1, choices)  # type: ignore[attr-defined]
        loss = None if labels is None else F.cross_entropy(logits.float(), labels.reshape(-1))
        return SequenceClassifierOutput(loss, logits, out.hidden_states, out.attentions)  # type: ignore[attr-defined]

    def head(self, out: BaseModelOutput, labels: Tensor | None,  # type: ignore[override]
             attention_mask: Tensor | None = None) -> SequenceClassifierOutput:
        """One logit per sequence [B * C, 1]."""
        if self.summary is not None:
            logits = self.classifier(dropout(self.summary(out.last_hidden_state[:, 0]), self._dropout_p(), self.training))
        elif self.choice == "pooler":
            logits = self.classifier(dropout(out.pooler_output, self._dropout_p(), self.training))  # type: ignore[arg-type]
        else:
            logits = BertForSequenceClassification.head(self, out, None, attention_mask).logits  # type: ignore[arg-type]
        return SequenceClassifierOutput(None, logits, out.hidden_states, out.attentions)

    classify = BertForSequenceClassification.classify

    def packed_logits(self, hidden: Tensor, batch: PackedBatch) -> Tensor:
        """One logit per sequence [N, 1] from packed last hidden states [T, H] (`BertModel.forward_packed`): each
        (example, choice) sequence scored by the head `forward` gives it (the pipelines' path)."""
        first = hidden[batch.starts]  # [N, H]
        p = self._dropout_p()
        if self.summary is not None:
            return self.classifier(dropout(self.summary(first), p, self.training))
        if self.choice == "pooler":
            return self.classifier(dropout(self.bert.pool(first), p, self.training))
        return BertForSequenceClassification.packed_logits(self, hidden, batch)  # type: ignore[arg-type]


class BertForTokenClassification(_ClassifierMixin, BertPreTrainedModel):
    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False, initialize=False)
        self.head_transform = self._head_transform()
        self.classifier = Dense(config.hidden_size, config.num_labels, role="final")
        self.init_weights()

    def skips_padding(self, labels: Tensor | None, **targets: Any) -> bool:
        return labels is not None  # with labels (training, evaluation), padding is never read

    def token_logits(self, hidden: Tensor) -> Tensor:
        """Label logits [..., num_labels] of final hidden states [..., H] (the pipelines' packed rows too)."""
        return self.classifier(self._transform(hidden))

    def head(self, out: BaseModelOutput, labels: Tensor | None,  # type: ignore[override]
             attention_mask: Tensor | None = None) -> SequenceClassifierOutput:
        logits = self.token_logits(out.last_hidden_state)  # [B, S, L]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)
        return SequenceClassifierOutput(loss, logits, out.hidden_states, out.attentions)


class BertForQuestionAnswering(_ClassifierMixin, BertPreTrainedModel):
    """Span extraction: a linear layer gives start and end logits per token (after ModernBERT's transform and
    dropout where the spec has them)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        if config.num_labels != 2:
            raise BertforgeError(f"BertForQuestionAnswering needs num_labels == 2 (start, end), got {config.num_labels}")
        self.bert = BertModel(config, add_pooling_layer=False, initialize=False)
        self.head_transform = self._head_transform()
        self.qa_outputs = Dense(config.hidden_size, 2, role="final")
        self.init_weights()

    def span_logits(self, hidden: Tensor) -> Tensor:
        """Start and end logits [..., 2] of final hidden states [..., H] (the pipelines' packed rows too)."""
        if self.head_transform is not None:
            hidden = self._transform(hidden)
        return self.qa_outputs(hidden)

    def head(  # type: ignore[override]
        self,
        out: BaseModelOutput,
        labels: None,
        attention_mask: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
    ) -> QuestionAnsweringOutput:
        if labels is not None:
            raise BertforgeError("BertForQuestionAnswering takes start_positions and end_positions, not labels")
        start_logits, end_logits = self.span_logits(out.last_hidden_state).float().unbind(-1)  # [B, S] each
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
        BertForMultipleChoice,
        BertForTokenClassification,
        BertForQuestionAnswering,
    )
}
