"""`Tokenizer`: a tokenizer of any BERT-family kind whose encodings match `transformers`, over `tokenizers`.

All the actual tokenization (normalization, pre-tokenization, WordPiece / BPE / Unigram, special-token templates,
truncation, padding, offsets) is done by a `tokenizers.Tokenizer` (the Rust backend, exposed as
`Tokenizer.backend`). The class ties together what lives beside it: the family-specific parts (`kinds.py`: special
tokens, template, model and pipeline), the vocabulary and special tokens it inherits (`vocabulary.py`), the
tokenizer files (`files.py`) and the `__call__` argument handling and batching (`encoding.py`).

The backend's truncation and padding settings are changed for each call, so every call that encodes holds a lock;
one `Tokenizer` can be shared between threads.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken

from bertforge.core.errors import BertforgeError
from bertforge.tokenizer import encoding
from bertforge.tokenizer.encoding import retry_without_surrogates
from bertforge.tokenizer.files import (
    DEFAULT_MODEL_MAX_LENGTH,
    LARGEST_SANE_MAX_LENGTH,
    check_vocabulary_ids,
    read_pretrained,
    training_texts,
    vocab_file_texts,
    write_pretrained,
)
from bertforge.tokenizer.kinds import BERT, Normalization, TokenizerKind, kind_by_name
from bertforge.tokenizer.vocabulary import Vocabulary, special_added_tokens
from bertforge.core.hub import model_path


def _model_vocab_size(directory: Path) -> int | None:
    """`vocab_size` of the model's config.json beside the tokenizer files, when there is a readable one (a damaged
    config.json is the model loader's to report)."""
    try:
        value = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class Tokenizer(Vocabulary):
    """A tokenizer whose encodings match those of `transformers.AutoTokenizer` on the same files.

    Build one with `Tokenizer.from_pretrained(dir)` or `Tokenizer.train(...)`; the constructor wraps an existing
    `tokenizers.Tokenizer`. What is particular to a family (special tokens, template, model, pipeline) comes from
    `kind`, a `TokenizerKind` (`kinds.BERT`, `ROBERTA`, `ALBERT`, ...).
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        special_tokens: dict[str, str] | None = None,
        normalization: Normalization | None = None,
        model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces: bool = False,
        source: str = "tokenizer",
        kind: TokenizerKind = BERT,
    ) -> None:
        """Wrap `backend`.

        Args:
            backend: a `tokenizers.Tokenizer` with the model of `kind` (WordPiece for BERT). It is used as is,
                except that its truncation and padding are switched off and the special tokens are registered as
                special added tokens (so that "[CLS]" in the text is one token, and
                `decode(skip_special_tokens=True)` drops it), as `transformers` does; a token the backend already
                has as an added token keeps its stripping of spaces, a new one strips them as `kind.lstrip` says.
            special_tokens: role ("pad_token", "unk_token", ...) -> token; missing roles use the kind's defaults.
            normalization: the settings written to `tokenizer_config.json` (they must describe the backend's
                normalizer, which `transformers` rebuilds from them); None: the kind's defaults.
            model_max_length: the default `max_length` for truncation and `padding="max_length"`.
            clean_up_tokenization_spaces: whether `decode` glues punctuation back on ("a ." -> "a.").
            source: what to name in error messages (usually the file the backend came from).
            kind: the tokenizer family (`kinds.BERT`, `kinds.ROBERTA`, ...).
        """
        if not isinstance(backend.model, kind.model_type):
            raise BertforgeError(f"{source}: model is {type(backend.model).__name__}, {kind.a_tokenizer} needs "
                                 f"{kind.model_type.__name__}")
        super().__init__(backend, special_tokens, kind, source)
        if backend.post_processor is None:
            backend.post_processor = kind.post_processor(backend, self._special_tokens)
        if backend.decoder is None:
            backend.decoder = kind.decoder()
        backend.no_truncation()
        backend.no_padding()
        self._normalization = kind.default_normalization if normalization is None else normalization
        self.model_max_length = model_max_length
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ loading, training, saving

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], *, kind: TokenizerKind | str | None = None) -> Tokenizer:
        """Load the tokenizer in directory `path`.

        Reads `tokenizer.json` when present, else builds the kind's pipeline from its plain vocabulary
        (`vocab.txt`, or `vocab.json` + `merges.txt`); settings (lowercasing, accents, special tokens,
        `model_max_length`) come from the optional `tokenizer_config.json` and `special_tokens_map.json`, the
        latter taking precedence as in `transformers`.

        `kind` (a `TokenizerKind` or a name for `kinds.kind_by_name`) is found when not given: the one
        `tokenizer_config.json`'s "tokenizer_class" names, else the one whose model `tokenizer.json` uses (for a
        model several kinds use, the first whose special tokens the vocabulary holds), else the one whose
        vocabulary files the directory holds. A PEFT adapter directory without tokenizer files has its base
        model's (`base_model_name_or_path`).
        """
        path = model_path(path, weights=False)  # a snapshot holding the tokenizer only will do
        try:
            files = read_pretrained(path, kind_by_name(kind) if isinstance(kind, str) else kind)
        except BertforgeError:
            from ..model.lora import adapted_config, is_adapter_dir

            if not is_adapter_dir(path):
                raise
            return cls.from_pretrained(adapted_config(path)[0], kind=kind)
        tokenizer = cls(
            files.backend,
            special_tokens=files.special_tokens,
            normalization=files.normalization,
            model_max_length=files.model_max_length,
            clean_up_tokenization_spaces=files.clean_up_tokenization_spaces,
            source=str(files.source),
            kind=files.kind,
        )
        if files.from_json:  # (vocab.txt gives ids 0..N-1 by construction)
            check_vocabulary_ids(files.backend.get_vocab(with_added_tokens=False), files.source)
        model_vocab = _model_vocab_size(Path(path))
        if model_vocab is not None:
            tokenizer.check_fits_model(model_vocab, str(Path(path)))
        return tokenizer

    @classmethod
    def train(
        cls,
        files_or_iterator: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Iterable[str],
        vocab_size: int = 30522,
        lowercase: bool | None = None,
        min_frequency: int = 2,
        strip_accents: bool | None = None,
        limit_alphabet: int = 1000,
        show_progress: bool | None = None,
        *,
        kind: TokenizerKind | str = BERT,
    ) -> Tokenizer:
        """Train a vocabulary of `kind` (WordPiece for BERT, byte-level BPE for RoBERTa, Unigram for ALBERT and
        XLM-RoBERTa) with that kind's pipeline.

        Args:
            files_or_iterator: a text file path, a list/tuple of them (UTF-8, one or more sentences a line; names
                ending in `.gz` are gunzipped), or any other iterable of text strings (a generator, say).
            vocab_size: the size of the vocabulary, special tokens included (a Unigram trainer may stop short of
                it on a small corpus).
            lowercase: lowercase the text (an "uncased" model); None: the kind's default (True for BERT and
                ALBERT). RoBERTa's and XLM-RoBERTa's pipelines keep case and accents: True is refused.
            min_frequency: how often a pair must occur to be merged (WordPiece and BPE).
            strip_accents: remove accents; None does so exactly when lowercasing.
            limit_alphabet: the most distinct characters to keep (WordPiece; BPE's alphabet is the 256 bytes).
            show_progress: show the trainer's progress bar, which `tokenizers` draws on stdout; None: when stdout
                is a terminal (redirected, it would be blank lines among the output).
            kind: the tokenizer family, a `TokenizerKind` or a name for `kinds.kind_by_name` ("roberta", "bpe").

        The special tokens come first, in the order of `kind.special_tokens`: `[PAD] [UNK] [CLS] [SEP] [MASK]` for
        BERT (ids 0-4), `<s> <pad> </s> <unk> <mask>` for RoBERTa and XLM-RoBERTa, `<pad> <unk> [CLS] [SEP] [MASK]`
        for ALBERT.
        """
        kind = kind_by_name(kind) if isinstance(kind, str) else kind
        normalization = _training_normalization(kind, lowercase, strip_accents)
        show = sys.stdout.isatty() if show_progress is None else show_progress
        backend = _train_backend(files_or_iterator, kind, normalization, vocab_size=vocab_size,
                                 min_frequency=min_frequency, limit_alphabet=limit_alphabet, show_progress=show)
        return cls(backend, normalization=normalization,
                   clean_up_tokenization_spaces=kind.clean_up_tokenization_spaces, kind=kind)

    def save_pretrained(self, path: str | os.PathLike[str]) -> None:
        """Write tokenizer.json, the kind's vocabulary files (vocab.txt, or vocab.json and merges.txt),
        tokenizer_config.json and special_tokens_map.json into `path`.

        `transformers.AutoTokenizer.from_pretrained(path)` and `Tokenizer.from_pretrained(path)` both load the
        result. Every file is written to a temporary file in `path` first and then renamed over the old one.
        """
        with self._lock:
            tokenizer_json = self._backend.to_str(pretty=True)
            added = self._backend.get_added_tokens_decoder()
        config = {
            "tokenizer_class": self._kind.tokenizer_class,
            **self._kind.config(self._normalization),
            "model_max_length": self.model_max_length,
            "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
            **self._special_tokens,
            "added_tokens_decoder": {str(i): _added_token_dict(token) for i, token in sorted(added.items())},
        }
        vocab_files = vocab_file_texts(self._kind, self.get_vocab(), tokenizer_json, Path(path))
        write_pretrained(Path(path), tokenizer_json=tokenizer_json, vocab_files=vocab_files, config=config,
                         special_tokens=self._special_tokens)

    # ------------------------------------------------------------------ encoding

    def __call__(
        self,
        text: str | list[str] | list[list[str]],
        text_pair: str | list[str] | list[list[str]] | None = None,
        *,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: bool | str | None = None,
        padding: bool | str = False,
        return_tensors: str | None = None,
        return_offsets_mapping: bool = False,
        return_special_tokens_mask: bool = False,
        is_split_into_words: bool = False,
        return_word_ids: bool = False,
    ) -> dict[str, Any]:
        """Encode one text (or pair) or a batch, exactly as `transformers.BertTokenizerFast.__call__` does.

        Args:
            text: a string, or a list of strings (a batch); with `is_split_into_words`, a list of words, or a
                list of such lists (a batch).
            text_pair: the second segment(s), shaped like `text`.
            add_special_tokens: add [CLS] and [SEP].
            max_length: the length to truncate to / pad to; None means `model_max_length` where one is needed.
            truncation: True or "longest_first", "only_first", "only_second"; False/"do_not_truncate" for none.
                None (the default) truncates ("longest_first") when `max_length` is given and `padding` is not,
                as `transformers` does.
            padding: True or "longest" (to the longest in the batch), "max_length", False/"do_not_pad".
            return_tensors: None (lists), "pt" (torch int64 tensors) or "np" (int64 arrays); tensors always have
                a batch dimension, and need equal lengths (so padding).
            return_offsets_mapping: add "offset_mapping", (start, end) character spans in the input.
            return_special_tokens_mask: add "special_tokens_mask", 1 for tokens the template added.
            is_split_into_words: the input is already split into words.
            return_word_ids: add "word_ids", the index of each token's word (None for special tokens); always
                Python lists, even with `return_tensors`.

        Returns:
            A dict with "input_ids", "token_type_ids", "attention_mask" and the extras asked for; each value is
            a list for a single input, a list of lists for a batch.
        """
        strategies = encoding.resolve_strategies(truncation, padding, max_length, self.model_max_length)
        batched, inputs = encoding.batch_inputs(text, text_pair, is_split_into_words)
        encodings = self._encode(inputs, strategies, add_special_tokens, is_split_into_words)
        return encoding.outputs(
            encodings,
            batched=batched,
            return_tensors=return_tensors,
            return_offsets_mapping=return_offsets_mapping,
            return_special_tokens_mask=return_special_tokens_mask,
            return_word_ids=return_word_ids,
        )

    def _encode(self, inputs: list[Any], strategies: encoding.Strategies, add_special_tokens: bool,
                is_pretokenized: bool) -> list[tokenizers.Encoding]:
        """The backend's encodings of `inputs`, its truncation and padding set to `strategies` for this call only."""

        def encode(value: list[Any]) -> list[tokenizers.Encoding]:
            return self._backend.encode_batch(value, add_special_tokens=add_special_tokens,
                                              is_pretokenized=is_pretokenized)

        with self._lock:
            encoding.configure(self._backend, strategies, self.pad_token_id, self.pad_token)
            try:
                return retry_without_surrogates(encode, inputs)  # (lone surrogates: encoded as U+FFFD)
            except Exception as error:  # the backend raises plain Exceptions, e.g. "Truncation error: ..."
                raise BertforgeError(f"cannot encode the input: {error}") from error
            finally:
                encoding.configure(self._backend, encoding.NO_TRUNCATION_OR_PADDING, self.pad_token_id, self.pad_token)

    def encode_ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens, truncation or padding (the fast path for pretraining).

        Lone surrogates (which UTF-8 cannot hold) are encoded as U+FFFD.
        """
        with self._lock:
            texts = self._shorten_long_runs(texts)
            encodings = retry_without_surrogates(
                lambda value: self._backend.encode_batch(value, add_special_tokens=False), texts
            )
            return [item.ids for item in encodings]

    def _shorten_long_runs(self, texts: list[str]) -> list[str]:
        """`texts` with overlong runs of ASCII letters and digits cut where that cannot change the ids (see
        `encoding.shorten_long_runs`)."""
        return encoding.shorten_long_runs(self._backend, texts)

    def tokenize(self, text: str) -> list[str]:
        """The tokens of `text`, without special tokens."""
        with self._lock:
            return retry_without_surrogates(
                lambda value: self._backend.encode(value, add_special_tokens=False).tokens, text
            )

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str | list[str]:
        """Turn token ids back into text, as `transformers` does.

        `ids` is an int, a sequence of ints (a list, a 1-D tensor or array), or a batch of such sequences, which
        gives a list of strings.
        """
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        if ids and isinstance(ids[0], (list, tuple)):
            return [self.decode(sequence, skip_special_tokens) for sequence in ids]  # type: ignore[misc]  # each a str
        text = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return encoding.clean_up_tokenization(text) if self.clean_up_tokenization_spaces else text

    @property
    def model_max_length(self) -> int:
        """The longest input the model takes; the default `max_length` for truncation and max_length padding."""
        return self._model_max_length

    @model_max_length.setter
    def model_max_length(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= LARGEST_SANE_MAX_LENGTH:
            raise BertforgeError(f"model_max_length must be an integer in 1..{LARGEST_SANE_MAX_LENGTH}, not {value!r}")
        self._model_max_length = value

    @property
    def do_lower_case(self) -> bool:
        """Whether the text is lowercased before the model splits it."""
        return self._normalization.do_lower_case

    @property
    def normalization(self) -> Normalization:
        """The normalizer settings (lowercasing, accent stripping, Chinese characters)."""
        return self._normalization

    # ------------------------------------------------------------------ internals

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]  # locks cannot be pickled (DataLoader workers pickle the tokenizer)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"Tokenizer(kind={self._kind.name}, vocab_size={self.vocab_size}, "
                f"do_lower_case={self.do_lower_case}, model_max_length={self.model_max_length})")


def _added_token_dict(token: AddedToken) -> dict[str, Any]:
    """An added token as `transformers` writes it in tokenizer_config.json's "added_tokens_decoder"."""
    return {"content": token.content, "lstrip": token.lstrip, "normalized": token.normalized,
            "rstrip": token.rstrip, "single_word": token.single_word, "special": token.special}


def _training_normalization(kind: TokenizerKind, lowercase: bool | None, strip_accents: bool | None) -> Normalization:
    """The normalizer settings of a tokenizer to train (`Tokenizer.train`'s arguments)."""
    default = kind.default_normalization
    if not kind.case_options:
        if lowercase or strip_accents:
            raise BertforgeError(f"{kind.a_tokenizer} ({kind.model_name}) keeps case and accents: "
                                 f"lowercasing and accent stripping do not apply to it")
        return default
    return default._replace(do_lower_case=default.do_lower_case if lowercase is None else lowercase,
                            strip_accents=strip_accents)


def _train_backend(
    files_or_iterator: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Iterable[str],
    kind: TokenizerKind,
    normalization: Normalization,
    *,
    vocab_size: int,
    min_frequency: int,
    limit_alphabet: int,
    show_progress: bool,
) -> tokenizers.Tokenizer:
    """A backend with `kind`'s pipeline and a vocabulary trained on the text (`Tokenizer.train`'s arguments); its
    special tokens come first. BertforgeError when `vocab_size` leaves no room beside them (and the bytes of a
    byte-level kind), or when the input holds no text."""
    specials = list(dict.fromkeys(kind.special_tokens.values()))
    if vocab_size <= len(specials) + kind.alphabet_size:
        beside = f"the {len(specials)} special tokens" + (f" and the {kind.alphabet_size} bytes"
                                                          if kind.alphabet_size else "")
        raise BertforgeError(f"vocab_size={vocab_size} leaves no room beside {beside}")
    texts, described = training_texts(files_or_iterator)
    unk_token = kind.special_tokens["unk_token"]
    backend = kind.pipeline(kind.new_model(None, unk_token), normalization)
    trainer = kind.trainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=show_progress,
                           special_tokens=special_added_tokens(backend, kind.special_tokens, kind),
                           limit_alphabet=limit_alphabet, unk_token=unk_token)
    backend.train_from_iterator(texts, trainer)
    if backend.get_vocab_size() <= len(specials) + (0 if kind.finish else kind.alphabet_size):
        raise BertforgeError(f"{described}: no text to train on (the input is empty or only whitespace)")
    return kind.finish(backend) if kind.finish is not None else backend
