"""Token-classification (NER) data: a CoNLL file (`data.read_conll`), or rows of words and tags.

Rows are the `datasets` layout of conll2003 — a list of words ("tokens") and a list of tags ("ner_tags") a row —
from a JSONL, Parquet or Arrow file or in memory, read as `data.record_source` reads classification rows. The
columns are `--text-column` (default: "tokens", else "words") and `--label-column` (left at its default "label":
"ner_tags", else "tags", else "label"). A tag is a string (`B-PER`) or an integer id, named by the column's
`datasets` ClassLabel names where the data carries them (a `datasets.Dataset`, a Parquet/Arrow file that
`datasets` wrote); ids without names stay ids until `TokenClassification.encode` names them from the model's
`id2label` (evaluation), and training refuses them. For prediction a row may give a "text" instead of words: it is
split into words (`split_words`), so that entities carry character offsets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import BertforgeError
from ..data.tables import InMemory, in_memory, is_path, refuse_description, table_class_names
from .config import DEFAULT_LABEL_COLUMN  # --label-column left at it: the tags' column is looked for
from .data import TaggedSentence, file_format, read_conll, record_source, tag_scheme

TOKEN_COLUMNS = ("tokens", "words")  # the words, when --text-column is not given
TAG_COLUMNS = ("ner_tags", "tags", "label")  # the tags, when --label-column is left at "label"


def read_tagged(
    data: Any, text_column: str | None = None, label_column: str | None = DEFAULT_LABEL_COLUMN,
    require_labels: bool = True, split_words: Any = None,
) -> list[TaggedSentence]:
    """The sentences of a CoNLL file (any file not named .jsonl/.json/.ndjson or a table format of `data.tables`),
    or of rows; unlabelled (`require_labels` False) rows' tags are not read, and (with `split_words`) a row may give
    a "text" instead of words."""
    if is_path(data):
        refuse_description(data)
        if file_format(data) not in ("jsonl", "parquet", "arrow"):
            return read_conll(data, require_labels=require_labels)
    else:
        data = data if isinstance(data, InMemory) else in_memory(data)
    path, records = record_source(data)  # type: ignore[misc]
    names = data.class_names if isinstance(data, InMemory) else (
        table_class_names(data) if file_format(data) in ("parquet", "arrow") else {})
    sentences = []
    for line, record in records:
        words_at = text_column or next((c for c in TOKEN_COLUMNS if c in record), TOKEN_COLUMNS[0])
        if record.get(words_at) == ["-DOCSTART-"]:  # conll2003's document marks, skipped as in CoNLL files
            continue
        tags_at = label_column if label_column not in (None, DEFAULT_LABEL_COLUMN) else next(
            (c for c in TAG_COLUMNS if c in record), None)
        sentence = _sentence(path, line, record, words_at, split_words if not require_labels else None)
        if require_labels and tags_at is not None and tags_at in record:  # to predict, tags are ignored
            sentence.tags = _tags(path, line, record[tags_at], len(sentence.words), names.get(tags_at))
        elif require_labels:
            raise BertforgeError(f"{path}:{line}: no key {tags_at or TAG_COLUMNS[0]!r} (the tags; name it with "
                                 "--label-column)")
        sentences.append(sentence)
    if not sentences:
        raise BertforgeError(f"{path}: no sentences")
    if require_labels and all(isinstance(t, str) for s in sentences for t in s.tags or []):
        tag_scheme(path, sentences)
    return sentences


def _sentence(path: Path, line: int, record: dict[str, Any], words_at: str, split_words: Any) -> TaggedSentence:
    words = record.get(words_at)
    if isinstance(words, (list, tuple)) and words and all(isinstance(w, str) and w for w in words):
        return TaggedSentence(list(words), None, line, row=True)
    text = words if isinstance(words, str) else record.get("text") if words_at not in record else None
    if split_words is not None and isinstance(text, str):  # to predict: a text (a string there, or at "text")
        pieces = split_words(text)
        return TaggedSentence([w for w, _ in pieces], None, line, [span for _, span in pieces], text, row=True)
    problem = "no key" if words_at not in record else "not a non-empty list of non-empty strings at key"
    hint = " (or, to predict, a 'text' string)" if split_words is not None else ""
    raise BertforgeError(f"{path}:{line}: {problem} {words_at!r} (the words; name it with --text-column){hint}")


def _tags(path: Path, line: int, tags: Any, count: int, names: list[str] | None) -> list[Any]:
    """The tags of a row: strings, or integer ids (named by `names` when the data carries them)."""
    if not isinstance(tags, (list, tuple)) or len(tags) != count:
        got = f"{len(tags)} tags" if isinstance(tags, (list, tuple)) else f"a {type(tags).__name__}"
        raise BertforgeError(f"{path}:{line}: {got} for {count} words; expected a list of one tag a word")
    out = []
    for k, tag in enumerate(tags):
        if isinstance(tag, int) and not isinstance(tag, bool):
            if names is not None:
                if not 0 <= tag < len(names):
                    raise BertforgeError(f"{path}:{line}: tag id {tag} (word {k + 1}) is not one of the "
                                         f"{len(names)} class names")
                tag = names[tag]
        elif not isinstance(tag, str) or not tag:
            raise BertforgeError(f"{path}:{line}: tag {tag!r} (word {k + 1}) is neither a tag nor an integer id")
        out.append(tag)
    return out


def name_tag_ids(path: Path, sentences: list[TaggedSentence], id2label: dict[int, str] | None) -> None:
    """Integer tag ids (rows without class names) get the model's names, `id2label`, in place."""
    for sentence in sentences:
        if not any(isinstance(t, int) for t in sentence.tags or []):
            continue
        for k, tag in enumerate(sentence.tags or []):
            if isinstance(tag, int) and tag not in (id2label or {}):
                raise BertforgeError(f"{path}:{sentence.word_line(k)}: tag id {tag} is not in the model's id2label "
                                     f"({len(id2label or {})} labels)")
        sentence.tags = [id2label[t] if isinstance(t, int) else t for t in sentence.tags or []]
