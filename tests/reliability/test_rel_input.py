"""Input files a careless user gives: rows with a field too many or too few, broken quotes, NER tags that are not
IOB, binary files named .txt, a CSV field over the csv module's 131,072-character limit, and pipeline inputs that
are not text. Each is refused with one error naming the file, the line and what is wrong (or, where asked for,
read leniently with a count), through the API and the CLI: non-zero exit, one line, nothing written.
"""

from __future__ import annotations

import csv
import gzip
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from bertforge import BertforgeError
from bertforge.data import CorpusReader, iter_documents
from bertforge.finetune.data import read_classification, read_conll, tag_scheme
from bertforge.core.io import binary_reason
from tests.helpers import TINY_CONFIG
from tests.reliability.rel_helpers import one_torch_thread, report
from tests.reliability.test_rel_cli import assert_one_line_error, invoke

SST2 = Path("/work/shared/data/tasks/sst2/train.tsv")


def write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------- rows


MALFORMED = {
    # name: (file name, content, what the message must say, the line it names)
    "unquoted comma (more fields)": ("d.csv", "text,label\nfine,neg\nI liked it, a lot,pos\n", "3 fields, but the header has 2", 3),
    "missing field": ("d.csv", "text,label\nfine,neg\nno label here\nok,pos\n", "1 field, but the header has 2", 3),
    "unbalanced quote": ("d.csv", 'text,label\nfine,neg\n"I liked it,pos\nok,neg\n', "never closed (an unbalanced quote)", 3),
    "text after a closing quote": ("d.csv", 'text,label\n"I liked" it,pos\nok,neg\n', "text after a closing quote", 2),
    "embedded tab (TSV)": ("d.tsv", "sentence\tlabel\nfine\t1\na tab\there\t0\n", "3 fields, but the header has 2", 3),
    "quoted field holding a tab (TSV)": ("d.tsv", 'sentence\tlabel\n"a\tb"\t1\n', "3 fields, but the header has 2", 2),
    "header-less row too short": ("d.tsv", "src\t1\t\tgood\nsrc\t0\tbad\n", "3 fields, but the first row has 4", 2),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_row_is_refused_with_file_and_line(tmp_path, case):
    name, content, problem, line = MALFORMED[case]
    path = write(tmp_path / name, content)
    kwargs = {"text_column": "3", "label_column": "1", "no_header": True} if "header-less" in case else {}
    with pytest.raises(BertforgeError) as err:
        read_classification(path, **kwargs)
    message = str(err.value)
    assert message.startswith(f"{path}:{line}") and problem in message and "--lenient-rows" in message, message


def test_lenient_rows_skips_malformed_rows_and_counts_them(tmp_path, caplog):
    path = write(tmp_path / "d.csv", 'text,label\ngood one,pos\nI liked it, a lot,pos\nshort\n"ok, quoted",neg\n'
                 'bad "quote" here,neg\n"after" text,pos\nlast,neg\n')
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        examples = read_classification(path, lenient=True)
    assert [(e.text, e.label, e.line) for e in examples] == [
        ("good one", "pos", 2), ("ok, quoted", "neg", 5), ('bad "quote" here', "neg", 6), ("last", "neg", 8)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "skipped 3 malformed rows" in warnings[0] and "line 3" in warnings[0], warnings
    caplog.clear()
    good = write(tmp_path / "good.csv", "text,label\na,pos\n")
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        assert len(read_classification(good, lenient=True)) == 1
    assert not caplog.records  # nothing skipped, nothing said


def test_tsv_quotes_glue_and_pandas(tmp_path):
    """TSV is the GLUE convention (quotes are text), except a field written the way pandas/csv writes a text
    holding a quote (whole field quoted, inner quotes doubled), which reads back as the text that was written."""
    texts = ['Susan whispered "Shut up".', '"Yes," he said.', 'say "hi" now', '"quoted"', "it 's fine"]
    glue = write(tmp_path / "glue.tsv", "sentence\tlabel\n" + "".join(f"{t}\t1\n" for t in texts))
    assert [e.text for e in read_classification(glue)] == texts
    written = tmp_path / "pandas.tsv"
    with open(written, "w", encoding="utf-8", newline="") as fh:  # what pandas' to_csv(sep="\t") writes
        writer = csv.writer(fh, delimiter="\t", quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        writer.writerow(["sentence", "label"])
        writer.writerows([t, 1] for t in texts)
    assert '"""Yes,"" he said."' in written.read_text()
    assert [e.text for e in read_classification(written)] == texts


@pytest.mark.skipif(not SST2.is_file(), reason="the shared SST-2 copy is not on this machine")
def test_shared_sst2_tsv_loads_every_row():
    examples = read_classification(SST2)
    assert len(examples) == 60_614 and {e.label for e in examples} == {"0", "1"}
    assert (examples[0].text, examples[0].line) == ("when are bears bears and ", 2)


# ---------------------------------------------------------------------------------------------------- NER tags


def conll(path: Path, tags: list[str]) -> Path:
    return write(path, "-DOCSTART- O\n\n" + "".join(f"w{i} {t}\n" for i, t in enumerate(tags)))


@pytest.mark.parametrize("tags, scheme", [
    (["B-PER", "I-PER", "O", "B-LOC"], "IOB2"),
    (["I-PER", "I-PER", "B-PER", "O", "I-LOC"], "IOB1"),
    (["B-PER", "E-PER", "O", "S-LOC"], "BIOES"),
    (["O", "O"], "IOB2"),
])
def test_ner_tag_scheme_is_detected(tmp_path, tags, scheme):
    path = conll(tmp_path / "ner.txt", tags)
    assert tag_scheme(path, read_conll(path)) == scheme


@pytest.mark.parametrize("tags, bad, line", [
    (["B-PER", "O", "PERSON"], "'PERSON'", 5),
    (["b-per", "O"], "'b-per'", 3),
    (["O", "B-"], "'B-'", 4),
])
def test_ner_tags_that_are_not_iob_are_refused(tmp_path, tags, bad, line):
    path = conll(tmp_path / "ner.txt", tags)
    with pytest.raises(BertforgeError, match=rf"^{path}:{line}: tag {bad} is not an IOB or BIOES tag"):
        read_conll(path)
    assert read_conll(path, require_labels=False)  # unlabelled input (predict) keeps its last column as words


def test_ner_mixed_schemes_are_refused(tmp_path):
    path = conll(tmp_path / "ner.txt", ["O", "I-PER", "O", "S-LOC"])
    with pytest.raises(BertforgeError, match=rf"{path}:6: tag 'S-LOC' is BIOES, but line 4 opens an entity with 'I-PER'"):
        read_conll(path)


# ---------------------------------------------------------------------------------------------------- binary files


def binary_samples(root: Path) -> dict[str, Path]:
    ls = Path(shutil.which("ls") or "/bin/ls").read_bytes()
    text = "a plain sentence of text .\n" * 50
    return {
        "copy of /bin/ls as .txt": write(root / "ls.txt", ls),
        "copy of /bin/ls as .bin": write(root / "ls.bin", ls),
        "/bin/ls gzipped": write(root / "ls.txt.gz", gzip.compress(ls[:200_000])),
        "UTF-16 text": write(root / "utf16.txt", text.encode("utf-16")),
        "control characters, no NUL": write(root / "ctrl.txt", bytes(range(1, 9)) * 500 + text.encode()),
        "KOI8-R text (mostly bytes that are not UTF-8)": write(root / "koi8.txt", "Привет мир, это текст.\n".encode("koi8-r") * 40),
    }


def test_binary_files_are_refused_by_every_reader(tmp_path):
    from bertforge.commands.embed import read_texts

    refused = 0
    for path in binary_samples(tmp_path).values():
        for read in (lambda p: CorpusReader(p), lambda p: list(iter_documents(p))):
            with pytest.raises(BertforgeError, match=rf"^{path}: not a text file: .*--allow-binary"):
                read(path)
        task_file = path.with_suffix(".csv") if not path.name.endswith(".gz") else None
        if task_file is not None:
            shutil.copy(path, task_file)
            with pytest.raises(BertforgeError, match=rf"^{task_file}: not a text file: "):
                read_classification(task_file)
            embed_input = shutil.copy(path, path.with_name(path.stem + "-embed.txt"))
            with pytest.raises(BertforgeError, match=rf"^{embed_input}: not a text file: "):
                read_texts(Path(embed_input), "text")
        reader = CorpusReader(path, allow_binary=True, cycle=False, min_docs=0)  # the override reads all of it
        list(reader)
        assert reader.bytes_read == len(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
        refused += 1
    # text with some invalid bytes is still text: read, the bytes replaced and counted
    latin = write(tmp_path / "latin1.txt", "Un café à Paris, naïve idée.\n".encode("latin-1") * 100)
    reader = CorpusReader(latin, cycle=False)
    assert len(list(reader)) == 1 and reader.bytes_replaced == 400
    assert binary_reason(b"plain\ttext\r\n\x0c") is None and binary_reason(b"") is None
    report(f"binary files refused by the corpus reader, tokenizer training, task-file and embed readers: {refused} / {refused} kinds")


def warnings_of(caplog) -> str:
    """What the run logged as warnings (in-process, logging goes to pytest's handler, not to stderr)."""
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_cli_train_tokenizer_and_pretrain_refuse_a_binary_corpus(tmp_path, capsys, caplog, model_dirs):
    ls = write(tmp_path / "ls.txt", Path(shutil.which("ls") or "/bin/ls").read_bytes())
    out = tmp_path / "vocab"
    rc, _, err = invoke(["train-tokenizer", "--corpus", str(ls), "--vocab-size", "60", "--out", str(out)], capsys)
    assert_one_line_error("train-tokenizer", rc, err, str(ls), "NUL byte", "--allow-binary")
    assert not out.exists()
    run = tmp_path / "run"
    with one_torch_thread():
        rc, _, err = invoke(["pretrain", "--corpus", str(ls), "--tokenizer", str(model_dirs["pretrained"]),
                             "--out", str(run), "--max-steps", "1", "--no-progress"], capsys)
    assert_one_line_error("pretrain", rc, err, str(ls), "NUL byte")
    assert not run.exists(), sorted(run.rglob("*"))
    rc, _, err = invoke(["train-tokenizer", "--corpus", str(ls), "--vocab-size", "60", "--allow-binary",
                         "--out", str(out)], capsys)
    assert rc == 0 and (out / "vocab.txt").is_file(), err
    assert "bytes were not UTF-8 and were read as U+FFFD" in warnings_of(caplog)  # the override says what it replaced


def test_cli_reports_replaced_bytes_at_the_end_of_a_run(tmp_path, capsys, caplog, model_dirs):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(model_dirs["corpus"].read_bytes().replace(b"river", b"caf\xe9", 5))
    rc, _, err = invoke(["train-tokenizer", "--corpus", str(corpus), "--vocab-size", "60", "--out",
                         str(tmp_path / "vocab")], capsys)
    assert rc == 0, err
    assert f"corpus: 5 bytes were not UTF-8 and were read as U+FFFD, the first at {corpus}:" in warnings_of(caplog)
    caplog.clear()
    with one_torch_thread():
        rc, _, err = invoke(["pretrain", "--corpus", str(corpus), "--tokenizer", str(model_dirs["pretrained"]),
                             "--config", str(write(tmp_path / "config.json", json.dumps(TINY_CONFIG))),
                             "--out", str(tmp_path / "run"), "--max-steps", "2", "--batch-size", "2",
                             "--max-length", "32", "--no-progress"], capsys)
    assert rc == 0, err
    last = caplog.records[-1].getMessage()  # the warning comes after the "done" line
    assert "bytes were not UTF-8 and were read as U+FFFD" in last, warnings_of(caplog)
    replaced = int(last.split("corpus: ")[1].split(" byte")[0].replace(",", ""))
    passes = int(last.split("counted on each of ")[1].split(" passes")[0]) if "passes" in last else 1
    assert 5 * (passes - 1) < replaced <= 5 * passes, last  # the 5 bytes, on every pass the stream made
    report(f"replaced bytes reported: train-tokenizer 5 / 5; pretrain (2 steps) {replaced} in {passes} passes")


# ---------------------------------------------------------------------------------------------------- CLI


def test_cli_finetune_refuses_a_malformed_row(tmp_path, capsys, model_dirs):
    train = write(tmp_path / "train.csv", "text,label\ngood,pos\nI liked it, a lot,pos\nbad,neg\n")
    dev = write(tmp_path / "dev.csv", "text,label\ngood,pos\nbad,neg\n")
    out = tmp_path / "run"
    rc, _, err = invoke(["finetune", "--task", "classification", "--model", str(model_dirs["pretrained"]),
                         "--train", str(train), "--dev", str(dev), "--out", str(out), "--no-progress"], capsys)
    assert_one_line_error("finetune", rc, err, f"{train}:3", "3 fields, but the header has 2")
    assert not out.exists()


def test_cli_finetune_refuses_non_iob_tags(tmp_path, capsys, model_dirs):
    train = conll(tmp_path / "train.txt", ["PERSON", "O"])
    out = tmp_path / "run"
    rc, _, err = invoke(["finetune", "--task", "ner", "--model", str(model_dirs["pretrained"]), "--train", str(train),
                         "--dev", str(train), "--out", str(out), "--no-progress"], capsys)
    assert_one_line_error("finetune", rc, err, f"{train}:3", "'PERSON'")
    assert not out.exists()


def test_cli_predict_long_csv_field_and_lenient_rows(tmp_path, capsys, caplog, model_dirs):
    """A 200,000-character CSV field (over csv's default 131,072 limit) is predicted as in TSV and JSONL; a
    malformed row fails the file unless --lenient-rows, which skips it and says so."""
    long = "word " * 40_000
    inputs = {
        "csv": write(tmp_path / "in.csv", f'text\n"{long}"\nshort one\n'),
        "tsv": write(tmp_path / "in.tsv", f"text\n{long}\nshort one\n"),
        "jsonl": write(tmp_path / "in.jsonl", json.dumps({"text": long}) + "\n" + json.dumps({"text": "short one"}) + "\n"),
    }
    base = ["predict", "--task", "classification", "--model", str(model_dirs["classifier"]), "--no-progress"]
    results = {}
    with one_torch_thread():
        for kind, path in inputs.items():
            output = tmp_path / f"out-{kind}.jsonl"
            rc, _, err = invoke([*base, "--input", str(path), "--out", str(output)], capsys)
            assert rc == 0, err
            results[kind] = [json.loads(line) for line in output.read_text().splitlines()]
        for rows in results.values():
            for row in rows:
                row.pop("line")  # the same inputs sit on other lines of the three files
        assert len(results["csv"]) == 2 and results["csv"] == results["tsv"] == results["jsonl"]
        bad = write(tmp_path / "bad.csv", "text\nfine\nfine, but,split\nlast\n")
        output = tmp_path / "bad.jsonl"
        rc, _, err = invoke([*base, "--input", str(bad), "--out", str(output)], capsys)
        assert_one_line_error("predict", rc, err, f"{bad}:3", "3 fields, but the header has 1")
        assert not output.exists()
        rc, _, err = invoke([*base, "--input", str(bad), "--out", str(output), "--lenient-rows"], capsys)
    assert rc == 0 and "skipped 1 malformed row" in warnings_of(caplog), err
    assert len(output.read_text().splitlines()) == 2


def test_cli_embed_refuses_a_binary_input(tmp_path, capsys, model_dirs):
    ls = write(tmp_path / "ls.txt", Path(shutil.which("ls") or "/bin/ls").read_bytes())
    output = tmp_path / "e.npy"
    rc, _, err = invoke(["embed", "--model", str(model_dirs["pretrained"]), "--input", str(ls), "--out",
                         str(output)], capsys)
    assert_one_line_error("embed", rc, err, str(ls), "not a text file", "NUL byte")
    assert not output.exists()


# ---------------------------------------------------------------------------------------------------- pipelines


def test_pipelines_refuse_inputs_that_are_not_text(model_dirs):
    from bertforge.pipelines import pipeline

    with one_torch_thread():
        embed = pipeline("embed", model=model_dirs["pretrained"])
        fill = pipeline("fill-mask", model=model_dirs["pretrained"])
        classify = pipeline("text-classification", model=model_dirs["classifier"])
        cases = [
            (embed, {"text": "a"}, "embed: expected a string or a list of them, got dict"),
            (embed, {"a", "b"}, "got set"),
            (embed, b"bytes", "got bytes"),
            (embed, 3, "got int"),
            (embed, None, "got NoneType"),
            (embed, ["fine", {"text": "a"}], "embed: input 1 is a dict"),
            (embed, ["fine", 7], "embed: input 1 is a int"),
            (fill, {"text": "a [MASK]"}, "fill-mask: expected a string or a list of them, got dict"),
            (classify, {"a", "b"}, "text-classification: expected a string, a (text, text_pair) tuple"),
            (classify, {"sentence": "a"}, "text-classification: input 0 must be a string"),
        ]
        for pipe, value, message in cases:
            with pytest.raises(BertforgeError, match=message.replace("(", r"\(").replace(")", r"\)")):
                pipe(value)
        assert embed("a").shape == (TINY_CONFIG["hidden_size"],) and embed(["a", "b"]).shape == (2, TINY_CONFIG["hidden_size"])
        assert np.isfinite(embed(("a", "b"))).all()  # a tuple is a list of texts
    report(f"pipelines: {len(cases)} / {len(cases)} non-text inputs refused")
