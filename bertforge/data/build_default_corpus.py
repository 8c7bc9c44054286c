"""Rebuild ``default_corpus.txt.gz`` from Debian's ``dict-devil`` package (see DEFAULT_CORPUS.md).

Not used at run time; kept so the bundled corpus can be checked and regenerated::

    apt-get download dict-devil && dpkg-deb -x dict-devil_*.deb pkg
    python -m bertforge.data.build_default_corpus pkg/usr/share/dictd bertforge/data/default_corpus.txt.gz

The author's preface and each letter section of the dictionary (its "chapters": all entries under A, under B, ...)
become one document each; inside a document every line is one sentence. The wrapped text is re-flowed, italics
markers (``_word_``) and verse attributions are dropped, and the sentences are split at the two spaces the original
typist put after every full stop. The e-text's own header (the dictfmt and Internet Wiretap banners) is dropped.
"""

from __future__ import annotations

import gzip
import re
import sys
from pathlib import Path

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_SENTENCE_END = re.compile(r"(?<=[.!?])([\"')\]]*)\s{2,}(?=[\"'(\[A-Z0-9])")
_HEADWORD = re.compile(r"^[A-Z][A-Z0-9'\- ,]*, [a-z.]+\.$|^[A-Z][A-Z0-9'\- ]*\.$")


def _b64(value: str) -> int:
    number = 0
    for char in value:
        number = number * 64 + _B64.index(char)
    return number


def _blocks(text: str) -> list[list[str]]:
    blocks, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.append(line.rstrip())
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return blocks


def _flow(lines: list[str]) -> str:
    """Join wrapped lines; a line ending in a sentence stop is joined with two spaces so the split below sees it."""
    out = ""
    for line in lines:
        piece = line.strip()
        if not out:
            out = piece
        elif re.search(r"[A-Za-z]-$", out) and not out.endswith("--"):
            out += piece  # a compound split at the line end: "cannon-" + "shot"
        elif re.search(r"[.!?][\"')\]]*$", out):
            out += "  " + piece
        else:
            out += " " + piece
    return out


def _sentences(block: list[str]) -> list[str]:
    # A right-aligned last line of an indented block is the verse's attribution ("G.J.", a poet's name): drop it.
    if len(block) > 1 and len(block[-1]) - len(block[-1].lstrip()) >= 24:
        block = block[:-1]
    text = _flow(block).replace("_", "")
    parts: list[str] = []
    for piece in _SENTENCE_END.split(text):
        if parts and re.fullmatch(r"[\"')\]]*", piece):
            parts[-1] += piece  # closing quote/bracket captured by the split group
        elif piece.strip():
            parts.append(re.sub(r"\s+", " ", piece).strip())
    return parts


def entry_to_document(text: str) -> list[str]:
    sentences: list[str] = []
    for block in _blocks(text):
        sentences.extend(_sentences(block))
    # "ABASEMENT, n." is split off as its own sentence: glue the head word onto its definition.
    if len(sentences) >= 2 and _HEADWORD.match(sentences[0]):
        sentences[0:2] = [sentences[0] + " " + sentences[1]]
    return sentences


def build(dictd_dir: Path) -> list[list[str]]:
    data = gzip.decompress((dictd_dir / "devil.dict.dz").read_bytes()).decode("utf-8")
    entries = []
    for line in (dictd_dir / "devil.index").read_text("utf-8").splitlines():
        head, offset_b64, length_b64 = line.split("\t")
        entries.append((_b64(offset_b64), _b64(length_b64), head))
    documents: list[list[str]] = []
    section = None
    done: set[tuple[str, ...]] = set()
    for offset, length, head in sorted(entries):
        text = data[offset : offset + length]
        if head == "00databaseinfo":
            if "PREFACE" not in text:
                continue
            text = text.split("PREFACE", 1)[1]  # drop the dictfmt and e-text headers, keep Bierce's preface
        elif head.startswith("00database"):
            continue
        sentences = entry_to_document(text)
        if not sentences or tuple(sentences) in done:
            continue  # a few entries are indexed under two head words, and two are printed twice in the e-text
        done.add(tuple(sentences))
        letter = "preface" if head == "00databaseinfo" else head[0].upper()
        if letter != section:
            documents.append([])
            section = letter
        documents[-1].extend(sentences)
    return documents


def main(argv: list[str]) -> None:
    dictd_dir, out = Path(argv[0]), Path(argv[1])
    documents = build(dictd_dir)
    text = "\n\n".join("\n".join(doc) for doc in documents) + "\n"
    # No file name and mtime=0 in the gzip header: rebuilds are byte-identical.
    with open(out, "wb") as raw, gzip.GzipFile("", "wb", compresslevel=9, fileobj=raw, mtime=0) as fh:
        fh.write(text.encode("utf-8"))
    print(f"{out}: {len(documents)} documents, {sum(map(len, documents))} sentences, {len(text)} characters")


if __name__ == "__main__":
    main(sys.argv[1:])
