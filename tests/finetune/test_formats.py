"""Fine-tuning, evaluation and prediction from a Parquet file, a `datasets.Dataset` or rows in memory give what the
same rows in a JSONL file give (same seed: the same weights, bit for bit); a run of rows in memory records them as
a description, resumes, and cannot be replayed from its settings file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertforge.core.errors import BertforgeError
from bertforge.finetune import evaluate, finetune, predict
from bertforge.finetune.config import FinetuneConfig

from .conftest import NEGATIVE, POSITIVE

pa = pytest.importorskip("pyarrow")
datasets = pytest.importorskip("datasets")
import pyarrow.parquet as pq  # noqa: E402

from tests.helpers import stopped_after  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

RUN = dict(task="classification", epochs=2, batch_size=4, lr=1e-3, max_length=16, seed=3, progress=False,
           device="cpu", log_every=2)


def sentiment_rows(n: int) -> list[dict]:
    return [{"text": (POSITIVE if i % 2 else NEGATIVE)[(i // 2) % 6], "label": "pos" if i % 2 else "neg"}
            for i in range(n)]




@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("formats")
    out = {}
    for split, n in (("train", 16), ("dev", 8)):
        rows = sentiment_rows(n)
        out[f"{split}.jsonl"] = root / f"{split}.jsonl"
        out[f"{split}.jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        out[f"{split}.parquet"] = root / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), out[f"{split}.parquet"], row_group_size=5)
    return out


@pytest.fixture(scope="module")
def reference(tiny_model, files, tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("reference") / "run"
    return finetune(model=str(tiny_model), train=str(files["train.jsonl"]), dev=str(files["dev.jsonl"]), out=str(out),
                    **RUN), out


def same_weights(a: Path, b: Path) -> None:
    wa, wb = (load_file(str(d / "model" / "model.safetensors")) for d in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), "weights differ"


@pytest.mark.parametrize("form", ["parquet", "dataset", "list of dicts", "dict of lists"])
def test_a_fine_tune_from_any_form_equals_the_jsonl_one(tiny_model, files, reference, tmp_path, form):
    data = {}
    for split, n in (("train", 16), ("dev", 8)):
        rows = sentiment_rows(n)
        data[split] = {"parquet": str(files[f"{split}.parquet"]), "dataset": datasets.Dataset.from_list(rows),
                       "list of dicts": rows, "dict of lists": {k: [r[k] for r in rows] for k in rows[0]}}[form]
    out = tmp_path / "run"
    summary = finetune(model=str(tiny_model), train=data["train"], dev=data["dev"], out=str(out), **RUN)
    expected, reference_out = reference
    assert summary["metrics"] == expected["metrics"] and summary["train_steps"] == expected["train_steps"] == 8
    same_weights(reference_out, out)
    saved = json.loads((out / "finetune_config.json").read_text())
    if form == "parquet":
        assert saved["train"] == str(files["train.parquet"])
    else:  # recorded as what they are
        assert saved["train"].startswith("<in-memory: 16 rows, sha256 ") and saved["dev"].startswith("<in-memory: 8 rows")
        assert summary["dev"] == saved["dev"]


def test_evaluate_and_predict_take_rows_in_memory(reference, files):
    _, out = reference
    model = out / "model"
    rows = sentiment_rows(8)
    from_file = evaluate("classification", model, files["dev.jsonl"], device="cpu", progress=False)
    for data in (rows, datasets.Dataset.from_list(rows), files["dev.parquet"]):
        assert evaluate("classification", model, data, device="cpu", progress=False) == from_file
    expected = predict("classification", model, files["dev.jsonl"], device="cpu", progress=False)
    unlabelled = [{"text": r["text"]} for r in rows]
    assert predict("classification", model, unlabelled, device="cpu", progress=False) == expected
    assert [r["line"] for r in expected] == list(range(1, 9))




def test_a_run_of_rows_in_memory_resumes_and_refuses_other_rows(tiny_model, reference, tmp_path, monkeypatch):
    train, dev = sentiment_rows(16), datasets.Dataset.from_list(sentiment_rows(8))
    out = tmp_path / "run"
    stopped_after(monkeypatch, 5, lambda: finetune(model=str(tiny_model), train=train, dev=dev, out=str(out),
                                                   save_every=2, **RUN))
    other = [dict(r, label="neg" if r["label"] == "pos" else "pos") for r in train]  # the same count, other rows
    with pytest.raises(BertforgeError, match=r"--resume with settings that differ.*train: '<in-memory: 16 rows"):
        finetune(model=str(tiny_model), train=other, dev=dev, out=str(out), save_every=2, resume=True, **RUN)
    finetune(model=str(tiny_model), train=train, dev=dev, out=str(out), save_every=2, resume=True, **RUN)
    same_weights(reference[1], out)
    replay = FinetuneConfig.from_json(out / "finetune_config.json")
    with pytest.raises(BertforgeError, match="cannot be replayed from its settings file; pass the data again"):
        finetune(dataclasses.replace(replay, out=str(tmp_path / "replay")))


# ---------------------------------------------------------------------------------------------------- NER and QA
# A fine-tune from rows (in memory, Parquet) equals the one from the task's text format: CoNLL, SQuAD JSON.

NER_QA = {"ner": dict(max_length=16), "qa": dict(max_length=32, doc_stride=16, max_query_length=12)}


def ner_qa_files(root: Path, task: str) -> tuple[Path, list[dict]]:
    """The task's text-format file and the same examples as rows in the `datasets` layout."""
    from .conftest import write_conll, write_squad
    from .test_squad import flat_rows
    from .test_tagged import ner_rows

    if task == "ner":
        return write_conll(root / "ner.txt"), ner_rows()
    path = write_squad(root / "squad.json")
    return path, flat_rows(path)


@pytest.fixture(scope="module", params=["ner", "qa"])
def text_format_run(request, tiny_model, tmp_path_factory) -> tuple[str, Path, list[dict], dict, Path]:
    task = request.param
    root = tmp_path_factory.mktemp(task)
    path, rows = ner_qa_files(root, task)
    settings = dict(RUN, task=task, epochs=1, **NER_QA[task])
    out = root / "run"
    summary = finetune(model=str(tiny_model), train=str(path), dev=str(path), out=str(out), **settings)
    return task, path, rows, summary, out


@pytest.mark.parametrize("form", ["list of dicts", "dataset", "parquet"])
def test_a_ner_or_qa_fine_tune_from_rows_equals_the_one_from_its_text_format(tiny_model, text_format_run, tmp_path,
                                                                             form):
    task, _, rows, expected, reference_out = text_format_run
    data: object = {"list of dicts": rows, "dataset": datasets.Dataset.from_list(rows)}.get(form)
    if form == "parquet":
        data = str(tmp_path / "rows.parquet")
        pq.write_table(pa.Table.from_pylist(rows), data, row_group_size=5)
    out = tmp_path / "run"
    summary = finetune(model=str(tiny_model), train=data, dev=data, out=str(out),
                       **dict(RUN, task=task, epochs=1, **NER_QA[task]))
    assert summary["metrics"] == expected["metrics"] and summary["train_steps"] == expected["train_steps"] > 0
    same_weights(reference_out, out)


def test_ner_and_qa_evaluate_and_predict_take_rows(text_format_run):
    task, path, rows, _, out = text_format_run
    options = dict(device="cpu", progress=False, **NER_QA[task])
    from_file = evaluate(task, out / "model", path, **options)
    assert evaluate(task, out / "model", rows, **options) == from_file
    assert evaluate(task, out / "model", datasets.Dataset.from_list(rows), **options) == from_file
    expected = predict(task, out / "model", path, **options)
    if task == "ner":  # without tags; records name the row instead of the line
        unlabelled = [{"tokens": r["tokens"]} for r in rows]
        got = predict(task, out / "model", unlabelled, **options)
        assert [{k: v for k, v in r.items() if k != "line"} for r in got] == [
            {k: v for k, v in r.items() if k != "line"} for r in expected]
        assert [r["line"] for r in got] == list(range(2, 14))  # row 1 is -DOCSTART-
    else:  # answers are not needed to predict
        got = predict(task, out / "model", rows, **options)
        assert got == expected and len(got) == 12
