"""`train_embeddings` from a Parquet file or from rows in memory (a list of dicts, a `datasets.Dataset`) trains what
the same rows in a TSV file train, bit for bit, and records rows in memory as a description."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from bertforge.embeddings_train import train_embeddings
from tests.embeddings_train.embeddings_train_helpers import DEV_TEMPLATES, TRAIN_TEMPLATES, pairs

pa = pytest.importorskip("pyarrow")
datasets = pytest.importorskip("datasets")
import pyarrow.parquet as pq  # noqa: E402

@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: faster than two busy cores for a model this small."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


RUN = dict(epochs=1, batch_size=16, lr=1e-3, seed=1, max_length=16, pooling="mean", device="cpu", progress=False)


def test_every_form_of_the_rows_trains_the_same_model(tiny, toy, tmp_path):
    train = [{"anchor": a, "positive": p} for a, p in pairs(TRAIN_TEMPLATES)]
    dev = [{"anchor": a, "positive": p} for a, p in pairs(DEV_TEMPLATES)]
    pq.write_table(pa.Table.from_pylist(train), tmp_path / "train.parquet", row_group_size=10)
    runs = {
        "tsv": (toy[0], toy[1]),
        "parquet": (tmp_path / "train.parquet", toy[1]),
        "rows": (train, datasets.Dataset.from_list(dev)),
    }
    summaries, weights = {}, {}
    for name, (train_data, dev_data) in runs.items():
        out = tmp_path / name
        train_data = str(train_data) if not isinstance(train_data, list) else train_data
        dev_data = dev_data if isinstance(dev_data, datasets.Dataset) else str(dev_data)
        summaries[name] = train_embeddings(model=str(tiny), train=train_data, dev=dev_data, out=str(out), **RUN)
        weights[name] = load_file(str(out / "model.safetensors"))
    for name in ("parquet", "rows"):
        assert summaries[name]["best"] == summaries["tsv"]["best"] and summaries[name]["before"] == summaries["tsv"]["before"]
        assert all(torch.equal(weights[name][k], weights["tsv"][k]) for k in weights["tsv"]), name
    saved = json.loads((tmp_path / "rows" / "train_embeddings_config.json").read_text())
    assert saved["train"].startswith("<in-memory: 64 rows, sha256 ") and saved["dev"].startswith("<in-memory: 16 rows")
