"""What differs between tokenizer families, declared as data: a `TokenizerKind`.

A kind names its special tokens (by role, with their usual spelling), the template that adds them, the
`tokenizers` model it is built on, and the pipeline (normalizer, pre-tokenizer, decoder) around that model.
`Tokenizer` reads everything family-specific from its kind, so a new family (byte-level BPE for RoBERTa, Unigram for
ALBERT) is a new `TokenizerKind` value, not a new tokenizer class. Only BERT's WordPiece kind exists today.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import tokenizers
from tokenizers import decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import Model, WordPiece
from tokenizers.trainers import Trainer, WordPieceTrainer

#: The special tokens every BERT vocabulary must hold, by role, with their usual spelling.
DEFAULT_SPECIAL_TOKENS: dict[str, str] = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}

WORDPIECE_PREFIX = "##"
MAX_INPUT_CHARS_PER_WORD = 100


class Normalization(NamedTuple):
    """The BertNormalizer settings, named as in `tokenizer_config.json`."""

    do_lower_case: bool = True
    strip_accents: bool | None = None  # None: strip accents exactly when lowercasing (original BERT)
    tokenize_chinese_chars: bool = True


@dataclass(frozen=True, eq=False)
class TokenizerKind:
    """One tokenizer family: its special tokens, template, model and pipeline.

    Every callable is a module-level function (not a lambda), so that a `Tokenizer` holding its kind pickles
    (DataLoader workers pickle the tokenizer).
    """

    name: str
    family: str  # the model family, as error messages name it ("BERT")
    tokenizer_class: str  # "tokenizer_class" in tokenizer_config.json, the class `transformers` builds
    model_type: type[Model]  # the `tokenizers` model a backend of this kind must use
    special_tokens: dict[str, str]  # role -> default token; the vocabulary must hold every one
    single: str  # the template for one segment, roles in braces: "{cls_token} $A {sep_token}"
    pair: str  # the template for a pair ($B:1 gives the second segment token type 1)
    pipeline: Callable[[Model, Normalization], tokenizers.Tokenizer]  # normalizer, pre-tokenizer, decoder
    decoder: Callable[[], decoders.Decoder]  # for a loaded backend that has none
    new_model: Callable[[dict[str, int] | None, str], Model]  # (vocab or None to train, unk token) -> model
    trainer: Callable[..., Trainer]  # keyword arguments: vocab_size, min_frequency, show_progress, ...
    vocab_file: str | None = "vocab.txt"  # the plain vocabulary file written beside tokenizer.json, if any

    def template(self, backend: tokenizers.Tokenizer, special_tokens: dict[str, str]) -> processors.TemplateProcessing:
        """The post-processor adding this kind's special tokens (`special_tokens`: role -> token)."""
        single = self.single.format(**special_tokens)
        pair = self.pair.format(**special_tokens)
        used = [token for role, token in special_tokens.items() if "{" + role + "}" in self.single + self.pair]
        return processors.TemplateProcessing(
            single=single,
            pair=pair,
            special_tokens=[(token, backend.token_to_id(token)) for token in dict.fromkeys(used)],
        )


# ---------------------------------------------------------------------- BERT: WordPiece


def _bert_pipeline(model: Model, normalization: Normalization) -> tokenizers.Tokenizer:
    """A backend with the BERT normalizer, pre-tokenizer and decoder around `model`.

    It has no post-processor yet: `Tokenizer.__init__` adds the template once it has checked that the vocabulary
    holds the special tokens.
    """
    backend = tokenizers.Tokenizer(model)
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=normalization.tokenize_chinese_chars,
        strip_accents=normalization.strip_accents,
        lowercase=normalization.do_lower_case,
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = _wordpiece_decoder()
    return backend


def _wordpiece_decoder() -> decoders.Decoder:
    return decoders.WordPiece(prefix=WORDPIECE_PREFIX)


def _wordpiece_model(vocab: dict[str, int] | None, unk_token: str) -> Model:
    kwargs: dict[str, Any] = {"vocab": vocab} if vocab is not None else {}
    return WordPiece(**kwargs, unk_token=unk_token, continuing_subword_prefix=WORDPIECE_PREFIX,
                     max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)


def _wordpiece_trainer(**options: Any) -> Trainer:
    return WordPieceTrainer(**options, continuing_subword_prefix=WORDPIECE_PREFIX)


BERT = TokenizerKind(
    name="bert-wordpiece",
    family="BERT",
    tokenizer_class="BertTokenizer",
    model_type=WordPiece,
    special_tokens=DEFAULT_SPECIAL_TOKENS,
    single="{cls_token} $A {sep_token}",
    pair="{cls_token} $A {sep_token} $B:1 {sep_token}:1",
    pipeline=_bert_pipeline,
    decoder=_wordpiece_decoder,
    new_model=_wordpiece_model,
    trainer=_wordpiece_trainer,
)
