"""What differs between tokenizer families, declared as data: a `TokenizerKind`.

A kind names its special tokens (by role, with their usual spelling), the template that adds them, the
`tokenizers` model it is built on, the pipeline (normalizer, pre-tokenizer, decoder) around that model, and what
`transformers` needs to rebuild it (`tokenizer_class` and the settings in `tokenizer_config.json`). `Tokenizer`
reads everything family-specific from its kind, so a family is a `TokenizerKind` value, not a tokenizer class:

| kind | model | pipeline | pair template | its token types |
| --- | --- | --- | --- | --- |
| `BERT`, `DISTILBERT` | WordPiece | BERT normalizer and pre-tokenizer | `[CLS] A [SEP] B [SEP]` | 0 … 0 1 … 1 |
| `ROBERTA` | BPE | byte-level (no prefix space), no normalizer | `<s> A </s></s> B </s>` | all 0 |
| `ALBERT` | Unigram | ALBERT normalizer, whitespace split, Metaspace `▁` | `[CLS] A [SEP] B [SEP]` | 0 … 0 1 … 1 |
| `XLM_ROBERTA` | Unigram | whitespace split, Metaspace `▁`, no normalizer | `<s> A </s></s> B </s>` | all 0 |
| `MODERNBERT` | BPE | byte-level (no prefix space), no normalizer | `[CLS] A [SEP] B [SEP]` | 0 … 0 1 … 1 |
| `DEBERTA` | Unigram | runs of spaces as one, NFC, Metaspace `▁` (no whitespace split) | `[CLS] A [SEP] B [SEP]` | 0 … 0 1 … 1 |
| `MPNET` | WordPiece | BERT normalizer and pre-tokenizer | `<s> A </s></s> B </s>` | all 0 |
| `MMBERT` | BPE, byte fallback | SentencePiece-style `▁` words, no normalizer | `<bos> A <eos> B <eos>` | all 0 |
| `EUROBERT` | BPE | byte-level (no prefix space), no normalizer | `BOT A EOT B EOT` (Llama 3's begin / end of text) | all 0 |

(A single segment is the pair template cut after A's closing token: `[CLS] A [SEP]`, `<s> A </s>`.)

Each pipeline is the one the `transformers` class named by `tokenizer_class` builds (5.x rebuilds the normalizer,
pre-tokenizer and decoder from its own code and `tokenizer_config.json`, reading only the vocabulary, merges,
added tokens and post-processor from `tokenizer.json`), so both libraries encode a saved tokenizer alike.

ModernBERT's files name no class of their own (`PreTrainedTokenizerFast`, which builds everything from
`tokenizer.json`); its kind is found by its special tokens (`kind_for_model`).

`kind_by_name` finds a kind by family ("bert", "roberta", ...) or by model ("wordpiece", "bpe", "unigram");
`kind_for_class` by `tokenizer_class`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import tokenizers
from tokenizers import decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE, Model, Unigram, WordPiece
from tokenizers.trainers import BpeTrainer, Trainer, UnigramTrainer, WordPieceTrainer

from bertforge.core.errors import BertforgeError

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
BYTE_LEVEL_SPACE = "\u0120"  # "Ġ": the byte-level alphabet's spelling of a space
METASPACE = "\u2581"  # "▁": SentencePiece's spelling of a space


class Normalization(NamedTuple):
    """The normalizer settings, named as in `tokenizer_config.json` (a kind uses those that apply to it)."""

    do_lower_case: bool = True
    strip_accents: bool | None = None  # None: strip accents exactly when lowercasing (original BERT)
    tokenize_chinese_chars: bool = True

    @property
    def strips_accents(self) -> bool:
        """Whether accents are removed (`strip_accents`, or lowercasing when that is None)."""
        return self.do_lower_case if self.strip_accents is None else self.strip_accents


class TemplatePiece(NamedTuple):
    """One piece of a template: a role ("cls_token") or a segment ("A", "B"), and its token type."""

    piece: str
    type_id: int

    @property
    def is_segment(self) -> bool:
        return self.piece in ("A", "B")


@dataclass(frozen=True, eq=False)
class TokenizerKind:
    """One tokenizer family: its special tokens, template, model and pipeline.

    Every callable is a module-level function (not a lambda), so that a `Tokenizer` holding its kind pickles
    (DataLoader workers pickle the tokenizer).
    """

    name: str  # the family's name in `kind_by_name`: "bert", "roberta", ...
    family: str  # the model family, as error messages name it ("BERT")
    tokenizer_class: str  # "tokenizer_class" in tokenizer_config.json, the class `transformers` builds
    model_type: type[Model]  # the `tokenizers` model a backend of this kind must use
    special_tokens: dict[str, str]  # role -> default token; the vocabulary must hold every one (training order)
    single: str  # the template for one segment, roles in braces: "{cls_token} $A {sep_token}"
    pair: str  # the template for a pair ($B:1 gives the second segment token type 1)
    pipeline: Callable[[Model, Normalization], tokenizers.Tokenizer]  # normalizer, pre-tokenizer, decoder
    decoder: Callable[[], decoders.Decoder]  # for a loaded backend that has none
    new_model: Callable[..., Model]  # (vocab or None to train, unk token, merges=...) -> model
    trainer: Callable[..., Trainer]  # keyword arguments: vocab_size, min_frequency, show_progress, ...
    config: Callable[[Normalization], dict[str, Any]]  # this kind's settings in tokenizer_config.json
    is_continuation: Callable[[str], bool]  # whether a (non-special) token continues the word before it
    default_normalization: Normalization = Normalization()
    case_options: bool = True  # whether lowercasing and accent stripping can be chosen (not for byte-level BPE)
    vocab_files: tuple[str, ...] = ("vocab.txt",)  # the plain vocabulary files written beside tokenizer.json
    alphabet_size: int = 0  # tokens every trained vocabulary holds beside the special tokens (256 bytes for BPE)
    lstrip: tuple[str, ...] = ()  # roles whose token swallows the spaces before it ("Hello <mask>")
    processor: Callable[..., processors.PostProcessor] | None = None  # (kind, backend, tokens); None: template
    finish: Callable[[tokenizers.Tokenizer], tokenizers.Tokenizer] | None = None  # completes a trained backend
    clean_up_tokenization_spaces: bool = False  # the default for a trained tokenizer

    @property
    def a_tokenizer(self) -> str:
        """"a BERT tokenizer", "an ALBERT tokenizer": the kind as error messages name it."""
        return f"{'an' if self.family[0] in 'AEIOUX' else 'a'} {self.family} tokenizer"

    @property
    def model_name(self) -> str:
        """The model's name in `kind_by_name`: "wordpiece", "bpe" or "unigram"."""
        return self.model_type.__name__.lower()

    def pieces(self, pair: bool = False) -> tuple[TemplatePiece, ...]:
        """The template (`single` or `pair`) as pieces: what `Tokenizer.build_inputs` lays out."""
        result = []
        for item in (self.pair if pair else self.single).split():
            name, _, type_id = item.partition(":")
            name = name[1:] if name.startswith("$") else name.strip("{}")
            result.append(TemplatePiece(name, int(type_id or 0)))
        return tuple(result)

    def post_processor(self, backend: tokenizers.Tokenizer, special_tokens: dict[str, str]) -> processors.PostProcessor:
        """The post-processor adding this kind's special tokens (`special_tokens`: role -> token)."""
        if self.processor is not None:
            return self.processor(self, backend, special_tokens)
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


def _wordpiece_model(vocab: dict[str, int] | None, unk_token: str, merges: Any = None) -> Model:
    kwargs: dict[str, Any] = {"vocab": vocab} if vocab is not None else {}
    return WordPiece(**kwargs, unk_token=unk_token, continuing_subword_prefix=WORDPIECE_PREFIX,
                     max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)


def _wordpiece_trainer(*, vocab_size: int, min_frequency: int, show_progress: bool, special_tokens: list[str],
                       limit_alphabet: int, unk_token: str) -> Trainer:
    return WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=show_progress,
                            special_tokens=special_tokens, limit_alphabet=limit_alphabet,
                            continuing_subword_prefix=WORDPIECE_PREFIX)


def _bert_config(normalization: Normalization) -> dict[str, Any]:
    return {
        "do_lower_case": normalization.do_lower_case,
        "strip_accents": normalization.strip_accents,
        "tokenize_chinese_chars": normalization.tokenize_chinese_chars,
    }


def _wordpiece_continuation(token: str) -> bool:
    return token.startswith(WORDPIECE_PREFIX)


BERT = TokenizerKind(
    name="bert",
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
    config=_bert_config,
    is_continuation=_wordpiece_continuation,
    clean_up_tokenization_spaces=True,
)

#: DistilBERT: BERT's WordPiece kind under its own `tokenizer_class` (a `BertTokenizer` subclass in `transformers`).
DISTILBERT = dataclasses.replace(BERT, name="distilbert", family="DistilBERT", tokenizer_class="DistilBertTokenizer")


# ---------------------------------------------------------------------- RoBERTa: byte-level BPE


def _byte_level_pipeline(model: Model, normalization: Normalization) -> tokenizers.Tokenizer:
    """A backend with RoBERTa's pipeline around `model`: no normalizer, byte-level pre-tokenizer and decoder."""
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = _byte_level_decoder()
    return backend


def _byte_level_decoder() -> decoders.Decoder:
    return decoders.ByteLevel()


def _bpe_model(vocab: dict[str, int] | None, unk_token: str, merges: list[tuple[str, str]] | None = None) -> Model:
    """A byte-level BPE model as `transformers.RobertaTokenizer` builds it: no unknown token (every byte is in the
    alphabet), no subword prefix or suffix."""
    kwargs: dict[str, Any] = {"vocab": vocab, "merges": merges or []} if vocab is not None else {}
    return BPE(**kwargs, dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)


def _bpe_trainer(*, vocab_size: int, min_frequency: int, show_progress: bool, special_tokens: list[str],
                 limit_alphabet: int, unk_token: str) -> Trainer:
    """A byte-level BPE trainer: its alphabet is the 256 bytes, so `limit_alphabet` does not apply."""
    return BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=show_progress,
                      special_tokens=special_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def _roberta_processing(kind: TokenizerKind, backend: tokenizers.Tokenizer,
                        special_tokens: dict[str, str]) -> processors.PostProcessor:
    """`RobertaProcessing`, as `transformers.RobertaTokenizer` sets it: `kind.single` / `kind.pair`, and the
    offsets trimmed of the spaces that byte-level tokens carry."""
    sep, cls = special_tokens["sep_token"], special_tokens["cls_token"]
    return processors.RobertaProcessing((sep, backend.token_to_id(sep)), (cls, backend.token_to_id(cls)),  # type: ignore[arg-type]
                                        trim_offsets=True, add_prefix_space=False)


def _roberta_config(normalization: Normalization) -> dict[str, Any]:
    return {"add_prefix_space": False, "trim_offsets": True, "errors": "replace"}


def _byte_level_continuation(token: str) -> bool:
    return not token.startswith(BYTE_LEVEL_SPACE)


ROBERTA = TokenizerKind(
    name="roberta",
    family="RoBERTa",
    tokenizer_class="RobertaTokenizer",
    model_type=BPE,
    # roberta-base's order: <s> 0, <pad> 1, </s> 2, <unk> 3 (<mask> is last there, 4 here)
    special_tokens={"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
                    "mask_token": "<mask>", "cls_token": "<s>", "sep_token": "</s>"},
    single="{cls_token} $A {sep_token}",
    pair="{cls_token} $A {sep_token} {sep_token} $B {sep_token}",
    pipeline=_byte_level_pipeline,
    decoder=_byte_level_decoder,
    new_model=_bpe_model,
    trainer=_bpe_trainer,
    config=_roberta_config,
    is_continuation=_byte_level_continuation,
    default_normalization=Normalization(do_lower_case=False, strip_accents=False, tokenize_chinese_chars=False),
    case_options=False,
    vocab_files=("vocab.json", "merges.txt"),
    alphabet_size=256,
    lstrip=("mask_token",),
    processor=_roberta_processing,
)


def _modernbert_config(normalization: Normalization) -> dict[str, Any]:
    return {"clean_up_tokenization_spaces": True}


MODERNBERT = dataclasses.replace(  # RoBERTa's byte-level BPE with BERT's template and ModernBERT's special tokens
    ROBERTA,
    name="modernbert",
    family="ModernBERT",
    tokenizer_class="PreTrainedTokenizerFast",  # generic: transformers builds it from tokenizer.json alone
    special_tokens={"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                    "mask_token": "[MASK]"},  # in the order its vocabulary holds them
    single="{cls_token} $A {sep_token}",
    pair="{cls_token} $A {sep_token} $B:1 {sep_token}:1",
    config=_modernbert_config,
    vocab_files=(),
    processor=None,
)


#: EuroBERT: RoBERTa's byte-level BPE under Llama 3's special tokens, `<|begin_of_text|> A <|end_of_text|>` (a pair
#: `… A <|end_of_text|> B <|end_of_text|>`, token type 0 throughout: it has none), padding with its end token as
#: its checkpoints do; built by `transformers` from `tokenizer.json` alone. Byte-level BPE never produces an unknown
#: token and Llama 3's vocabulary has none: the unknown role names the end token.
EUROBERT = dataclasses.replace(
    MODERNBERT,
    name="eurobert",
    family="EuroBERT",
    special_tokens={"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "mask_token": "<|mask|>",
                    "cls_token": "<|begin_of_text|>", "sep_token": "<|end_of_text|>", "pad_token": "<|end_of_text|>",
                    "unk_token": "<|end_of_text|>"},
    single="{cls_token} $A {sep_token}",
    pair="{cls_token} $A {sep_token} $B {sep_token}",
    config=_roberta_config,
)


#: MPNet: BERT's WordPiece and normalizer under RoBERTa's template and processing (`<s> A </s></s> B </s>`, token
#: type 0 throughout), as `transformers.MPNetTokenizer` builds it; its mask token swallows the space before it.
MPNET = dataclasses.replace(
    BERT,
    name="mpnet",
    family="MPNet",
    tokenizer_class="MPNetTokenizer",
    # all-mpnet-base-v2's order: <s> 0, <pad> 1 (the id MPNet's positions count after), </s> 2; its unknown token
    # is BERT's [UNK]
    special_tokens={"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "[UNK]",
                    "mask_token": "<mask>", "cls_token": "<s>", "sep_token": "</s>"},
    single="{cls_token} $A {sep_token}",
    pair="{cls_token} $A {sep_token} {sep_token} $B {sep_token}",
    lstrip=("mask_token",),
    processor=_roberta_processing,
)


# ---------------------------------------------------------------------- ALBERT, XLM-RoBERTa: Unigram


def _metaspace_pipeline(model: Model, normalization: Normalization, *, albert: bool) -> tokenizers.Tokenizer:
    """A SentencePiece-style backend around `model`: whitespace split, then "▁" for spaces and before each word.

    ALBERT's normalizer (as `transformers.AlbertTokenizer` builds it): `` and '' become ", then NFKD and accents
    removed unless they are kept, then lowercasing if asked. XLM-RoBERTa has none.
    """
    backend = tokenizers.Tokenizer(model)
    if albert:
        steps: list[normalizers.Normalizer] = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
        if normalization.strips_accents:
            steps += [normalizers.NFKD(), normalizers.StripAccents()]
        if normalization.do_lower_case:
            steps.append(normalizers.Lowercase())
        backend.normalizer = normalizers.Sequence(steps)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always")]
    )
    backend.decoder = _metaspace_decoder()
    return backend


def _albert_pipeline(model: Model, normalization: Normalization) -> tokenizers.Tokenizer:
    return _metaspace_pipeline(model, normalization, albert=True)


def _xlm_roberta_pipeline(model: Model, normalization: Normalization) -> tokenizers.Tokenizer:
    return _metaspace_pipeline(model, normalization, albert=False)


def _metaspace_decoder() -> decoders.Decoder:
    return decoders.Metaspace(replacement=METASPACE, prepend_scheme="always")


def _unigram_model(vocab: list[tuple[str, float]] | None, unk_token: str, merges: Any = None) -> Model:
    if vocab is None:
        return Unigram()
    unk_id = next((i for i, (token, _) in enumerate(vocab) if token == unk_token), None)
    return Unigram(vocab, unk_id=unk_id, byte_fallback=False)


def _unigram_trainer(*, vocab_size: int, min_frequency: int, show_progress: bool, special_tokens: list[str],
                     limit_alphabet: int, unk_token: str) -> Trainer:
    """A Unigram trainer; `min_frequency` and `limit_alphabet` do not apply to it."""
    return UnigramTrainer(vocab_size=vocab_size, show_progress=show_progress, special_tokens=special_tokens,
                          unk_token=unk_token)


def _deberta_pipeline(model: Model, normalization: Normalization) -> tokenizers.Tokenizer:
    """DeBERTa-v2/v3's backend, as `transformers.DebertaV2Tokenizer` builds it: lowercasing if asked, runs of
    spaces and any newline or tab as one space, NFC, trailing spaces stripped; Metaspace "▁" splits the words."""
    backend = tokenizers.Tokenizer(model)
    steps = [normalizers.Lowercase()] if normalization.do_lower_case else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(tokenizers.Regex(r"\s{2,}|[\n\r\t]"), " "),
                                               normalizers.NFC(), normalizers.Strip(left=False, right=True)])
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always")])
    backend.decoder = _metaspace_decoder()
    return backend


def _deberta_config(normalization: Normalization) -> dict[str, Any]:
    return {"do_lower_case": normalization.do_lower_case, "split_by_punct": False, "add_prefix_space": True}


def _albert_config(normalization: Normalization) -> dict[str, Any]:
    # transformers 5's AlbertTokenizer leaves token_type_ids out of its inputs (segment 0 everywhere) unless the
    # config names them: named, it gives a pair's second segment type 1, as ALBERT was trained and as bertforge does
    return {"do_lower_case": normalization.do_lower_case, "keep_accents": not normalization.strips_accents,
            "add_prefix_space": True, "trim_offsets": True,
            "model_input_names": ["input_ids", "token_type_ids", "attention_mask"]}


def _xlm_roberta_config(normalization: Normalization) -> dict[str, Any]:
    return {"add_prefix_space": True}


def _metaspace_continuation(token: str) -> bool:
    return not token.startswith(METASPACE)


ALBERT = TokenizerKind(
    name="albert",
    family="ALBERT",
    tokenizer_class="AlbertTokenizer",
    model_type=Unigram,
    # albert-base-v2's order; transformers' AlbertTokenizer takes <unk> to be id 1
    special_tokens={"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "[CLS]", "sep_token": "[SEP]",
                    "mask_token": "[MASK]", "bos_token": "[CLS]", "eos_token": "[SEP]"},
    single="{cls_token} $A {sep_token}",
    pair="{cls_token} $A {sep_token} $B:1 {sep_token}:1",
    pipeline=_albert_pipeline,
    decoder=_metaspace_decoder,
    new_model=_unigram_model,
    trainer=_unigram_trainer,
    config=_albert_config,
    is_continuation=_metaspace_continuation,
    default_normalization=Normalization(do_lower_case=True, strip_accents=None, tokenize_chinese_chars=False),
    vocab_files=(),
    lstrip=("mask_token",),
)

XLM_ROBERTA = TokenizerKind(
    name="xlm-roberta",
    family="XLM-RoBERTa",
    tokenizer_class="XLMRobertaTokenizer",
    model_type=Unigram,
    # xlm-roberta-base's order; transformers' XLMRobertaTokenizer takes <unk> to be id 3
    special_tokens=ROBERTA.special_tokens,
    single="{cls_token} $A {sep_token}",
    pair="{cls_token} $A {sep_token} {sep_token} $B {sep_token}",
    pipeline=_xlm_roberta_pipeline,
    decoder=_metaspace_decoder,
    new_model=_unigram_model,
    trainer=_unigram_trainer,
    config=_xlm_roberta_config,
    is_continuation=_metaspace_continuation,
    default_normalization=ROBERTA.default_normalization,
    case_options=False,
    vocab_files=(),
    lstrip=("mask_token",),
)


DEBERTA = TokenizerKind(
    name="deberta-v2",
    family="DeBERTa",
    tokenizer_class="DebertaV2Tokenizer",
    model_type=Unigram,
    # transformers' DebertaV2Tokenizer takes [UNK] to be id 1 unless its vocabulary says otherwise; cased by default
    special_tokens={"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                    "mask_token": "[MASK]", "bos_token": "[CLS]", "eos_token": "[SEP]"},
    single="{cls_token} $A {sep_token}",
    pair="{cls_token} $A {sep_token} $B:1 {sep_token}:1",
    pipeline=_deberta_pipeline,
    decoder=_metaspace_decoder,
    new_model=_unigram_model,
    trainer=_unigram_trainer,
    config=_deberta_config,
    is_continuation=_metaspace_continuation,
    default_normalization=Normalization(do_lower_case=False, strip_accents=False, tokenize_chinese_chars=False),
    vocab_files=(),
)


# ---------------------------------------------------------------------- mmBERT: byte-fallback BPE

BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))  # SentencePiece's byte pieces, for byte fallback


def _byte_fallback_pipeline(model: Model, normalization: Normalization) -> tokenizers.Tokenizer:
    """A SentencePiece-style BPE backend (Gemma's, mmBERT's): words split at spaces, each space written "▁" and kept
    with the word after it (no "▁" added before the first), no normalizer; a character outside the vocabulary
    becomes its UTF-8 bytes' pieces (`<0xE2>` ...), not the unknown token."""
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="never", split=True)
    backend.decoder = _byte_fallback_decoder()
    return backend


def _byte_fallback_decoder() -> decoders.Decoder:
    return decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(),
                              decoders.Metaspace(replacement=METASPACE, prepend_scheme="never")])


def _byte_fallback_model(vocab: dict[str, int] | None, unk_token: str, merges: list[tuple[str, str]] | None = None) -> Model:
    kwargs: dict[str, Any] = {"vocab": vocab, "merges": merges or []} if vocab is not None else {}
    return BPE(**kwargs, unk_token=unk_token, byte_fallback=True, fuse_unk=True, dropout=None)


def _byte_fallback_trainer(*, vocab_size: int, min_frequency: int, show_progress: bool, special_tokens: list[str],
                           limit_alphabet: int, unk_token: str) -> Trainer:
    """BPE over the corpus' characters, leaving room for the 256 byte pieces `_with_byte_pieces` adds."""
    return BpeTrainer(vocab_size=vocab_size - len(BYTE_TOKENS), min_frequency=min_frequency,
                      show_progress=show_progress, special_tokens=special_tokens, limit_alphabet=limit_alphabet)


def _with_byte_pieces(backend: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    """A trained backend with the byte pieces its vocabulary lacks appended (after every learnt token: the merges
    keep their ids), so that byte fallback can spell any character."""
    data = json.loads(backend.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    for token in BYTE_TOKENS:
        vocab.setdefault(token, len(vocab))
    data["model"]["byte_fallback"] = True
    return tokenizers.Tokenizer.from_str(json.dumps(data))


#: mmBERT: Gemma 2's kind of tokenizer — byte-fallback BPE over SentencePiece-style "▁" words — under its special
#: tokens (`<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3, `<mask>` 4), `<bos> A <eos>` (a pair `… A <eos> B <eos>`, one
#: token type); built by `transformers` from `tokenizer.json` alone.
MMBERT = TokenizerKind(
    name="mmbert",
    family="mmBERT",
    tokenizer_class="PreTrainedTokenizerFast",
    model_type=BPE,
    special_tokens={"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>",
                    "mask_token": "<mask>", "cls_token": "<bos>", "sep_token": "<eos>"},
    single="{cls_token} $A {sep_token}",
    pair="{cls_token} $A {sep_token} $B {sep_token}",
    pipeline=_byte_fallback_pipeline,
    decoder=_byte_fallback_decoder,
    new_model=_byte_fallback_model,
    trainer=_byte_fallback_trainer,
    config=_modernbert_config,
    is_continuation=_metaspace_continuation,
    default_normalization=Normalization(do_lower_case=False, strip_accents=False, tokenize_chinese_chars=False),
    case_options=False,
    vocab_files=(),
    alphabet_size=len(BYTE_TOKENS),
    finish=_with_byte_pieces,
)


# ---------------------------------------------------------------------- the registry

#: Every kind by its family name.
KINDS: dict[str, TokenizerKind] = {kind.name: kind for kind in (BERT, DISTILBERT, ROBERTA, ALBERT, XLM_ROBERTA,
                                                                  MODERNBERT, DEBERTA, MPNET, EUROBERT, MMBERT)}

#: The kind each model name trains by default (`bertforge train-tokenizer --model`).
KINDS_BY_MODEL: dict[str, TokenizerKind] = {"wordpiece": BERT, "bpe": ROBERTA, "unigram": ALBERT}


def kind_by_name(name: str) -> TokenizerKind:
    """The kind of a family ("bert", "distilbert", "roberta", "albert", "xlm-roberta", "modernbert", "deberta-v2", "mpnet", "eurobert", "mmbert") or of a model ("wordpiece",
    "bpe", "unigram": BERT's, RoBERTa's, ALBERT's)."""
    key = name.strip().lower().replace("_", "-")
    kind = KINDS.get(key) or KINDS_BY_MODEL.get(key) or (DEBERTA if key in ("deberta", "deberta-v3") else None)
    if kind is None:
        raise BertforgeError(f"unknown tokenizer kind {name!r}: expected one of "
                             f"{', '.join([*KINDS, *KINDS_BY_MODEL])}")
    return kind


def kind_for_class(tokenizer_class: Any) -> TokenizerKind | None:
    """The kind whose `tokenizer_class` is `tokenizer_class` (with or without "Fast"), or None."""
    if not isinstance(tokenizer_class, str) or tokenizer_class == MODERNBERT.tokenizer_class:
        return None  # the generic class names no kind: the special tokens decide (`kind_for_model`)
    name = tokenizer_class.removesuffix("Fast")
    return next((kind for kind in KINDS.values() if kind.tokenizer_class == name), None)


def kind_for_model(backend: tokenizers.Tokenizer, source: str) -> TokenizerKind:
    """The kind of a backend, from its model: the first kind with that model whose special tokens the vocabulary
    holds (else the first with that model, whose check then names the missing token)."""
    candidates = [kind for kind in KINDS.values() if isinstance(backend.model, kind.model_type)]
    if not candidates:
        supported = "; ".join(f"{m.__name__} ({', '.join(k.family for k in KINDS.values() if k.model_type is m)})"
                              for m in dict.fromkeys(kind.model_type for kind in KINDS.values()))
        raise BertforgeError(f"{source}: model {type(backend.model).__name__} is not a supported tokenizer model; "
                             f"bertforge reads {supported}")
    vocab = backend.get_vocab()
    return next((kind for kind in candidates if all(t in vocab for t in kind.special_tokens.values())), candidates[0])
