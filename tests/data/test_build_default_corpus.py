"""Tests of `bertforge.data.build_default_corpus`: the bundled corpus rebuilt from a (made-up) dictd dictionary."""

from __future__ import annotations

import gzip

from bertforge.data import iter_documents
from bertforge.data.build_default_corpus import build, entry_to_document, main

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

# The dictd entries, in the order of the data file: the database info (the e-text's banners, then the preface), a
# database entry that is not text, two entries under A (one of them indexed twice), one under B.
ENTRIES = [
    ("00databaseinfo", "This file was converted by dictfmt.\nInternet Wiretap Online Edition.\n\nPREFACE\n\n"
                       "The Devil's Dictionary was begun in 1881.  It was continued\nlater.\n"),
    ("00databaseshort", "The Devil's Dictionary\n"),
    ("ABASEMENT", "ABASEMENT, n.\n\n  A decent and customary mental attitude in the _presence_ of wealth\n"
                  "  or power.  Peculiarly appropriate in an employee.\n"),
    ("ABSURDITY", "ABSURDITY, n.  A statement of belief manifestly inconsistent with one's own\nopinion.\n\n"
                  "    A cannon-\n    shot is loud.\n                            G.J.\n"),
    ("BACCHUS", 'BACCHUS, n.  A deity.  The ancients said "Drink."  Then they drank.\n'),
]
EXPECTED = [
    ["The Devil's Dictionary was begun in 1881.", "It was continued later."],
    ["ABASEMENT, n. A decent and customary mental attitude in the presence of wealth or power.",
     "Peculiarly appropriate in an employee.",
     "ABSURDITY, n. A statement of belief manifestly inconsistent with one's own opinion.",
     "A cannon-shot is loud."],
    ["BACCHUS, n. A deity.", 'The ancients said "Drink."', "Then they drank."],
]


def b64(number: int) -> str:
    """dictd's base-64 numbers (the offsets and lengths of devil.index)."""
    digits = ""
    while True:
        number, digit = divmod(number, 64)
        digits = B64[digit] + digits
        if not number:
            return digits


def write_dictd(directory):
    """devil.dict.dz and devil.index for ENTRIES, ABSURDITY indexed under a second head word as well; the index
    lines in reverse order (the entries are taken in the data file's order)."""
    directory.mkdir()
    data, lines, offset = "", [], 0
    for head, text in ENTRIES:
        lines.append(f"{head}\t{b64(offset)}\t{b64(len(text))}")
        if head == "ABSURDITY":
            lines.append(f"ABSURDITIES\t{b64(offset)}\t{b64(len(text))}")
        data += text
        offset += len(text)
    (directory / "devil.dict.dz").write_bytes(gzip.compress(data.encode("utf-8")))
    (directory / "devil.index").write_text("\n".join(reversed(lines)) + "\n", encoding="utf-8")
    return directory


def test_entry_to_document_reflows_splits_and_glues_the_head_word():
    assert entry_to_document(ENTRIES[3][1]) == EXPECTED[1][2:]  # the hyphenated line end joined, "G.J." dropped
    assert entry_to_document(ENTRIES[4][1]) == EXPECTED[2]  # the closing quote stays with its sentence
    assert entry_to_document("\n\n") == []


def test_build_and_main_write_one_document_per_letter(tmp_path, capsys):
    dictd = write_dictd(tmp_path / "dictd")
    assert build(dictd) == EXPECTED  # banners, the database entry and the duplicate dropped
    out = tmp_path / "corpus.txt.gz"
    main([str(dictd), str(out)])
    assert "3 documents, 9 sentences" in capsys.readouterr().out
    assert list(iter_documents(out, as_documents=True)) == EXPECTED  # what the corpus reader reads back
    first = out.read_bytes()
    main([str(dictd), str(out)])
    assert out.read_bytes() == first  # no name or time in the gzip header: a rebuild is byte-identical
