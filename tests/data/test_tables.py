"""`bertforge.data.tables`: Parquet and Arrow files and rows in memory read as the same records a JSONL file gives."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest

from bertforge.core.errors import BertforgeError
from bertforge.data import tables
from bertforge.data.tables import in_memory, is_description, refuse_description, split_in_memory, table_records
from bertforge.finetune.data import jsonl_objects, read_text_file

pa = pytest.importorskip("pyarrow")
import pyarrow.feather as feather  # noqa: E402
import pyarrow.ipc as ipc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

ROWS = [{"text": f"row {i} text", "label": ["a", "b"][i % 2], "score": i / 4, "tags": ["x"] * (i % 3)}
        for i in range(11)]


def write_all(root: Path, rows: list[dict]) -> dict[str, Path]:
    """The same rows as JSONL, Parquet (row groups of 4: three batches), Feather, Arrow IPC file and stream."""
    table = pa.Table.from_pylist(rows)
    paths = {"jsonl": root / "d.jsonl", "parquet": root / "d.parquet", "feather": root / "d.feather",
             "arrow": root / "d.arrow", "stream": root / "s.arrow"}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pq.write_table(table, paths["parquet"], row_group_size=4)
    feather.write_feather(table, paths["feather"], chunksize=4)
    with ipc.new_file(paths["arrow"], table.schema) as writer:
        writer.write_table(table, max_chunksize=3)
    with ipc.new_stream(paths["stream"], table.schema) as writer:
        writer.write_table(table, max_chunksize=5)
    return paths


@pytest.mark.parametrize("kind", ["parquet", "feather", "arrow", "stream"])
def test_every_table_format_reads_the_records_jsonl_gives(tmp_path, kind):
    paths = write_all(tmp_path, ROWS)
    expected = jsonl_objects(paths["jsonl"], read_text_file(paths["jsonl"]))
    assert table_records(paths[kind]) == expected  # rows numbered from 1 across batches, columns in order
    assert [list(r) for _, r in table_records(paths[kind])][0] == ["text", "label", "score", "tags"]


def test_parquet_is_read_one_record_batch_at_a_time(tmp_path, monkeypatch):
    path = write_all(tmp_path, ROWS)["parquet"]
    sizes = []
    real = tables._batches

    def counted(*args):
        for batch in real(*args):
            sizes.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(tables, "_batches", counted)
    monkeypatch.setattr(tables, "BATCH_ROWS", 5)
    assert len(table_records(path)) == 11
    assert sizes == [5, 5, 1]  # never the whole table at once


def test_rows_in_memory_in_every_form_read_the_same(tmp_path):
    paths = write_all(tmp_path, ROWS)
    expected = jsonl_objects(paths["jsonl"], read_text_file(paths["jsonl"]))
    columns = {k: [r[k] for r in ROWS] for k in ROWS[0]}
    datasets = pytest.importorskip("datasets")
    forms = [ROWS, tuple(ROWS), columns, datasets.Dataset.from_list(ROWS)]
    described = {in_memory(form).description for form in forms}
    assert all(in_memory(form).records == expected for form in forms)
    assert described == {in_memory(ROWS).description} and is_description(described.pop())
    assert in_memory(ROWS).description.startswith("<in-memory: 11 rows, sha256 ")
    assert in_memory(ROWS[:1]).description != in_memory(ROWS[1:2]).description  # the contents, not the count


@pytest.mark.parametrize("data, message", [
    ([], "no rows"),
    ({"text": ["a", "b"], "label": [1]}, "all of one length"),
    ({"text": "ab"}, "each column to a list"),
    (["a text"], "row 1 is a str, not a dict"),
    (42, "got int"),
])
def test_rows_in_memory_of_another_shape_are_refused(data, message):
    with pytest.raises(BertforgeError, match=message):
        in_memory(data, "train")


def test_a_missing_pyarrow_is_one_line_naming_the_install(tmp_path, monkeypatch):
    path = write_all(tmp_path, ROWS)["parquet"]
    real = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(BertforgeError) as err:
        table_records(path)
    assert str(err.value) == f"{path}: reading Parquet or Arrow files needs pyarrow: pip install 'bertforge[parquet]'"
    assert tables.PYARROW_HINT in str(err.value) and "\n" not in str(err.value)


def test_a_damaged_or_missing_file_is_named(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not a parquet file at all")
    with pytest.raises(BertforgeError, match=r"bad.parquet: cannot read it as a Parquet file"):
        table_records(bad)
    (tmp_path / "bad.feather").write_bytes(b"nor an arrow one")
    with pytest.raises(BertforgeError, match=r"bad.feather: cannot read it as an Arrow IPC file"):
        table_records(tmp_path / "bad.feather")
    with pytest.raises(BertforgeError, match="no such file"):
        table_records(tmp_path / "none.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS).slice(0, 0), tmp_path / "empty.parquet")
    with pytest.raises(BertforgeError, match="empty.parquet: no rows"):
        table_records(tmp_path / "empty.parquet")


def test_settings_record_a_description_and_a_replay_of_it_is_refused(tmp_path):
    from bertforge.finetune.config import FinetuneConfig

    cfg = FinetuneConfig(task="classification", model="m", train=ROWS, dev=str(tmp_path / "dev.tsv"), out="o")  # type: ignore[arg-type]
    recorded, data = split_in_memory(cfg, ("train", "dev"))
    assert list(data) == ["train"] and recorded.train == data["train"].description and recorded.dev == cfg.dev
    json.dumps(recorded.to_dict())  # JSON, as a settings file must be
    with pytest.raises(BertforgeError, match="cannot be replayed from its settings file"):
        refuse_description(recorded.train)
    refuse_description(str(tmp_path / "dev.tsv"))  # a path is not a description


def test_class_names_come_from_a_dataset_and_from_the_files_datasets_writes(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"tokens": ["a", "b"], "ner_tags": [0, 1], "label": 1}, {"tokens": ["c"], "ner_tags": [1], "label": 0}]
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-X"])),
                                  "label": datasets.ClassLabel(names=["neg", "pos"])})
    dataset = datasets.Dataset.from_list(rows, features=features)
    names = {"ner_tags": ["O", "B-X"], "label": ["neg", "pos"]}
    assert in_memory(dataset).class_names == names
    plain = in_memory(rows)
    assert plain.class_names == {} and plain.records == in_memory(dataset).records
    assert plain.description != in_memory(dataset).description  # the same ids under names are other data
    dataset.to_parquet(str(tmp_path / "d.parquet"))
    assert tables.table_class_names(tmp_path / "d.parquet") == names
    dataset.to_pandas().to_feather(tmp_path / "plain.feather")  # no datasets metadata: no names
    assert tables.table_class_names(tmp_path / "plain.feather") == {}
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    assert tables.table_class_names(tmp_path / "p.parquet") == {}
