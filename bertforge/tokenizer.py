"""BERT WordPiece tokenizer: a thin, HF-compatible layer over the `tokenizers` library.

All the actual tokenization (normalization, pre-tokenization, WordPiece, special-token templates, truncation,
padding, offsets) is done by a `tokenizers.Tokenizer` (the Rust backend, exposed as `Tokenizer.backend`). This
module only

* builds that backend from the files a BERT checkpoint ships (`tokenizer.json`, or `vocab.txt` plus
  `tokenizer_config.json`), or trains a new WordPiece vocabulary,
* saves it in the layout `transformers.AutoTokenizer.from_pretrained` reads, and
* offers a `__call__` whose output is identical to `transformers.BertTokenizerFast` for the same arguments.

The backend's truncation and padding settings are changed for each call, so every call that encodes holds a lock;
one `Tokenizer` can be shared between threads.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import re
import string
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import tokenizers
from tokenizers import AddedToken, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from tokenizers.trainers import WordPieceTrainer

from bertforge.errors import BertforgeError
from bertforge.io import atomic_write_files

#: The special tokens every BERT vocabulary must hold, by role, with their usual spelling.
DEFAULT_SPECIAL_TOKENS: dict[str, str] = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}

#: `model_max_length` used when `tokenizer_config.json` gives none or a placeholder such as 1e30.
DEFAULT_MODEL_MAX_LENGTH = 512
_LARGEST_SANE_MAX_LENGTH = 1_000_000

_WORDPIECE_PREFIX = "##"
_MAX_INPUT_CHARS_PER_WORD = 100

_PADDING_STRATEGIES = ("longest", "max_length", "do_not_pad")
_TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second", "do_not_truncate")

# What `transformers` does to decoded text when `clean_up_tokenization_spaces` is set.
_CLEAN_UP_REPLACEMENTS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


class Normalization(NamedTuple):
    """The BertNormalizer settings, named as in `tokenizer_config.json`."""

    do_lower_case: bool = True
    strip_accents: bool | None = None  # None: strip accents exactly when lowercasing (original BERT)
    tokenize_chinese_chars: bool = True


class Tokenizer:
    """A BERT WordPiece tokenizer whose encodings match `transformers.BertTokenizerFast`.

    Build one with `Tokenizer.from_pretrained(dir)` or `Tokenizer.train(...)`; the constructor wraps an existing
    `tokenizers.Tokenizer` whose model is WordPiece.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        special_tokens: dict[str, str] | None = None,
        normalization: Normalization = Normalization(),
        model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces: bool = False,
        source: str = "tokenizer",
    ) -> None:
        """Wrap `backend`.

        Args:
            backend: a `tokenizers.Tokenizer` with a WordPiece model. It is used as is, except that its truncation
                and padding are switched off and the special tokens are registered as special added tokens (so
                that "[CLS]" in the text is one token, and `decode(skip_special_tokens=True)` drops it), as
                `transformers` does.
            special_tokens: role ("pad_token", "unk_token", ...) -> token; missing roles use DEFAULT_SPECIAL_TOKENS.
            normalization: the settings written to `tokenizer_config.json` (they must describe the backend's
                normalizer, which `transformers` rebuilds from them).
            model_max_length: the default `max_length` for truncation and `padding="max_length"`.
            clean_up_tokenization_spaces: whether `decode` glues punctuation back on ("a ." -> "a.").
            source: what to name in error messages (usually the file the backend came from).
        """
        if not isinstance(backend.model, WordPiece):
            raise BertforgeError(f"{source}: model is {type(backend.model).__name__}, a BERT tokenizer needs WordPiece")
        self._special_tokens = {**DEFAULT_SPECIAL_TOKENS, **(special_tokens or {})}
        for token in self._special_tokens.values():
            if backend.token_to_id(token) is None:
                raise BertforgeError(f"{source}: vocabulary lacks the required special token {token}")
        backend.add_special_tokens(
            [AddedToken(token, special=True, normalized=False) for token in self._special_tokens.values()]
        )
        if backend.post_processor is None:
            backend.post_processor = _bert_template(backend, self._special_tokens)
        if backend.decoder is None:
            backend.decoder = decoders.WordPiece(prefix=_WORDPIECE_PREFIX)
        backend.no_truncation()
        backend.no_padding()
        self._backend = backend
        self._normalization = normalization
        self.model_max_length = model_max_length
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ loading, training, saving

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load the tokenizer in directory `path`.

        Reads `tokenizer.json` when present, else builds the BERT pipeline from `vocab.txt`; settings
        (lowercasing, accents, special tokens, `model_max_length`) come from the optional `tokenizer_config.json`
        and `special_tokens_map.json`, the latter taking precedence as in `transformers`.
        """
        directory = Path(path)
        if not directory.is_dir():
            raise BertforgeError(f"{directory}: tokenizer directory does not exist")
        config = _read_json_object(directory / "tokenizer_config.json")
        special_tokens = _special_tokens_from(config, directory / "tokenizer_config.json")
        special_tokens_map = directory / "special_tokens_map.json"
        special_tokens.update(_special_tokens_from(_read_json_object(special_tokens_map), special_tokens_map))
        normalization = Normalization(
            do_lower_case=bool(config.get("do_lower_case", True)),
            strip_accents=config.get("strip_accents"),
            tokenize_chinese_chars=bool(config.get("tokenize_chinese_chars", True)),
        )
        tokenizer_json, vocab_txt = directory / "tokenizer.json", directory / "vocab.txt"
        if tokenizer_json.is_file():
            backend, normalization = _load_tokenizer_json(tokenizer_json, normalization)
            source = str(tokenizer_json)
        elif vocab_txt.is_file():
            unk_token = special_tokens.get("unk_token", DEFAULT_SPECIAL_TOKENS["unk_token"])
            backend = _bert_backend(WordPiece(_read_vocab_txt(vocab_txt), unk_token=unk_token,
                                              continuing_subword_prefix=_WORDPIECE_PREFIX,
                                              max_input_chars_per_word=_MAX_INPUT_CHARS_PER_WORD), normalization)
            source = str(vocab_txt)
        else:
            raise BertforgeError(f"{directory}: holds neither tokenizer.json nor vocab.txt")
        tokenizer = cls(
            backend,
            special_tokens=special_tokens,
            normalization=normalization,
            model_max_length=_sane_max_length(config.get("model_max_length")),
            clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
            source=source,
        )
        if source == str(tokenizer_json):  # (vocab.txt gives ids 0..N-1 by construction)
            _check_vocabulary_ids(backend.get_vocab(with_added_tokens=False), tokenizer_json)
        return tokenizer

    @classmethod
    def train(
        cls,
        files_or_iterator: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Iterable[str],
        vocab_size: int = 30522,
        lowercase: bool = True,
        min_frequency: int = 2,
        strip_accents: bool | None = None,
        limit_alphabet: int = 1000,
        show_progress: bool = True,
    ) -> Tokenizer:
        """Train a WordPiece vocabulary with the BERT pipeline.

        Args:
            files_or_iterator: a text file path, a list/tuple of them (UTF-8, one or more sentences a line; names
                ending in `.gz` are gunzipped), or any other iterable of text strings (a generator, say).
            vocab_size: the size of the vocabulary, special tokens included.
            lowercase: lowercase the text (an "uncased" model).
            min_frequency: how often a pair must occur to be merged.
            strip_accents: remove accents; None does so exactly when lowercasing.
            limit_alphabet: the most distinct characters to keep.
            show_progress: show the trainer's progress bar.

        The special tokens get ids 0-4: [PAD] [UNK] [CLS] [SEP] [MASK].
        """
        if vocab_size <= len(DEFAULT_SPECIAL_TOKENS):
            raise BertforgeError(f"vocab_size={vocab_size} leaves no room beside the 5 special tokens")
        if isinstance(files_or_iterator, (str, os.PathLike)):
            files_or_iterator = [files_or_iterator]
        if isinstance(files_or_iterator, (list, tuple)):
            texts = _lines_of(_check_training_files(files_or_iterator))
            described = "training files " + ", ".join(str(p) for p in files_or_iterator)
        else:
            texts, described = iter(files_or_iterator), "training text iterator"
        normalization = Normalization(do_lower_case=lowercase, strip_accents=strip_accents)
        specials = list(DEFAULT_SPECIAL_TOKENS.values())
        backend = _bert_backend(WordPiece(unk_token=DEFAULT_SPECIAL_TOKENS["unk_token"],
                                          continuing_subword_prefix=_WORDPIECE_PREFIX,
                                          max_input_chars_per_word=_MAX_INPUT_CHARS_PER_WORD), normalization)
        trainer = WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            show_progress=show_progress,
            special_tokens=specials,
            limit_alphabet=limit_alphabet,
            continuing_subword_prefix=_WORDPIECE_PREFIX,
        )
        backend.train_from_iterator(texts, trainer)
        if backend.get_vocab_size() <= len(specials):
            raise BertforgeError(f"{described}: no text to train on (the input is empty or only whitespace)")
        return cls(backend, normalization=normalization, clean_up_tokenization_spaces=True)

    def save_pretrained(self, path: str | os.PathLike[str]) -> None:
        """Write tokenizer.json, vocab.txt, tokenizer_config.json and special_tokens_map.json into `path`.

        `transformers.AutoTokenizer.from_pretrained(path)` and `Tokenizer.from_pretrained(path)` both load the
        result. Every file is written to a temporary file in `path` first and then renamed over the old one.
        """
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        id_to_token = sorted((i, t) for t, i in self.get_vocab().items())
        for expected, (index, token) in enumerate(id_to_token):
            if index != expected:
                raise BertforgeError(f"{directory}: cannot write vocab.txt, no token has id {expected}")
            if "\n" in token or "\r" in token:
                raise BertforgeError(f"{directory}: cannot write vocab.txt, token {token!r} (id {index}) has a newline")
        with self._lock:
            tokenizer_json = self._backend.to_str(pretty=True)
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self._normalization.do_lower_case,
            "strip_accents": self._normalization.strip_accents,
            "tokenize_chinese_chars": self._normalization.tokenize_chinese_chars,
            "model_max_length": self.model_max_length,
            "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
            **self._special_tokens,
        }
        _write_files_atomically(directory, {
            "tokenizer.json": tokenizer_json,
            "vocab.txt": "".join(token + "\n" for _, token in id_to_token),
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n",
            "special_tokens_map.json": json.dumps(self._special_tokens, indent=2, ensure_ascii=False) + "\n",
        })

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
        padding_strategy = _padding_strategy(padding)
        if truncation is None:
            truncation = max_length is not None and padding is False
        truncation_strategy = _truncation_strategy(truncation)
        if max_length is None and (padding_strategy == "max_length" or truncation_strategy != "do_not_truncate"):
            max_length = self.model_max_length

        batched, inputs = _batch_inputs(text, text_pair, is_split_into_words)
        with self._lock:
            self._set_truncation_and_padding(truncation_strategy, padding_strategy, max_length)
            try:
                try:
                    encodings = self._backend.encode_batch(
                        inputs, add_special_tokens=add_special_tokens, is_pretokenized=is_split_into_words
                    )
                except TypeError:  # perhaps a lone surrogate, which the backend cannot take: retry without
                    cleaned = _without_surrogates(inputs)
                    if cleaned is inputs:
                        raise
                    encodings = self._backend.encode_batch(
                        cleaned, add_special_tokens=add_special_tokens, is_pretokenized=is_split_into_words
                    )
            except Exception as error:  # the backend raises plain Exceptions, e.g. "Truncation error: ..."
                raise BertforgeError(f"cannot encode the input: {error}") from error
            finally:
                self._set_truncation_and_padding("do_not_truncate", "do_not_pad", None)

        result: dict[str, Any] = {
            "input_ids": [e.ids for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
        }
        if return_special_tokens_mask:
            result["special_tokens_mask"] = [e.special_tokens_mask for e in encodings]
        if return_offsets_mapping:
            result["offset_mapping"] = [e.offsets for e in encodings]
        if return_tensors is not None:
            result = {key: _to_tensor(key, value, return_tensors) for key, value in result.items()}
        if return_word_ids:
            result["word_ids"] = [e.word_ids for e in encodings]
        if not batched and return_tensors is None:
            result = {key: value[0] for key, value in result.items()}
        return result

    def encode_ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens, truncation or padding (the fast path for pretraining).

        Lone surrogates (which UTF-8 cannot hold) are encoded as U+FFFD.
        """
        with self._lock:
            texts = self._shorten_long_runs(texts)
            try:
                encodings = self._backend.encode_batch(texts, add_special_tokens=False)
            except TypeError:  # perhaps a lone surrogate: retry without (only then, to keep the common path fast)
                cleaned = _without_surrogates(texts)
                if cleaned is texts:
                    raise
                encodings = self._backend.encode_batch(cleaned, add_special_tokens=False)
            return [encoding.ids for encoding in encodings]

    def _shorten_long_runs(self, texts: list[str]) -> list[str]:
        """`texts` with each run of more than M + 1 ASCII letters and digits cut to its first M + 1 (M: WordPiece's
        `max_input_chars_per_word`), when that cannot change the ids: such a run lies inside one word (only
        whitespace, punctuation and CJK characters split words; none is an ASCII letter or digit; the BERT
        normalizer maps these characters one to one) of more than M characters before and after the cut, which
        WordPiece turns into one [UNK] without looking at it. A million-character word then costs microseconds
        instead of about half a second of normalizing and pre-tokenizing, paid again every epoch.

        Only for the standard BERT pipeline, and only while every added token begins and ends with ASCII
        punctuation (so that none can match inside or across the edge of a run); otherwise `texts` as they are.
        """
        backend = self._backend
        model = backend.model
        if not isinstance(model, WordPiece):
            return texts
        keep = model.max_input_chars_per_word + 1
        if not any(len(text) > keep for text in texts):
            return texts
        if not (
            isinstance(backend.normalizer, normalizers.BertNormalizer)
            and isinstance(backend.pre_tokenizer, pre_tokenizers.BertPreTokenizer)
            and all(
                token.content and token.content[0] in _ASCII_PUNCTUATION and token.content[-1] in _ASCII_PUNCTUATION
                for token in backend.get_added_tokens_decoder().values()
            )
        ):
            return texts
        pattern = _long_run_pattern(keep)
        return [pattern.sub(lambda run: run.group()[:keep], text) if len(text) > keep else text for text in texts]

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of `text`, without special tokens."""
        with self._lock:
            try:
                return self._backend.encode(text, add_special_tokens=False).tokens
            except TypeError:  # perhaps a lone surrogate: retry without
                cleaned = _without_surrogates(text)
                if cleaned is text:
                    raise
                return self._backend.encode(cleaned, add_special_tokens=False).tokens

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
            return [self.decode(sequence, skip_special_tokens) for sequence in ids]
        text = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if self.clean_up_tokenization_spaces:
            for spaced, glued in _CLEAN_UP_REPLACEMENTS:
                text = text.replace(spaced, glued)
        return text

    # ------------------------------------------------------------------ vocabulary

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The `tokenizers.Tokenizer` doing the work."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """The number of tokens, special tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        """Token -> id for every token, special tokens included."""
        return self._backend.get_vocab(with_added_tokens=True)

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        """The id of a token (or of each token); unknown tokens give the [UNK] id."""
        if isinstance(tokens, str):
            token_id = self._backend.token_to_id(tokens)
            return self.unk_token_id if token_id is None else token_id
        return [self.convert_tokens_to_ids(token) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False) -> str | list[str]:
        """The token of an id (or of each id), optionally dropping special tokens from a list."""
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        special_ids = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._backend.id_to_token(int(i)) for i in ids if int(i) not in special_ids]

    @property
    def model_max_length(self) -> int:
        """The longest input the model takes; the default `max_length` for truncation and max_length padding."""
        return self._model_max_length

    @model_max_length.setter
    def model_max_length(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= _LARGEST_SANE_MAX_LENGTH:
            raise BertforgeError(f"model_max_length must be an integer in 1..{_LARGEST_SANE_MAX_LENGTH}, not {value!r}")
        self._model_max_length = value

    @property
    def do_lower_case(self) -> bool:
        """Whether the text is lowercased before WordPiece."""
        return self._normalization.do_lower_case

    @property
    def normalization(self) -> Normalization:
        """The normalizer settings (lowercasing, accent stripping, Chinese characters)."""
        return self._normalization

    @property
    def special_tokens(self) -> dict[str, str]:
        """Role ("pad_token", ...) -> token, as written to special_tokens_map.json."""
        return dict(self._special_tokens)

    @property
    def all_special_ids(self) -> list[int]:
        """The ids of the five special tokens."""
        return [self._backend.token_to_id(token) for token in self._special_tokens.values()]

    pad_token = property(lambda self: self._special_tokens["pad_token"], doc="The padding token.")
    unk_token = property(lambda self: self._special_tokens["unk_token"], doc="The unknown-word token.")
    cls_token = property(lambda self: self._special_tokens["cls_token"], doc="The classification (first) token.")
    sep_token = property(lambda self: self._special_tokens["sep_token"], doc="The separator token.")
    mask_token = property(lambda self: self._special_tokens["mask_token"], doc="The masked-LM mask token.")
    pad_token_id = property(lambda self: self._backend.token_to_id(self.pad_token), doc="The id of pad_token.")
    unk_token_id = property(lambda self: self._backend.token_to_id(self.unk_token), doc="The id of unk_token.")
    cls_token_id = property(lambda self: self._backend.token_to_id(self.cls_token), doc="The id of cls_token.")
    sep_token_id = property(lambda self: self._backend.token_to_id(self.sep_token), doc="The id of sep_token.")
    mask_token_id = property(lambda self: self._backend.token_to_id(self.mask_token), doc="The id of mask_token.")

    # ------------------------------------------------------------------ internals

    def _set_truncation_and_padding(self, truncation: str, padding: str, max_length: int | None) -> None:
        """Configure the backend for one call (the caller holds the lock)."""
        if truncation == "do_not_truncate":
            self._backend.no_truncation()
        else:
            self._backend.enable_truncation(max_length, stride=0, strategy=truncation, direction="right")
        if padding == "do_not_pad":
            self._backend.no_padding()
        else:
            self._backend.enable_padding(
                direction="right",
                pad_id=self.pad_token_id,
                pad_type_id=0,
                pad_token=self.pad_token,
                length=max_length if padding == "max_length" else None,
            )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]  # locks cannot be pickled (DataLoader workers pickle the tokenizer)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, do_lower_case={self.do_lower_case}, "
                f"model_max_length={self.model_max_length})")


# ---------------------------------------------------------------------- pipeline pieces


_ASCII_PUNCTUATION = frozenset(string.punctuation)


@functools.lru_cache(maxsize=8)
def _long_run_pattern(keep: int) -> re.Pattern[str]:
    """Runs of more than `keep` ASCII letters and digits."""
    return re.compile(f"[A-Za-z0-9]{{{keep + 1},}}")


def _bert_backend(model: WordPiece, normalization: Normalization) -> tokenizers.Tokenizer:
    """A backend with the BERT normalizer, pre-tokenizer and decoder around `model`.

    It has no post-processor yet: `Tokenizer.__init__` adds the [CLS]/[SEP] template once it has checked that the
    vocabulary holds the special tokens.
    """
    backend = tokenizers.Tokenizer(model)
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=normalization.tokenize_chinese_chars,
        strip_accents=normalization.strip_accents,
        lowercase=normalization.do_lower_case,
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix=_WORDPIECE_PREFIX)
    return backend


def _bert_template(backend: tokenizers.Tokenizer, special_tokens: dict[str, str]) -> processors.TemplateProcessing:
    """`[CLS] $A [SEP]` for one segment, `[CLS] $A [SEP] $B:1 [SEP]:1` for a pair."""
    cls, sep = special_tokens["cls_token"], special_tokens["sep_token"]
    return processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, backend.token_to_id(cls)), (sep, backend.token_to_id(sep))],
    )


_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_surrogates(value: Any) -> Any:
    """`value` (a string, or lists/tuples of them, nested) with every surrogate code point replaced by U+FFFD.

    Returns `value` itself when nothing had to change. Python strings can hold lone surrogates (json.loads makes
    one from "\\ud800", surrogateescape decoding from an undecodable byte); UTF-8, and so the backend, cannot.
    """
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    if isinstance(value, (list, tuple)):
        cleaned = [_without_surrogates(item) for item in value]
        if all(new is old for new, old in zip(cleaned, value)):
            return value
        return cleaned if isinstance(value, list) else tuple(cleaned)
    return value


# ---------------------------------------------------------------------- reading files


def _read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, or {} when there is no such file."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise BertforgeError(f"{path}: cannot read the file ({error})") from error
    except json.JSONDecodeError as error:
        raise BertforgeError(f"{path}: invalid JSON ({error})") from error
    except RecursionError as error:
        raise BertforgeError(f"{path}: invalid JSON (nested too deeply)") from error
    if not isinstance(data, dict):
        raise BertforgeError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _special_tokens_from(config: dict[str, Any], path: Path) -> dict[str, str]:
    """The special tokens a config names; a token is a string or an AddedToken dict with "content"."""
    tokens = {}
    for role in DEFAULT_SPECIAL_TOKENS:
        value = config.get(role)
        if isinstance(value, dict):
            value = value.get("content")
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise BertforgeError(f"{path}: {role} must be a non-empty string, not {value!r}")
        tokens[role] = value
    return tokens


def _sane_max_length(value: Any) -> int:
    """`value` if it is a plausible sequence length, else DEFAULT_MODEL_MAX_LENGTH (configs often hold 1e30)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _LARGEST_SANE_MAX_LENGTH:
        return value
    return DEFAULT_MODEL_MAX_LENGTH


def _load_tokenizer_json(path: Path, fallback: Normalization) -> tuple[tokenizers.Tokenizer, Normalization]:
    """The backend serialized in `path`, and its normalizer settings (from the file when it uses BertNormalizer)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise BertforgeError(f"{path}: cannot read the file ({error})") from error
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise BertforgeError(f"{path}: invalid JSON ({error})") from error
    except RecursionError as error:
        raise BertforgeError(f"{path}: invalid JSON (nested too deeply)") from error
    try:
        backend = tokenizers.Tokenizer.from_str(text)
    except Exception as error:  # the Rust side raises plain Exceptions
        raise BertforgeError(f"{path}: not a valid tokenizers file ({error})") from error
    normalizer = data.get("normalizer") if isinstance(data, dict) else None
    if isinstance(normalizer, dict) and normalizer.get("type") == "BertNormalizer":
        fallback = Normalization(
            do_lower_case=bool(normalizer.get("lowercase", True)),
            strip_accents=normalizer.get("strip_accents"),
            tokenize_chinese_chars=bool(normalizer.get("handle_chinese_chars", True)),
        )
    return backend, fallback


def _check_vocabulary_ids(vocab: dict[str, Any], path: Path) -> None:
    """Check that the token -> id map `vocab` gives the ids 0..N-1, each to exactly one token."""
    owner: dict[int, str] = {}
    for token, index in vocab.items():
        if isinstance(index, bool) or not isinstance(index, int):
            raise BertforgeError(f"{path}: vocabulary id of token {token!r} is not an integer: {index!r}")
        if not 0 <= index < len(vocab):
            raise BertforgeError(f"{path}: vocabulary id {index} of token {token!r} is outside 0..{len(vocab) - 1} "
                                 f"(the ids of {len(vocab)} tokens must be exactly 0..{len(vocab) - 1})")
        if index in owner:
            raise BertforgeError(f"{path}: vocabulary gives id {index} to two tokens, {owner[index]!r} and {token!r}")
        owner[index] = token
    # N tokens, N distinct ids, all in 0..N-1: so every id in 0..N-1 is used exactly once.


def _read_vocab_txt(path: Path) -> dict[str, int]:
    """Token -> id (the line number from 0), read line by line as `transformers` does."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.readlines()
    except (OSError, UnicodeDecodeError) as error:
        raise BertforgeError(f"{path}: cannot read the vocabulary ({error})") from error
    vocab: dict[str, int] = {}
    for index, line in enumerate(lines):
        token = line.rstrip("\n")
        if token in vocab:
            raise BertforgeError(f"{path}: duplicate token {token!r} on lines {vocab[token] + 1} and {index + 1}")
        vocab[token] = index
    if not vocab:
        raise BertforgeError(f"{path}: the vocabulary is empty")
    return vocab


def _check_training_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """`paths` as Paths, after checking that there is at least one and that each is a file."""
    if not paths:
        raise BertforgeError("no training files given")
    for path in paths:
        if not isinstance(path, (str, os.PathLike)):
            raise BertforgeError(f"training files must be paths, got {type(path).__name__}: {path!r}")
        if not Path(path).is_file():
            raise BertforgeError(f"{path}: training file does not exist")
    return [Path(path) for path in paths]


def _lines_of(paths: list[Path]) -> Iterator[str]:
    """Every line of every file, gunzipping names that end in .gz."""
    for path in paths:
        try:
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt", encoding="utf-8") as file:
                yield from file
        except (OSError, UnicodeDecodeError, EOFError) as error:
            raise BertforgeError(f"{path}: cannot read the training text ({error})") from error


def _write_files_atomically(directory: Path, contents: dict[str, str]) -> None:
    """Write each name -> text into `directory`; every file is complete before any replaces its old version."""

    def writer(text: str):
        return lambda tmp: tmp.write_text(text, encoding="utf-8", newline="\n")

    atomic_write_files(directory, {name: writer(text) for name, text in contents.items()})


# ---------------------------------------------------------------------- __call__ helpers


def _padding_strategy(padding: bool | str) -> str:
    if padding is True:
        return "longest"
    if padding is False or padding is None:
        return "do_not_pad"
    if padding not in _PADDING_STRATEGIES:
        raise BertforgeError(f"padding={padding!r}: expected True, False or one of {', '.join(_PADDING_STRATEGIES)}")
    return padding


def _truncation_strategy(truncation: bool | str) -> str:
    if truncation is True:
        return "longest_first"
    if truncation is False:
        return "do_not_truncate"
    if truncation not in _TRUNCATION_STRATEGIES:
        raise BertforgeError(
            f"truncation={truncation!r}: expected True, False or one of {', '.join(_TRUNCATION_STRATEGIES)}"
        )
    return truncation


def _batch_inputs(text: Any, text_pair: Any, is_split_into_words: bool) -> tuple[bool, list[Any]]:
    """Whether the input is a batch, and the inputs as the list `encode_batch` takes.

    Mirrors `transformers`: a single input with an empty `text_pair` ("" or []) is encoded without a pair.
    """
    if is_split_into_words:
        batched = isinstance(text, (list, tuple)) and bool(text) and isinstance(text[0], (list, tuple))
    else:
        if not isinstance(text, (str, list, tuple)):
            raise BertforgeError(f"text must be a string or a list of strings, not {type(text).__name__}")
        batched = isinstance(text, (list, tuple))
    if not batched:
        return False, [(text, text_pair) if text_pair else text]
    if text_pair is None:
        return True, list(text)
    if isinstance(text_pair, str) or len(text_pair) != len(text):
        raise BertforgeError("for a batch, text_pair must be a list as long as text")
    return True, list(zip(text, text_pair))


def _to_tensor(key: str, rows: list[list[Any]], kind: str) -> Any:
    """`rows` as an int64 torch tensor ("pt") or numpy array ("np")."""
    if kind not in ("pt", "np"):
        raise BertforgeError(f"return_tensors={kind!r}: expected None, 'pt' or 'np'")
    if len({len(row) for row in rows}) > 1:
        raise BertforgeError(f"cannot make a tensor of {key}: the sequences differ in length (use padding=True)")
    array = np.array(rows, dtype=np.int64)
    if kind == "np":
        return array
    import torch  # only needed here; keeps `import bertforge.tokenizer` light

    return torch.from_numpy(array)
