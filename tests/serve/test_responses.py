"""Tests of `bertforge.serve.responses`: float32 vectors written as JSON read back as the same float32, with
orjson or without it."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

from tests.serve.serve_helpers import SENTENCES

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")


def test_json_floats_read_back_as_the_same_float32():
    from bertforge.serve import _json_floats

    rng = np.random.default_rng(0)
    rows = np.concatenate([
        rng.standard_normal((64, 96)) * 10.0 ** rng.integers(-8, 8, (64, 1)),
        [[0.0, -0.0, 1e-45, -3e38, 3.4028235e38, 1.1754944e-38, 1e-30, 0.1, 1 / 3, 123456789.0] + [1.0] * 86],
    ]).astype(np.float32)
    text = json.dumps(_json_floats(rows).tolist())
    np.testing.assert_array_equal(np.array(json.loads(text), dtype=np.float32), rows)  # bit for bit
    text = json.dumps(_json_floats(rows[:64]).tolist())  # magnitudes 1e-9..1e8 (past 1e±22 they print in full)
    digits = [len(n.lstrip("-").split("e")[0].replace(".", "").strip("0")) for n in re.findall(r"[-0-9.e+]+", text)]
    assert max(digits) <= 9  # not the 17 digits of a float32 widened to float64


@pytest.mark.parametrize("with_orjson", [True, False])
def test_vectors_json_reads_back_as_the_same_float32_with_or_without_orjson(with_orjson, monkeypatch):
    from bertforge.serve import vectors_json

    if with_orjson:
        pytest.importorskip("orjson")
    else:
        monkeypatch.setitem(sys.modules, "orjson", None)  # `import orjson` fails: the json fallback
    rng = np.random.default_rng(1)
    rows = np.concatenate([rng.standard_normal((8, 16)) * 10.0 ** rng.integers(-8, 8, (8, 1)),
                           [[0.0, -0.0, 1e-45, -3e38, 3.4028235e38, 1e-30, 0.1, 1 / 3] + [1.0] * 8]]).astype(np.float32)
    body = vectors_json(rows)
    assert isinstance(body, bytes)
    np.testing.assert_array_equal(np.array(json.loads(body), dtype=np.float32), rows)  # bit for bit
    with pytest.raises(ValueError, match="non-finite"):
        vectors_json(np.array([[1.0, np.nan]], dtype=np.float32))


def test_openai_embeddings_are_the_same_floats_with_or_without_orjson(embed_server, monkeypatch):
    request = {"input": SENTENCES[:3], "model": "embed"}
    fast = embed_server.client.post("/v1/embeddings", json=request)
    monkeypatch.setitem(sys.modules, "orjson", None)  # `import orjson` fails: the json fallback
    slow = embed_server.client.post("/v1/embeddings", json=request)
    assert fast.status_code == slow.status_code == 200
    assert fast.content != slow.content  # two writers (orjson's shortest decimals, json's 9 digits)...
    a, b = fast.json(), slow.json()
    rows = [np.array([d["embedding"] for d in body["data"]], dtype=np.float32) for body in (a, b)]
    np.testing.assert_array_equal(rows[0], rows[1])  # ...the same float32 values, bit for bit
    assert {k: v for k, v in a.items() if k != "data"} == {k: v for k, v in b.items() if k != "data"}


def test_json_bytes_falls_back_to_json_for_what_orjson_refuses():
    from bertforge.serve import json_bytes

    data = {"model": "name-\udcff", "embedding": np.array([0.1, -2.5e-7], dtype=np.float32), "index": 0}
    body = json.loads(json_bytes(data))  # orjson refuses the lone surrogate; json escapes it
    assert body["model"] == "name-\udcff" and body["index"] == 0
    np.testing.assert_array_equal(np.array(body["embedding"], dtype=np.float32), data["embedding"])
