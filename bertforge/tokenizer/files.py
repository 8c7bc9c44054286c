"""The files of a tokenizer: a Hugging Face tokenizer directory read and written, and training text read.

A directory holds `tokenizer.json` (the whole `tokenizers` pipeline) or a plain vocabulary (`vocab.txt` for
WordPiece, `vocab.json` + `merges.txt` for BPE), with optional `tokenizer_config.json` and
`special_tokens_map.json`, the latter taking precedence as in `transformers`.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, cast

import tokenizers

from bertforge.core.errors import BertforgeError
from bertforge.core.io import atomic_write_files, finish_pending_writes
from bertforge.tokenizer.kinds import BERT, KINDS, Normalization, TokenizerKind, kind_for_class, kind_for_model

#: `model_max_length` used when `tokenizer_config.json` gives none or a placeholder such as 1e30.
DEFAULT_MODEL_MAX_LENGTH = 512
LARGEST_SANE_MAX_LENGTH = 1_000_000


class TokenizerFiles(NamedTuple):
    """What a tokenizer directory holds: the backend and the settings `Tokenizer.__init__` takes."""

    backend: tokenizers.Tokenizer
    kind: TokenizerKind
    special_tokens: dict[str, str]
    normalization: Normalization
    model_max_length: int
    clean_up_tokenization_spaces: bool
    source: Path  # the file the backend came from
    from_json: bool  # whether that is tokenizer.json (whose vocabulary ids are then to be checked)


def read_pretrained(directory: Path, kind: TokenizerKind | None = None) -> TokenizerFiles:
    """Read the tokenizer in `directory` (see the module docstring).

    Without `kind`, the kind is `tokenizer_config.json`'s "tokenizer_class" when that names one, else the one
    whose model `tokenizer.json` uses, else the one whose vocabulary files the directory holds.
    """
    if not directory.is_dir():
        raise BertforgeError(f"{directory}: tokenizer directory does not exist")
    finish_pending_writes(directory)  # a save killed between its renames: its files, not a mix of two saves
    config = _read_json_object(directory / "tokenizer_config.json")
    tokenizer_json = directory / "tokenizer.json"
    backend, bert_normalizer = _load_tokenizer_json(tokenizer_json) if tokenizer_json.is_file() else (None, None)
    kind = kind or kind_for_class(config.get("tokenizer_class"))
    if kind is None and backend is not None:
        kind = kind_for_model(backend, str(tokenizer_json))
    guessed = kind is None
    kind = kind or next((k for k in KINDS.values() if k.vocab_files and _holds(directory, k.vocab_files)), BERT)
    special_tokens = _special_tokens_from(config, directory / "tokenizer_config.json", kind)
    special_tokens_map = directory / "special_tokens_map.json"
    special_tokens.update(_special_tokens_from(_read_json_object(special_tokens_map), special_tokens_map, kind))
    normalization = bert_normalizer or _config_normalization(config, kind)
    if backend is not None:
        source = tokenizer_json
    elif kind.vocab_files and _holds(directory, kind.vocab_files):
        source = directory / kind.vocab_files[0]
        unk_token = special_tokens.get("unk_token", kind.special_tokens["unk_token"])
        backend = kind.pipeline(_read_vocab_files(directory, kind, unk_token), normalization)
    else:
        raise BertforgeError(f"{directory}: {_missing_files(kind, guessed)}")
    return TokenizerFiles(
        backend=backend,
        kind=kind,
        special_tokens=special_tokens,
        normalization=normalization,
        model_max_length=_sane_max_length(config.get("model_max_length")),
        clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
        source=source,
        from_json=source == tokenizer_json,
    )


def write_pretrained(directory: Path, *, tokenizer_json: str, vocab_files: dict[str, str], config: dict[str, Any],
                     special_tokens: dict[str, str]) -> None:
    """Write tokenizer.json, the vocabulary files (name -> text, from `vocab_file_texts`), tokenizer_config.json
    and special_tokens_map.json into `directory`; every file is written to a temporary file in `directory` first
    and then renamed over the old one.
    """
    directory.mkdir(parents=True, exist_ok=True)
    contents = {"tokenizer.json": tokenizer_json, **vocab_files}
    contents["tokenizer_config.json"] = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
    contents["special_tokens_map.json"] = json.dumps(special_tokens, indent=2, ensure_ascii=False) + "\n"

    def writer(text: str):
        return lambda tmp: tmp.write_text(text, encoding="utf-8", newline="\n")

    atomic_write_files(directory, {name: writer(text) for name, text in contents.items()})


def vocab_file_texts(kind: TokenizerKind, vocab: dict[str, int], tokenizer_json: str,
                     directory: Path) -> dict[str, str]:
    """The plain vocabulary files of `kind` (name -> text): vocab.txt for WordPiece, vocab.json and merges.txt
    for BPE, none for Unigram (whose SentencePiece model file bertforge does not write)."""
    if not kind.vocab_files:
        return {}
    id_to_token = sorted((i, t) for t, i in vocab.items())
    name = kind.vocab_files[0]
    for expected, (index, token) in enumerate(id_to_token):
        if index != expected:
            raise BertforgeError(f"{directory}: cannot write {name}, no token has id {expected}")
        if name == "vocab.txt" and ("\n" in token or "\r" in token):
            raise BertforgeError(f"{directory}: cannot write {name}, token {token!r} (id {index}) has a newline")
    if name == "vocab.txt":
        return {name: "".join(token + "\n" for _, token in id_to_token)}
    merges = []
    for merge in json.loads(tokenizer_json)["model"].get("merges", []):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        if any(c in left + right for c in " \n\r"):
            raise BertforgeError(f"{directory}: cannot write merges.txt, the merge {left!r} + {right!r} has a space "
                                 f"or newline")
        merges.append(f"{left} {right}\n")
    return {
        "vocab.json": json.dumps(dict((t, i) for i, t in id_to_token), indent=2, ensure_ascii=False) + "\n",
        "merges.txt": "#version: 0.2\n" + "".join(merges),
    }


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


def training_texts(source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Iterable[str]
                   ) -> tuple[Iterator[str], str]:
    """(the texts, how to name them in errors) of `Tokenizer.train`'s input: a path or a list/tuple of paths (every
    line of every file, names ending in .gz gunzipped, after checking that there is at least one path and that
    each is a file), or any other iterable of strings."""
    if isinstance(source, (str, os.PathLike)):
        source = [source]
    if isinstance(source, (list, tuple)):
        return _lines_of(_check_training_files(source)), "training files " + ", ".join(str(p) for p in source)
    return iter(cast("Iterable[str]", source)), "training text iterator"


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


def _load_tokenizer_json(path: Path) -> tuple[tokenizers.Tokenizer, Normalization | None]:
    """The backend serialized in `path`, and its normalizer settings when it uses BertNormalizer."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise BertforgeError(f"{path}: cannot read the file ({error})") from error
    data = _parse_json(text, path)
    try:
        backend = tokenizers.Tokenizer.from_str(text)
    except Exception as error:  # the Rust side raises plain Exceptions
        raise BertforgeError(f"{path}: not a valid tokenizers file ({error})") from error
    normalizer = data.get("normalizer") if isinstance(data, dict) else None
    if isinstance(normalizer, dict) and normalizer.get("type") == "BertNormalizer":
        return backend, Normalization(
            do_lower_case=bool(normalizer.get("lowercase", True)),
            strip_accents=normalizer.get("strip_accents"),
            tokenize_chinese_chars=bool(normalizer.get("handle_chinese_chars", True)),
        )
    return backend, None


def _parse_json(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise BertforgeError(f"{path}: invalid JSON ({error})") from error
    except RecursionError as error:
        raise BertforgeError(f"{path}: invalid JSON (nested too deeply)") from error


def _config_normalization(config: dict[str, Any], kind: TokenizerKind) -> Normalization:
    """The normalizer settings `tokenizer_config.json` gives (BERT's "strip_accents" or ALBERT's "keep_accents"),
    the kind's defaults for those it does not; always the defaults for a kind without such settings."""
    default = kind.default_normalization
    if not kind.case_options:
        return default
    strip_accents = config.get("strip_accents", default.strip_accents)
    if "keep_accents" in config:
        strip_accents = not config["keep_accents"]
    return Normalization(
        do_lower_case=bool(config.get("do_lower_case", default.do_lower_case)),
        strip_accents=None if strip_accents is None else bool(strip_accents),
        tokenize_chinese_chars=bool(config.get("tokenize_chinese_chars", default.tokenize_chinese_chars)),
    )


def tokenizer_files_in(directory: Path) -> list[str]:
    """The names of the tokenizer files `directory` holds (any of `read_pretrained`'s), in a fixed order."""
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             *dict.fromkeys(n for k in KINDS.values() for n in k.vocab_files))
    return [n for n in names if (directory / n).is_file()]


def _holds(directory: Path, names: tuple[str, ...]) -> bool:
    return all((directory / name).is_file() for name in names)


def _missing_files(kind: TokenizerKind, guessed: bool) -> str:
    if guessed:
        files = dict.fromkeys(" + ".join(k.vocab_files) for k in KINDS.values() if k.vocab_files)
        return f"holds neither tokenizer.json nor {' nor '.join(files)}"
    if kind.vocab_files:
        return f"holds neither tokenizer.json nor {' + '.join(kind.vocab_files)}"
    return f"holds no tokenizer.json ({kind.a_tokenizer} is read from tokenizer.json)"


def _read_vocab_files(directory: Path, kind: TokenizerKind, unk_token: str) -> Any:
    """The model of `kind` built from its plain vocabulary files in `directory`."""
    if kind.vocab_files == ("vocab.txt",):
        return kind.new_model(_read_vocab_txt(directory / "vocab.txt"), unk_token)
    vocab_path, merges_path = (directory / name for name in kind.vocab_files)
    try:
        vocab = _parse_json(vocab_path.read_text(encoding="utf-8"), vocab_path)
        lines = merges_path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise BertforgeError(f"{directory}: cannot read the vocabulary ({error})") from error
    if not isinstance(vocab, dict) or not vocab:
        raise BertforgeError(f"{vocab_path}: expected a non-empty JSON object of token -> id")
    check_vocabulary_ids(vocab, vocab_path)
    merges = []
    for number, line in enumerate(lines, 1):
        if number == 1 and line.startswith("#version") or not line.strip():
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise BertforgeError(f"{merges_path}: line {number} is not two tokens separated by a space: {line!r}")
        merges.append((parts[0], parts[1]))
    try:
        return kind.new_model(vocab, unk_token, merges)
    except Exception as error:  # the Rust side raises plain Exceptions (a merge of tokens not in the vocabulary)
        raise BertforgeError(f"{merges_path}: the merges do not fit {vocab_path.name} ({error})") from error


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
