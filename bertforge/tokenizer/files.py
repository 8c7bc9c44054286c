"""The files of a tokenizer: a Hugging Face tokenizer directory read and written, and training text read.

A directory holds `tokenizer.json` (the whole `tokenizers` pipeline) or a plain vocabulary (`vocab.txt`), with
optional `tokenizer_config.json` and `special_tokens_map.json`, the latter taking precedence as in `transformers`.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import tokenizers

from bertforge.errors import BertforgeError
from bertforge.io import atomic_write_files
from bertforge.tokenizer.kinds import Normalization, TokenizerKind

#: `model_max_length` used when `tokenizer_config.json` gives none or a placeholder such as 1e30.
DEFAULT_MODEL_MAX_LENGTH = 512
LARGEST_SANE_MAX_LENGTH = 1_000_000


class TokenizerFiles(NamedTuple):
    """What a tokenizer directory holds: the backend and the settings `Tokenizer.__init__` takes."""

    backend: tokenizers.Tokenizer
    special_tokens: dict[str, str]
    normalization: Normalization
    model_max_length: int
    clean_up_tokenization_spaces: bool
    source: Path  # the file the backend came from
    from_json: bool  # whether that is tokenizer.json (whose vocabulary ids are then to be checked)


def read_pretrained(directory: Path, kind: TokenizerKind) -> TokenizerFiles:
    """Read the tokenizer in `directory` (see the module docstring)."""
    if not directory.is_dir():
        raise BertforgeError(f"{directory}: tokenizer directory does not exist")
    config = _read_json_object(directory / "tokenizer_config.json")
    special_tokens = _special_tokens_from(config, directory / "tokenizer_config.json", kind)
    special_tokens_map = directory / "special_tokens_map.json"
    special_tokens.update(_special_tokens_from(_read_json_object(special_tokens_map), special_tokens_map, kind))
    normalization = Normalization(
        do_lower_case=bool(config.get("do_lower_case", True)),
        strip_accents=config.get("strip_accents"),
        tokenize_chinese_chars=bool(config.get("tokenize_chinese_chars", True)),
    )
    tokenizer_json = directory / "tokenizer.json"
    vocab_file = directory / kind.vocab_file if kind.vocab_file else None
    if tokenizer_json.is_file():
        backend, normalization = _load_tokenizer_json(tokenizer_json, normalization)
        source = tokenizer_json
    elif vocab_file is not None and vocab_file.is_file():
        unk_token = special_tokens.get("unk_token", kind.special_tokens["unk_token"])
        backend = kind.pipeline(kind.new_model(_read_vocab_txt(vocab_file), unk_token), normalization)
        source = vocab_file
    else:
        raise BertforgeError(f"{directory}: holds neither tokenizer.json nor {kind.vocab_file}")
    return TokenizerFiles(
        backend=backend,
        special_tokens=special_tokens,
        normalization=normalization,
        model_max_length=_sane_max_length(config.get("model_max_length")),
        clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
        source=source,
        from_json=source == tokenizer_json,
    )


def write_pretrained(directory: Path, *, tokenizer_json: str, vocab: dict[str, int], config: dict[str, Any],
                     special_tokens: dict[str, str], vocab_file: str | None = "vocab.txt") -> None:
    """Write tokenizer.json, the vocabulary file, tokenizer_config.json and special_tokens_map.json into
    `directory`; every file is written to a temporary file in `directory` first and then renamed over the old one.
    """
    directory.mkdir(parents=True, exist_ok=True)
    id_to_token = sorted((i, t) for t, i in vocab.items())
    for expected, (index, token) in enumerate(id_to_token if vocab_file is not None else ()):
        if index != expected:
            raise BertforgeError(f"{directory}: cannot write {vocab_file}, no token has id {expected}")
        if "\n" in token or "\r" in token:
            raise BertforgeError(f"{directory}: cannot write {vocab_file}, token {token!r} (id {index}) has a newline")
    contents = {"tokenizer.json": tokenizer_json}
    if vocab_file is not None:
        contents[vocab_file] = "".join(token + "\n" for _, token in id_to_token)
    contents["tokenizer_config.json"] = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
    contents["special_tokens_map.json"] = json.dumps(special_tokens, indent=2, ensure_ascii=False) + "\n"

    def writer(text: str):
        return lambda tmp: tmp.write_text(text, encoding="utf-8", newline="\n")

    atomic_write_files(directory, {name: writer(text) for name, text in contents.items()})


def check_vocabulary_ids(vocab: dict[str, Any], path: Path) -> None:
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


# ---------------------------------------------------------------------- training text


def training_texts(paths: Sequence[str | os.PathLike[str]]) -> Iterator[str]:
    """Every line of every file in `paths` (names ending in .gz are gunzipped), after checking that there is at
    least one path and that each is a file."""
    return _lines_of(_check_training_files(paths))


def _check_training_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    if not paths:
        raise BertforgeError("no training files given")
    for path in paths:
        if not isinstance(path, (str, os.PathLike)):
            raise BertforgeError(f"training files must be paths, got {type(path).__name__}: {path!r}")
        if not Path(path).is_file():
            raise BertforgeError(f"{path}: training file does not exist")
    return [Path(path) for path in paths]


def _lines_of(paths: list[Path]) -> Iterator[str]:
    for path in paths:
        try:
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt", encoding="utf-8") as file:
                yield from file
        except (OSError, UnicodeDecodeError, EOFError) as error:
            raise BertforgeError(f"{path}: cannot read the training text ({error})") from error


# ---------------------------------------------------------------------- reading


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


def _special_tokens_from(config: dict[str, Any], path: Path, kind: TokenizerKind) -> dict[str, str]:
    """The special tokens a config names; a token is a string or an AddedToken dict with "content"."""
    tokens = {}
    for role in kind.special_tokens:
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
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= LARGEST_SANE_MAX_LENGTH:
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
