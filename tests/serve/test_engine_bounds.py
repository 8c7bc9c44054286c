"""Tests of the character bound of `Engine.tokenize`: an input past `max_input_chars` characters is refused (TEI's 422)
or cut before any tokenizing, so a long string costs what the model reads."""

from __future__ import annotations

import numpy as np
import pytest

import bertforge
from bertforge.serve import ServeConfig
from tests.serve.serve_helpers import ThreadServer

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")


def test_a_long_string_is_never_tokenized_whole(guarded_server, models, monkeypatch):
    pipe = guarded_server.engine.pipelines["embed"]
    seen: list[int] = []

    def featurize(inputs):
        seen.extend(len(text) for text in inputs)
        return type(pipe).featurize(pipe, inputs)

    monkeypatch.setattr(pipe, "featurize", featurize)
    text = "the movie was good and " * 10_000  # 230,000 characters; the tiny model reads 64 tokens
    limit = guarded_server.engine.max_chars
    assert limit == 16 * 64 < len(text)

    r = guarded_server.client.post("/embed", json={"inputs": ["good", text], "truncate": False})
    assert r.status_code == 422, r.text
    assert r.json()["error"] == (f"`inputs` must have less than {limit} characters. Given: {len(text)} (input 1; "
                                 "--max-input-chars, for the 64 tokens this model takes); shorten it, or send "
                                 '"truncate": true to cut it')
    assert seen == []  # refused before any tokenizing

    r = guarded_server.client.post("/embed", json={"inputs": ["good", text]})  # --auto-truncate: on
    assert r.status_code == 200, r.text
    assert seen == [4, limit]  # cut to the bound before tokenizing
    full = bertforge.pipeline("embed", model=models["embed"], normalize=True)(["good", text])  # the whole text, cut
    np.testing.assert_allclose(np.array(r.json(), dtype=np.float32), full, rtol=0, atol=1e-5)


def test_an_explicit_character_bound_and_pairs(models):
    with ThreadServer(ServeConfig(model=str(models["rerank"]), max_input_chars=40)) as s:
        assert s.client.get("/info").json()["max_input_chars"] == 40
        r = s.client.post("/rerank", json={"query": "q" * 41, "texts": ["good"], "truncate": False})
        assert r.status_code == 422 and "Given: 41 (input 0" in r.json()["error"], r.text
        r = s.client.post("/predict", json={"inputs": [["good", "bad " * 11]], "truncate": True})
        assert r.status_code == 200, r.text
