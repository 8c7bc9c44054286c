"""Embedding a corpus into shards (`bertforge.pipelines.embed_corpus`): every input format gives the pipeline's
vectors; the shards and the manifest; a run stopped after a shard and resumed equals an uninterrupted one without
redoing the finished shards; a changed input or setting is refused; shares (and torchrun's ranks) together equal one
process; bad rows refused or skipped; the stored dtypes and the compute precision; every family's model against `transformers`."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge import BertModel
from bertforge.core.errors import BertforgeError
from bertforge.core.state import DataChanged
from bertforge.pipelines import embed_corpus as ec
from bertforge.pipelines.embed_corpus import CorpusEmbedding, CorpusRun, Share, embed_corpus, read_embeddings
from tests.helpers import SPECIALS, WORDS, tiny_config, write_uncased_tokenizer

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

TOL = 1e-5
ROWS = 70  # shards of 16: five, the last of 6 rows


def make_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20))) for _ in range(n)]


TEXTS = make_texts(ROWS)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A tiny random BERT (2 layers, 32 wide, 64 positions) with a WordPiece vocabulary of the test words."""
    directory = tmp_path_factory.mktemp("tiny_embedder")
    torch.manual_seed(0)
    BertModel(tiny_config()).save_pretrained(directory)
    return write_uncased_tokenizer(directory, SPECIALS + WORDS)


@pytest.fixture(scope="module")
def pipe(model):
    return bertforge.pipeline("embed", model=model)


@pytest.fixture(scope="module")
def expected(pipe) -> np.ndarray:
    return pipe(TEXTS)


def write_parquet(path: Path, texts: list, ids: list | None = None, row_group_size: int = 24) -> Path:
    columns = {"text": texts, **({"doc": ids} if ids is not None else {})}
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def run(model: Path, data: Path, out: Path, pipe=None, **settings) -> dict:
    options = {k: settings.pop(k) for k in ("resume", "share", "sort_window") if k in settings}
    return embed_corpus(CorpusEmbedding(model=str(model), input=str(data), shard_rows=16, **settings), out,
                        progress=False, pipe=pipe, **options)


def tables(out: Path) -> dict[str, object]:
    return {p.name: pq.read_table(p) for p in sorted(out.glob("shard-*.parquet"))}


# ---------------------------------------------------------------------------------------------------- formats


def test_every_format_and_a_folder_give_the_pipelines_vectors(tmp_path, model, pipe, expected):
    import pyarrow.feather as feather

    parquet = write_parquet(tmp_path / "c.parquet", TEXTS)
    feather.write_feather(pa.table({"text": TEXTS}), tmp_path / "c.arrow")
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n\n" for t in TEXTS))  # blank lines: no rows
    (tmp_path / "c.txt").write_text("\n".join(TEXTS) + "\n")
    for name in ("c.parquet", "c.arrow", "c.jsonl", "c.txt"):
        summary = run(model, tmp_path / name, tmp_path / f"out-{name}", pipe)
        assert summary["rows"] == ROWS and summary["shards"] == 5 and summary["manifest"], name
        ids, vectors = read_embeddings(tmp_path / f"out-{name}")
        assert ids.tolist() == list(range(ROWS)), name  # no --id-column: the row's position
        assert np.abs(vectors - expected).max() < TOL, name
    folder = tmp_path / "folder"
    (folder / "b").mkdir(parents=True)
    write_parquet(folder / "a.parquet", TEXTS[:30])
    (folder / "b" / "c.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TEXTS[30:50]))  # JSON strings
    (folder / "b" / "d.txt").write_text("\n".join(TEXTS[50:]) + "\n")
    (folder / ".hidden.txt").write_text("not read\n")
    run(model, folder, tmp_path / "out-folder", pipe)
    ids, vectors = read_embeddings(tmp_path / "out-folder")
    assert ids.tolist() == list(range(ROWS)) and np.abs(vectors - expected).max() < TOL
    manifest = json.loads((tmp_path / "out-folder" / "manifest.json").read_text())
    assert [f[0] for f in manifest["input"]["files"]] == ["a.parquet", "c.jsonl", "d.txt"]
    assert parquet.exists()


def test_shards_and_manifest(tmp_path, model, pipe, expected):
    data = write_parquet(tmp_path / "c.parquet", TEXTS, [f"doc-{i}" for i in range(ROWS)])
    out = tmp_path / "out"
    run(model, data, out, pipe, id_column="doc", normalize=False)
    shards = tables(out)
    assert list(shards) == [f"shard-0000{k}.parquet" for k in range(5)]
    first = shards["shard-00000.parquet"]
    assert first.column_names == ["id", "embedding"] and str(first.schema.field("id").type) == "string"
    assert first.schema.field("embedding").type == pa.list_(pa.float32(), 32)  # a fixed-size list
    assert first.column("id").to_pylist() == [f"doc-{i}" for i in range(16)]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "bertforge-embeddings" and manifest["dimensions"] == 32
    assert (manifest["pooling"], manifest["normalize"], manifest["vector_dtype"]) == ("mean", False, "float32")
    assert manifest["model"] == str(model) and manifest["id"] == {"column": "doc", "type": "string"}
    assert manifest["input"]["files"] == [["c.parquet", data.stat().st_size]]
    assert manifest["rows"] == {"input": ROWS, "embedded": ROWS, "skipped": {}, "truncated": 0, "examples": []}
    assert [s["rows"] for s in manifest["shards"]] == [[0, 16], [16, 32], [32, 48], [48, 64], [64, 70]]
    assert [s["count"] for s in manifest["shards"]] == [16, 16, 16, 16, 6]
    ids, vectors = read_embeddings(out)
    assert ids.tolist() == [f"doc-{i}" for i in range(ROWS)] and np.abs(vectors - expected).max() < TOL
    # the sort window changes the batches only: within float rounding of the default's shards
    run(model, data, tmp_path / "small", pipe, id_column="doc", sort_window=5)
    assert np.abs(read_embeddings(tmp_path / "small")[1] - vectors).max() < TOL


def test_normalize_and_cls_reach_the_shards_and_the_manifest(tmp_path, model):
    data = write_parquet(tmp_path / "c.parquet", TEXTS[:20])
    run(model, data, tmp_path / "out", None, pooling="cls", normalize=True)
    reference = bertforge.pipeline("embed", model=model, pooling="cls", normalize=True)(TEXTS[:20])
    assert np.abs(read_embeddings(tmp_path / "out")[1] - reference).max() < TOL
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert (manifest["pooling"], manifest["normalize"]) == ("cls", True)


# ---------------------------------------------------------------------------------------------------- resume


class Killed(Exception):
    pass


def stop_after(monkeypatch, shards: int) -> list[str]:
    """Let `shards` shards be written, then fail the next write as a kill would (before its rename)."""
    real, written = ec.write_shard, []

    def write(path, *args):
        if len(written) == shards:
            (path.parent / f".{path.name}.half.tmp").write_bytes(b"PAR1 half a shard")  # what a kill leaves
            raise Killed
        real(path, *args)
        written.append(path.name)

    monkeypatch.setattr(ec, "write_shard", write)
    return written


def test_resume_after_a_stop_equals_an_uninterrupted_run_and_redoes_no_shard(tmp_path, model, pipe, monkeypatch):
    data = write_parquet(tmp_path / "c.parquet", TEXTS, [f"d{i}" for i in range(ROWS)])
    run(model, data, tmp_path / "whole", pipe, id_column="doc")
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        assert stop_after(patch, 2) == [] and pytest.raises(Killed, run, model, data, out, pipe, id_column="doc")
    assert sorted(p.name for p in out.glob("shard-*")) == ["shard-00000.parquet", "shard-00001.parquet"]
    assert not (out / "manifest.json").exists()  # nothing looks complete
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")}
    with pytest.raises(BertforgeError, match="holds an embedding run already; --resume continues it"):
        run(model, data, out, pipe, id_column="doc")
    summary = run(model, data, out, pipe, id_column="doc", resume=True)
    assert (summary["kept"], summary["shards"], summary["rows"], summary["manifest"]) == (2, 3, ROWS - 32, True)
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("shard-0000[01]*")} == before  # not redone
    assert not list(out.glob(".shard-*")) and sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in (tmp_path / "whole").iterdir())
    whole, resumed = tables(tmp_path / "whole"), tables(out)
    assert all(whole[name].equals(resumed[name]) for name in whole)  # bit for bit
    manifest = lambda d: {k: v for k, v in json.loads((d / "manifest.json").read_text()).items() if k != "input"}  # noqa: E731
    assert manifest(out) == manifest(tmp_path / "whole")


def test_a_killed_process_is_resumed_by_the_command(tmp_path, model):
    """A real kill (SIGKILL, mid-run) and `embed --resume --out DIR` with no other option."""
    data = write_parquet(tmp_path / "c.parquet", make_texts(6000, seed=3), row_group_size=500)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "bertforge", "embed", "--model", str(model), "--input", str(data), "--out", str(out),
           "--shard-rows", "250", "--no-progress", "--threads", "1"]
    process = subprocess.Popen(cmd, stderr=subprocess.PIPE, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # until two shards are complete
            if len(list(out.glob("shard-*.parquet"))) >= 2 or process.poll() is not None:
                break
            time.sleep(0.05)
        process.kill()
    finally:
        process.wait()
    done = len(list(out.glob("shard-*.parquet")))
    assert process.returncode == 0 or (done >= 2 and not (out / "manifest.json").exists())
    result = subprocess.run([sys.executable, "-m", "bertforge", "embed", "--resume", "--out", str(out), "--no-progress",
                             "--threads", "1"], capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stderr
    assert "manifest.json written" in result.stderr
    ids, vectors = read_embeddings(out)
    assert ids.tolist() == list(range(6000))
    reference = bertforge.pipeline("embed", model=model, num_threads=1)(make_texts(6000, seed=3))
    assert np.abs(vectors - reference).max() < TOL


def test_a_changed_input_or_setting_is_refused_on_resume(tmp_path, model, pipe, monkeypatch):
    data = write_parquet(tmp_path / "c.parquet", TEXTS)
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        stop_after(patch, 1)
        with pytest.raises(Killed):
            run(model, data, out, pipe)
    with pytest.raises(BertforgeError, match=r"settings differ from the run's \(vector_dtype was 'float32', is 'int8'"):
        run(model, data, out, pipe, vector_dtype="int8", resume=True)
    write_parquet(data, TEXTS + ["one more row"])
    with pytest.raises(DataChanged, match=r"the input differs .*file 1 was c.parquet \(\d[\d,]* bytes\), is c.parquet"):
        run(model, data, out, pipe, resume=True)
    with pytest.raises(BertforgeError, match="no embedding run to resume"):
        run(model, data, tmp_path / "nothing", pipe, resume=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(BertforgeError, match="is not empty and holds no embedding run"):
        run(model, data, tmp_path / "other", pipe)


# ---------------------------------------------------------------------------------------------------- shares


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_shares_together_equal_one_run(tmp_path, model, pipe, fmt):
    if fmt == "parquet":
        data = write_parquet(tmp_path / "c.parquet", TEXTS, row_group_size=10)
    else:  # JSONL: the lines of other shares are counted, not parsed
        data = tmp_path / "c.jsonl"
        data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    run(model, data, tmp_path / "one", pipe)
    out = tmp_path / "three"
    summaries = [run(model, data, out, pipe, share=Share(i, 3)) for i in (2, 0, 1)]
    assert [s["shards"] for s in summaries] == [1, 2, 2]  # shards 2 | 0, 3 | 1, 4
    assert [s["manifest"] for s in summaries] == [False, False, True]  # written by the last to finish
    one, three = tables(tmp_path / "one"), tables(out)
    assert list(one) == list(three) and all(one[k].equals(three[k]) for k in one)
    with pytest.raises(BertforgeError, match="shard index 3 is not in 0..2"):
        Share(3, 3)
    with pytest.raises(BertforgeError, match="share 1 of 3 are there already; --resume"):
        run(model, data, out, pipe, share=Share(1, 3))


def test_a_share_reads_no_row_group_of_other_shares(tmp_path, model, pipe, monkeypatch):
    data = write_parquet(tmp_path / "c.parquet", TEXTS, row_group_size=16)  # a row group a shard
    read: list[list[int]] = []
    real = pq.ParquetFile.iter_batches

    def recording(self, *args, row_groups=None, **kwargs):
        read.append(row_groups)
        return real(self, *args, row_groups=row_groups, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", recording)
    run(model, data, tmp_path / "out", pipe, share=Share(1, 2))
    assert read == [[1], [3]]


def test_two_processes_under_torchrun_equal_one(tmp_path, model):
    """`torchrun --nproc-per-node 2 -m bertforge embed ...` (gloo, CPU): each rank its shards, one manifest."""
    data = write_parquet(tmp_path / "c.parquet", TEXTS, [f"d{i}" for i in range(ROWS)])
    argv = ["embed", "--model", str(model), "--input", str(data), "--id-column", "doc", "--shard-rows", "16",
            "--no-progress", "--threads", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    one = subprocess.run([sys.executable, "-m", "bertforge", *argv, "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert one.returncode == 0, one.stderr
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "bertforge", *argv, "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert two.returncode == 0, two.stderr
    assert two.stderr.count("manifest.json written") == 1
    a, b = tables(tmp_path / "one"), tables(tmp_path / "two")
    assert list(a) == list(b) and all(a[k].equals(b[k]) for k in a)
    assert json.loads((tmp_path / "one" / "manifest.json").read_text())["shards"] == json.loads(
        (tmp_path / "two" / "manifest.json").read_text())["shards"]


# ---------------------------------------------------------------------------------------------------- bad rows


BAD = ["river stone", None, "", "golden light", "castle", "  ", "ship song"]
BAD_IDS = ["a", "b", "c", "a", None, "d", "e"]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_bad_rows_are_refused_in_one_line_or_skipped_and_counted(tmp_path, model, pipe, fmt):
    if fmt == "parquet":
        data = write_parquet(tmp_path / "bad.parquet", BAD, BAD_IDS)
        where = "bad.parquet, row"
    else:
        data = tmp_path / "bad.jsonl"
        lines = [json.dumps({"doc": i, "text": t}) for i, t in zip(BAD_IDS, BAD)]
        lines[2] = json.dumps({"doc": "c"})  # no text key
        data.write_text("\n".join(lines) + "\n")
        where = "bad.jsonl, line"
    with pytest.raises(BertforgeError) as refused:
        run(model, data, tmp_path / "refused", pipe, id_column="doc")
    assert str(refused.value).startswith(f"{data}, {where.split(', ')[1]} 2: no text")
    assert "--skip-bad-rows" in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "refused" / "manifest.json").exists() and not list((tmp_path / "refused").glob("shard-*"))
    run(model, data, tmp_path / "skipped", pipe, id_column="doc", skip_bad_rows=True)
    ids, vectors = read_embeddings(tmp_path / "skipped")
    assert ids.tolist() == ["a", "e"]
    assert np.abs(vectors - pipe(["river stone", "ship song"])).max() < TOL
    rows = json.loads((tmp_path / "skipped" / "manifest.json").read_text())["rows"]
    no_text, empty = (1, 2) if fmt == "parquet" else (2, 1)  # the JSONL's line 3 has no text key
    assert rows["skipped"] == {"duplicate id": 1, "empty text": empty, "no id": 1, "no text": no_text}
    assert rows["input"] == 7 and rows["embedded"] == 2 and len(rows["examples"]) == 5
    assert rows["examples"][0].startswith(f"{data}, {where.split(', ')[1]} 2: ")


def test_duplicate_and_missing_ids_are_named(tmp_path, model, pipe):
    data = write_parquet(tmp_path / "dup.parquet", ["a b", "c d", "e f"], ["x", "y", "x"])
    with pytest.raises(BertforgeError, match=r"dup.parquet, row 3: duplicate id 'x' \(an earlier row has it\)"):
        run(model, data, tmp_path / "o1", pipe, id_column="doc")
    with pytest.raises(BertforgeError, match=r"no column 'doc' \(--id-column names it\); its columns: text"):
        run(model, write_parquet(tmp_path / "plain.parquet", ["a"]), tmp_path / "o2", pipe, id_column="doc")
    (tmp_path / "plain.txt").write_text("a\n")
    with pytest.raises(BertforgeError, match="a text file has no columns"):
        run(model, tmp_path / "plain.txt", tmp_path / "o3", pipe, id_column="doc")


def test_rows_past_the_models_length_are_truncated_and_counted(tmp_path, model, pipe):
    long = " ".join(WORDS * 4)  # 100 words: past the 64 positions
    texts = ["river", long, "stone", long]
    data = write_parquet(tmp_path / "long.parquet", texts)
    run(model, data, tmp_path / "out", pipe)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["rows"]["truncated"] == 2 and manifest["shards"][0]["truncated"] == 2
    assert np.abs(read_embeddings(tmp_path / "out")[1] - pipe(texts)).max() < TOL


# ---------------------------------------------------------------------------------------------- stored dtypes


def test_float16_and_int8_shards(tmp_path, model, pipe, expected):
    data = write_parquet(tmp_path / "c.parquet", TEXTS)
    run(model, data, tmp_path / "f16", pipe, vector_dtype="float16")
    run(model, data, tmp_path / "i8", pipe, vector_dtype="int8")
    half = pq.read_table(tmp_path / "f16" / "shard-00000.parquet")
    assert half.schema.field("embedding").type == pa.list_(pa.float16(), 32)
    assert np.abs(read_embeddings(tmp_path / "f16")[1] - expected).max() < 2e-3 * np.abs(expected).max()
    int8 = pq.read_table(tmp_path / "i8" / "shard-00000.parquet")
    assert int8.column_names == ["id", "embedding", "scale"]
    assert int8.schema.field("embedding").type == pa.list_(pa.int8(), 32)
    scale = np.abs(expected).max(axis=1, keepdims=True) / 127  # each row: its largest value is ±127
    assert np.all(np.abs(read_embeddings(tmp_path / "i8")[1] - expected) <= scale / 2 + 1e-7)
    assert json.loads((tmp_path / "i8" / "manifest.json").read_text())["vector_dtype"] == "int8"
    with pytest.raises(BertforgeError, match="vector_dtype must be one of float32, float16, int8"):
        CorpusEmbedding(model="m", input="i", vector_dtype="bf16")


# ---------------------------------------------------------------------------------------------------- families


def test_every_family_embeds_a_corpus_as_transformers_pools_it(tmp_path_factory, tmp_path):
    pytest.importorskip("transformers")
    from tests.embed_layer_helpers import FAMILIES, LAYERS, VOCAB, family_checkpoints, reference_embeddings

    texts = ["the river stone", "a quiet morning of golden light walked the forest", "ship",
             "the ancient castle opened a heavy window", "silver songs"]
    data = write_parquet(tmp_path / "c.parquet", texts)
    for family, (directory, reference) in family_checkpoints(tmp_path_factory, FAMILIES).items():
        write_uncased_tokenizer(directory, VOCAB)
        out = tmp_path / family
        embed_corpus(CorpusEmbedding(model=str(directory), input=str(data), shard_rows=2, pooling="mean"), out,
                     progress=False)
        rows = [f.input_ids for f in bertforge.pipeline("embed", model=directory).features(texts)[0]]
        got = read_embeddings(out)[1]
        assert np.abs(got - reference_embeddings(reference, rows, LAYERS)).max() < TOL, family


def test_the_run_refuses_an_output_inside_its_input_or_model(tmp_path, model, pipe):
    folder = tmp_path / "corpus"
    folder.mkdir()
    write_parquet(folder / "a.parquet", TEXTS[:3])
    with pytest.raises(BertforgeError, match="is inside the input"):
        CorpusRun(CorpusEmbedding(model=str(model), input=str(folder)), folder / "vectors", pipe=pipe)
    with pytest.raises(BertforgeError, match="is inside the model directory"):
        CorpusRun(CorpusEmbedding(model=str(model), input=str(folder)), model / "vectors", pipe=pipe)
