"""Tests of `bertforge.serve.handlers`: each route's answers against the pipelines' own, over HTTP
(text-embeddings-inference's /embed, /predict, /rerank and OpenAI's /v1/embeddings, with its client)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

import bertforge
from tests.serve.serve_helpers import LONG, SENTENCES, TIMEOUT

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")


def test_embed_returns_the_pipelines_vectors(embed_server, models):
    pipe = bertforge.pipeline("embed", model=models["embed"], normalize=True)
    raw = bertforge.pipeline("embed", model=models["embed"], normalize=False)
    r = embed_server.client.post("/embed", json={"inputs": SENTENCES})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    np.testing.assert_allclose(np.array(r.json(), dtype=np.float32), pipe(SENTENCES), rtol=0, atol=1e-5)
    r = embed_server.client.post("/embed", json={"inputs": SENTENCES[0], "normalize": False})
    assert len(r.json()) == 1  # one string: still a list of vectors, as text-embeddings-inference answers
    np.testing.assert_allclose(np.array(r.json()[0], dtype=np.float32), raw(SENTENCES[0]), rtol=0, atol=1e-5)
    assert abs(np.linalg.norm(r.json()[0]) - 1) > 1e-3  # really not normalised


def test_embed_dimensions_cut_then_normalise(embed_server, models):
    """TEI's "dimensions" (a Matryoshka model's smaller vectors): the first N numbers, normalised after the cut."""
    raw = bertforge.pipeline("embed", model=models["embed"], normalize=False)(SENTENCES[:2])[:, :8]
    r = embed_server.client.post("/embed", json={"inputs": SENTENCES[:2], "dimensions": 8})
    got = np.array(r.json(), dtype=np.float32)
    assert got.shape == (2, 8)
    np.testing.assert_allclose(got, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=0, atol=1e-5)
    r = embed_server.client.post("/embed", json={"inputs": SENTENCES[:2], "dimensions": 8, "normalize": False})
    np.testing.assert_allclose(np.array(r.json(), dtype=np.float32), raw, rtol=0, atol=1e-5)


def test_truncate(embed_server, models):
    """TEI's rule: --auto-truncate (on by default) cuts; "truncate": false refuses with 422 Validation."""
    r = embed_server.client.post("/embed", json={"inputs": ["good", LONG], "truncate": False})
    assert r.status_code == 422 and r.json()["error_type"] == "Validation"
    assert "`inputs` must have less than 64 tokens. Given: 102 (input 1)" in r.json()["error"]
    r = embed_server.client.post("/embed", json={"inputs": ["good", LONG]})
    assert r.status_code == 200
    pipe = bertforge.pipeline("embed", model=models["embed"], normalize=True)
    np.testing.assert_allclose(np.array(r.json(), dtype=np.float32), pipe(["good", LONG]), rtol=0, atol=1e-5)


def test_openai_embeddings(embed_server, models):
    pipe = bertforge.pipeline("embed", model=models["embed"], normalize=True)  # /v1: always normalised (TEI)
    r = embed_server.client.post("/v1/embeddings", json={"input": SENTENCES[:3], "model": "anything"})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and body["model"] == "embed"
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and {d["object"] for d in body["data"]} == {"embedding"}
    np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]], dtype=np.float32),
                               pipe(SENTENCES[:3]), rtol=0, atol=1e-5)
    tokens = sum(len(ids) for ids in pipe.tokenizer(SENTENCES[:3])["input_ids"])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}

    r = embed_server.client.post("/v1/embeddings", json={"input": "good", "encoding_format": "base64",
                                                         "dimensions": 8})
    row = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    cut = bertforge.pipeline("embed", model=models["embed"], normalize=False)("good")[:8]
    np.testing.assert_allclose(row, cut / np.linalg.norm(cut), rtol=0, atol=1e-5)


def test_the_openai_client_works_unchanged(embed_server, models):
    openai = pytest.importorskip("openai", reason="needs openai: pip install -e '.[test]'")
    client = openai.OpenAI(base_url=embed_server.url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    result = client.embeddings.create(input=SENTENCES[:2], model="embed")  # the client asks for base64 by default
    pipe = bertforge.pipeline("embed", model=models["embed"], normalize=True)
    np.testing.assert_allclose(np.array([d.embedding for d in result.data], dtype=np.float32), pipe(SENTENCES[:2]),
                               rtol=0, atol=1e-5)
    assert result.usage.prompt_tokens > 0
    with pytest.raises(openai.BadRequestError, match="cannot be empty"):  # TEI's 400 Empty reaches its exceptions
        client.embeddings.create(input=[], model="embed")


def test_predict_and_rerank(classify_server, models):
    probs = bertforge.pipeline("text-classification", model=models["classify"], top_k=None)
    logits = bertforge.pipeline("text-classification", model=models["classify"], top_k=None, function_to_apply="none")
    client = classify_server.client

    def close(got, want):
        assert [x["label"] for x in got] == [x["label"] for x in want]
        np.testing.assert_allclose([x["score"] for x in got], [x["score"] for x in want], rtol=0, atol=1e-5)

    r = client.post("/predict", json={"inputs": "the movie was good"})
    assert r.status_code == 200
    close(r.json(), probs("the movie was good"))
    r = client.post("/predict", json={"inputs": [["bad"], ["the film", "was great"]], "raw_scores": True})
    for got, want in zip(r.json(), logits(["bad", ("the film", "was great")]), strict=True):
        close(got, want)

    # TEI's /predict input forms: ["a", "b"] is one pair; [["a"], ["b", "c"]] a batch of a text and a pair
    r = client.post("/predict", json={"inputs": ["the film", "was great"]})
    close(r.json(), probs([("the film", "was great")])[0])
    r = client.post("/predict", json={"inputs": [["bad"], ["the film", "was great"]]})
    assert client.post("/predict", json={"inputs": ["bad", ["the film", "was great"]]}).status_code == 422
    for got, want in zip(r.json(), probs(["bad", ("the film", "was great")]), strict=True):
        close(got, want)

    # each server serves its own kind of model, and says so with TEI's 424
    r = client.post("/embed", json={"inputs": "x"})
    assert r.status_code == 424 and r.json()["error_type"] == "Backend"
    assert "Model is not an embedding model" in r.json()["error"]
    r = client.post("/rerank", json={"query": "q", "texts": ["a"]})  # two labels: a classifier, not a re-ranker
    assert r.status_code == 424 and "model is not a re-ranker model" in r.json()["error"]


def test_rerank(rerank_server, models):
    client = rerank_server.client
    probs = bertforge.pipeline("text-classification", model=models["rerank"], top_k=None)
    texts = ["great fun", "awful", "the plot", "good good good", "bad movie"]
    r = client.post("/rerank", json={"query": "is it good ?", "texts": texts, "return_text": True})
    assert r.status_code == 200
    ranked = r.json()
    want = [labels[0]["score"] for labels in probs([("is it good ?", t) for t in texts])]  # sigmoid of one logit
    assert sorted(e["index"] for e in ranked) == list(range(len(texts)))
    assert [e["index"] for e in ranked] == sorted(range(len(texts)), key=lambda i: -want[i])
    for e in ranked:
        assert e["text"] == texts[e["index"]] and abs(e["score"] - want[e["index"]]) < 1e-5
    assert len(set(round(w, 3) for w in want)) > 1  # the order means something

    # /rerank is the rerank pipeline's ranking (raw_scores: its logits), 422 past the model's length with
    # "truncate": false
    rerank = bertforge.pipeline("rerank", model=models["rerank"], activation="none")
    r = client.post("/rerank", json={"query": "is it good ?", "texts": texts, "raw_scores": True})
    want = rerank("is it good ?", texts)
    assert [e["index"] for e in r.json()] == [e["corpus_id"] for e in want]
    np.testing.assert_allclose([e["score"] for e in r.json()], [e["score"] for e in want], rtol=0, atol=1e-5)
    r = client.post("/rerank", json={"query": "is it good ?", "texts": ["good", LONG], "truncate": False})
    assert r.status_code == 422 and "Given: 107 (input 1)" in r.json()["error"]
    r = client.post("/rerank", json={"query": "is it good ?", "texts": ["good", LONG]})
    assert r.status_code == 200 and sorted(e["index"] for e in r.json()) == [0, 1]
    r = client.post("/rerank", json={"query": "q", "texts": []})
    assert r.status_code == 400 and r.json() == {"error": "`texts` cannot be empty", "error_type": "Empty"}
    assert client.post("/predict", json={"inputs": "good"}).json()[0]["label"] == "LABEL_0"  # TEI: predict too


def test_teis_compute_headers(embed_server, models):
    """TEI's headers on a model route's answer: what it computed (characters, tokens, where) and its times."""
    r = embed_server.client.post("/embed", json={"inputs": ["the movie was good", "bad"]})
    tokens = sum(len(ids) for ids in bertforge.pipeline("embed", model=models["embed"]).tokenizer(
        ["the movie was good", "bad"])["input_ids"])
    assert (r.headers["x-compute-type"], r.headers["x-compute-characters"], r.headers["x-compute-tokens"]) == (
        "cpu", "21", str(tokens))
    times = {k: int(r.headers[k]) for k in ("x-total-time", "x-compute-time", "x-tokenization-time", "x-queue-time",
                                            "x-inference-time")}
    assert all(v >= 0 for v in times.values()) and times["x-total-time"] >= times["x-inference-time"]
    assert "x-compute-tokens" not in embed_server.client.get("/info").headers
