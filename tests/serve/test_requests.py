"""Tests of `bertforge.serve.requests`: malformed bodies and wrong fields get a 4xx JSON error naming the
problem, and do not hurt the server."""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")


BAD = [
    ("/embed", b"not json", 400, "not valid JSON"),
    ("/embed", b'{"inputs": ["a"', 400, "not valid JSON"),
    ("/embed", b"\xff\xfe\x00garbage", 400, "not valid JSON"),
    ("/embed", b"[1, 2]", 422, "JSON object"),
    ("/embed", b"{}", 422, 'missing "inputs"'),
    ("/embed", b'{"inputs": 3}', 422, "a string, an array of token ids"),
    ("/embed", b'{"inputs": []}', 400, "`inputs` cannot be empty"),
    ("/embed", b'{"inputs": ["a", null]}', 422, '"inputs"[1] must be a string'),
    ("/embed", b'{"inputs": [[]]}', 400, "`inputs`[0] cannot be empty"),
    ("/embed", b'{"inputs": [1, 100000]}', 422, "token id 100000 is not in this model's vocabulary"),
    ("/embed", b'{"inputs": "a", "normalize": "yes"}', 422, '"normalize" must be true or false'),
    ("/embed", b'{"inputs": ["a", "b", "c", "d", "e", "f", "g", "h", "i"]}', 422,
     "batch size 9 > maximum allowed batch size 8"),
    ("/embed", b'{"inputs": "' + b"a " * 3000 + b'"}', 413, "larger than 4096 bytes"),
    ("/embed", b"[" * 2000 + b"]" * 2000, 400, "not valid JSON"),  # too deep for the parser: still a 4xx
    ("/embed", b'{"inputs": "a", "dimensions": 0}', 422, '"dimensions" must be an integer in 1..32'),
    ("/embed", b'{"inputs": "a", "dimensions": true}', 422, '"dimensions" must be an integer'),
    ("/v1/embeddings", b'{"input": [[1, 2, 3.5]]}', 422, "token ids"),
    ("/v1/embeddings", b'{"input": "a", "encoding_format": "int8"}', 422, "encoding_format"),
    ("/v1/embeddings", b'{"input": "a", "dimensions": 33}', 422, "dimensions"),
    ("/v1/embeddings", b'{"input": "a", "model": 7}', 422, '"model" must be a string'),
    ("/predict", b'{"inputs": "a"}', 424, "Model is not a classifier model"),
    ("/nowhere", b"{}", 404, "Not Found"),
]


@pytest.mark.parametrize("path,body,status,message", BAD, ids=[f"{p} {s} {m}" for p, _, s, m in BAD])
def test_bad_requests_get_4xx_json(embed_server, path, body, status, message):
    r = embed_server.client.post(path, content=body)
    assert r.status_code == status
    error = r.json()["message"] if path.startswith("/v1/") else r.json()["error"]  # TEI's flat OpenAI shape there
    assert message in error


def test_bad_requests_do_not_hurt_the_server(embed_server):
    for path, body, _, _ in BAD:
        embed_server.client.post(path, content=body)
    assert embed_server.client.get("/embed").status_code == 405
    assert embed_server.client.post("/embed", json={"inputs": "still here"}).status_code == 200
    assert embed_server.client.get("/health").json()["status"] == "ok"


def test_predict_bad_inputs(classify_server):
    for body, message in [({"inputs": [["a", "b", "c"]]}, '["text", "text_pair"]'),
                          ({"inputs": [["a", 1]]}, '["text", "text_pair"]'),
                          ({"inputs": ["a", "b", "c"]}, "one input of one or two texts, got 3"),
                          ({"query": 1, "texts": ["a"]}, '"query" must be a string')]:
        path = "/rerank" if "query" in body else "/predict"
        r = classify_server.client.post(path, json=body)
        assert r.status_code == 422 and message in r.json()["error"], r.text
