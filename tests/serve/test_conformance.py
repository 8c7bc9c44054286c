"""Conformance with text-embeddings-inference 1.9: every route's success and error bodies validated against TEI's
own OpenAPI document (`tests/serve/data/tei-openapi-v1.9.3.json`, its source and commit in that folder's
README), and request cases replayed from TEI's own tests and quick tour with their statuses and shapes (the server's
own OpenAPI document is checked against TEI's in `test_openapi.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertforge.serve import ServeConfig
from tests.serve.serve_helpers import LONG, ThreadServer

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")
jsonschema = pytest.importorskip("jsonschema", reason="needs jsonschema: pip install -e '.[test]'")

TEI = json.loads((Path(__file__).parent / "data" / "tei-openapi-v1.9.3.json").read_text())


def _json_schema(node):
    """OpenAPI 3.0's schema dialect as JSON Schema: `nullable: true` → null allowed too."""
    if isinstance(node, list):
        return [_json_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items() if k not in ("nullable", "example", "default")}
    if node.get("nullable"):
        return {"anyOf": [out, {"type": "null"}]}
    return out


COMPONENTS = _json_schema(TEI["components"])


def validate(body, schema_name: str) -> None:
    """`body` against TEI's component `schema_name` (its $refs resolved within TEI's document)."""
    jsonschema.validate(body, {"$ref": f"#/components/schemas/{schema_name}", "components": COMPONENTS})


def tei_schema(path: str, status: int) -> str | None:
    """The schema TEI's document gives `path`'s answer with `status` (None: a body it does not describe)."""
    responses = TEI["paths"][path]["post" if "post" in TEI["paths"][path] else "get"]["responses"]
    content = responses.get(str(status), {}).get("content", {}).get("application/json")
    if content is None:
        return None
    return content["schema"]["$ref"].rsplit("/", 1)[-1]


def check(client, path: str, body, status: int, schema: str | None = None):
    """POST (or GET, body None) `path`: `status`, and the answer valid against TEI's schema for it."""
    r = client.get(path) if body is None else client.post(path, json=body)
    assert r.status_code == status, (path, body, r.text[:300])
    schema = schema or tei_schema(path, status) or ("ErrorResponse" if status >= 400 else None)
    answer = r.json()
    if path.startswith("/v1/") and status >= 400:
        # TEI's document names the field `error_type`, its source serialises it as "type" (the source wins)
        assert "error_type" not in answer
        answer = dict(answer, error_type=answer.pop("type"))
        schema = "OpenAICompatErrorResponse"
    if schema is not None:
        validate(answer, schema)
    return answer


SUCCESS = [  # (server, path, body, schema where TEI's document names none for the route)
    ("embed", "/embed", {"inputs": "What is Deep Learning?"}, None),
    ("embed", "/embed", {"inputs": ["Today is a nice day", "I like you"]}, None),
    ("embed", "/embed", {"inputs": [2, 7, 3]}, None),  # token ids: one input
    ("embed", "/embed", {"inputs": [[2, 7, 3], "a text"], "normalize": False, "dimensions": 8}, None),
    ("embed", "/embed", {"inputs": "x", "truncate": None, "prompt_name": None, "truncation_direction": "Left"}, None),
    ("embed", "/embed_all", {"inputs": ["good", [2, 5, 3]]}, None),
    ("embed", "/similarity", {"inputs": {"source_sentence": "good", "sentences": ["bad", "fun"]},
                              "parameters": None}, None),
    ("embed", "/tokenize", {"inputs": ["The café", ""], "add_special_tokens": True}, None),
    ("embed", "/decode", {"ids": [[2, 7, 3], [5]]}, None),
    ("embed", "/v1/embeddings", {"input": "What is Deep Learning?", "model": "text-embeddings-inference",
                                 "encoding_format": "float"}, None),
    ("embed", "/v1/embeddings", {"input": [[2, 7, 3]], "model": None, "encoding_format": "base64",
                                 "user": "me"}, None),
    ("embed", "/info", None, None),
    ("classify", "/predict", {"inputs": "I like you."}, None),
    ("classify", "/predict", {"inputs": [["I like you."], ["I hate pineapples"]]}, None),
    ("classify", "/predict", {"inputs": ["a text", "its pair"], "raw_scores": True}, None),
    ("classify", "/info", None, None),
    ("rerank", "/rerank", {"query": "What is Deep Learning?", "texts": ["Deep Learning is not...",
                                                                       "Deep learning is..."], "raw_scores": False},
     None),
    ("rerank", "/rerank", {"query": "q", "texts": ["a", "b"], "return_text": True}, None),
    ("rerank", "/info", None, None),
    ("mlm", "/embed_sparse", {"inputs": "I like you."}, None),
    ("mlm", "/info", None, None),
]

ERRORS = [  # (server, path, body, status, TEI's error type)
    ("embed", "/embed", {"inputs": []}, 400, "Empty"),
    ("embed", "/embed", {"inputs": ["x"] * 9}, 422, "Validation"),
    ("embed", "/embed", {"inputs": LONG, "truncate": False}, 422, "Validation"),
    ("embed", "/embed", {"inputs": "x", "prompt_name": "query"}, 422, "Validation"),
    ("embed", "/embed", {"inputs": "x" * 5000}, 413, "Validation"),  # past --payload-limit (4096 here)
    ("embed", "/embed_all", {"inputs": []}, 400, "Empty"),
    ("embed", "/embed_sparse", {"inputs": "x"}, 424, "Backend"),
    ("embed", "/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, 400, "Empty"),
    ("embed", "/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"] * 8}}, 422, "Validation"),
    ("embed", "/tokenize", {"inputs": []}, 400, "Empty"),
    ("embed", "/decode", {"ids": []}, 400, "Empty"),
    ("embed", "/decode", {"ids": [[1]] * 9}, 422, "Validation"),
    ("embed", "/predict", {"inputs": "x"}, 424, "Backend"),
    ("embed", "/rerank", {"query": "q", "texts": ["a"]}, 424, "Backend"),
    ("embed", "/v1/embeddings", {"input": []}, 400, "Empty"),
    ("embed", "/v1/embeddings", {"input": ["x"] * 9}, 422, "Validation"),
    ("embed", "/v1/embeddings", {"input": "x", "encoding_format": "int8"}, 422, "Validation"),
    ("classify", "/predict", {"inputs": []}, 400, "Empty"),
    ("classify", "/predict", {"inputs": ["a", "b", "c"]}, 422, "Validation"),
    ("classify", "/rerank", {"query": "q", "texts": ["a"]}, 424, "Backend"),  # two labels: not a re-ranker
    ("classify", "/embed", {"inputs": "x"}, 424, "Backend"),
    ("classify", "/v1/embeddings", {"input": "x"}, 424, "Backend"),
    ("rerank", "/rerank", {"query": "q", "texts": []}, 400, "Empty"),
    ("rerank", "/rerank", {"query": "q", "texts": ["a"] * 33}, 422, "Validation"),  # TEI's default: 32
    ("mlm", "/embed_sparse", {"inputs": []}, 400, "Empty"),
    ("mlm", "/embed_all", {"inputs": "x"}, 424, "Backend"),  # `embed_all` is not available for SPLADE models
]


@pytest.fixture(scope="module")
def servers(models):
    configs = {"embed": ServeConfig(model=str(models["embed"]), max_client_batch_size=8, max_body_bytes=4096),
               "classify": ServeConfig(model=str(models["classify"])),
               "rerank": ServeConfig(model=str(models["rerank"])),
               "mlm": ServeConfig(model=str(models["mlm"]), pooling="splade")}
    started = {name: ThreadServer(config) for name, config in configs.items()}
    try:
        for server in started.values():
            server.__enter__()
        yield {name: server.client for name, server in started.items()}
    finally:
        for server in started.values():
            if hasattr(server, "client"):
                server.__exit__(None, None, None)


@pytest.mark.parametrize("server,path,body,schema", SUCCESS, ids=[f"{s} {p} {i}" for i, (s, p, _, _) in
                                                                  enumerate(SUCCESS)])
def test_every_success_body_is_valid_against_teis_document(servers, server, path, body, schema):
    check(servers[server], path, body, 200, schema)


@pytest.mark.parametrize("server,path,body,status,kind", ERRORS, ids=[f"{s} {p} {st} {i}" for i, (s, p, _, st, _)
                                                                      in enumerate(ERRORS)])
def test_every_error_body_is_teis_with_its_status_and_type(servers, server, path, body, status, kind):
    answer = check(servers[server], path, body, status)
    assert answer["error_type"] == kind and "\n" not in answer.get("error", answer.get("message"))


def test_the_routes_tei_does_not_document_answer_its_shapes(servers, monkeypatch):
    """/vertex (TEI's `google` build), POST / and /invocations (the model's own route), GET / and /ping."""
    embed, classify, rerank = servers["embed"], servers["classify"], servers["rerank"]
    r = embed.post("/vertex", json={"instances": [{"inputs": "good"}, {"inputs": ["a", "b"], "normalize": False}]})
    assert r.status_code == 200 and len(r.json()["predictions"]) == 2
    for prediction in r.json()["predictions"]:
        validate(prediction, "EmbedResponse")
    r = rerank.post("/vertex", json={"instances": [{"query": "q", "texts": ["a", "b"]}, {"inputs": "x"}]})
    validate(r.json()["predictions"][0], "RerankResponse")
    validate(r.json()["predictions"][1], "PredictResponse")
    check(embed, "/vertex", {"instances": [{"inputs": []}]}, 400, "ErrorResponse")
    assert embed.post("/vertex", json={"instances": [{}] * 9}).status_code == 422
    # POST / is the model kind's route (TEI's rule): /embed, /predict for a classifier, /rerank for a reranker
    validate(embed.post("/", json={"inputs": "good"}).json(), "EmbedResponse")
    validate(classify.post("/invocations", json={"inputs": "good"}).json(), "PredictResponse")
    validate(rerank.post("/", json={"query": "q", "texts": ["a", "b"]}).json(), "RerankResponse")
    validate(servers["mlm"].post("/", json={"inputs": "good"}).json(), "EmbedSparseResponse")
    monkeypatch.setenv("TASK", "sentence-similarity")  # TEI's $TASK: POST / is /similarity
    r = embed.post("/", json={"inputs": {"source_sentence": "good", "sentences": ["bad"]}})
    assert r.status_code == 200
    validate(r.json(), "SimilarityResponse")
    monkeypatch.delenv("TASK")
    for probe in ("/", "/ping", "/health"):
        assert embed.get(probe).status_code == 200


def test_info_is_teis_info_with_the_model_type_of_each_kind(servers):
    info = {name: check(client, "/info", None, 200) for name, client in servers.items()}
    assert info["embed"]["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["mlm"]["model_type"] == {"embedding": {"pooling": "splade"}}
    assert info["classify"]["model_type"] == {"classifier": {"id2label": {"0": "neg", "1": "pos"},
                                                             "label2id": {"neg": 0, "pos": 1}}}
    assert list(info["rerank"]["model_type"]) == ["reranker"]
    assert info["classify"]["max_client_batch_size"] == 32 and info["classify"]["max_batch_tokens"] == 16384
    assert info["classify"]["auto_truncate"] is True and info["embed"]["model_dtype"] == "float32"
    assert info["embed"]["served_model_name"] == "embed" and info["embed"]["version"]


# ------------------------------------------------------------------ TEI's own test cases, replayed
def test_teis_mrl_embeddings_case(servers):
    """router/tests/test_http_embed.rs, `test_mrl_embeddings`: "dimensions" cuts the vectors (there 128 of 384;
    here 8 of 32), one input and a batch of three identical ones give the same rows."""
    client = servers["embed"]
    single = check(client, "/embed", {"inputs": "test", "dimensions": 8}, 200)
    batch = check(client, "/embed", {"inputs": ["test", "test", "test"], "dimensions": 8}, 200)
    assert np.array(single).shape == (1, 8) and np.array(batch).shape == (3, 8)
    for row in batch:
        np.testing.assert_allclose(row, single[0], rtol=0, atol=1e-6)


def test_teis_predict_case(servers):
    """router/tests/test_http_predict.rs, `test_predict`: one input gives a list of {score, label}; a batch of five
    [["test"]] gives five lists, each the single one."""
    client = servers["classify"]
    single = check(client, "/predict", {"inputs": "test"}, 200)
    batch = check(client, "/predict", {"inputs": [["test"]] * 5}, 200)
    assert len(batch) == 5 and {p["label"] for p in single} == {"neg", "pos"}
    assert single == sorted(single, key=lambda p: -p["score"])  # best first
    for predictions in batch:
        assert [p["label"] for p in predictions] == [p["label"] for p in single]
        np.testing.assert_allclose([p["score"] for p in predictions], [p["score"] for p in single], atol=1e-6)


def test_teis_rerank_case(servers):
    """router/tests/test_http_rerank.rs, `test_rerank`: texts ["test", "other", "test"] for the query "test",
    return_text: the two identical texts tie, and TEI ranks the later one first (index 2, then 0)."""
    ranks = check(servers["rerank"], "/rerank", {"query": "test", "texts": ["test", "other", "test"],
                                                 "return_text": True}, 200)
    if ranks[0]["score"] != ranks[1]["score"]:  # "other" scores higher under this random model: the tie is after it
        ranks = [r for r in ranks if r["text"] == "test"]
    assert [r["index"] for r in ranks[:2]] == [2, 0] and ranks[0]["score"] == ranks[1]["score"]
    assert all(r["text"] == ["test", "other", "test"][r["index"]] for r in ranks)


def test_teis_quick_tour_and_gaudi_cases(servers):
    """integration_tests/gaudi/test_embed.py posts {"inputs": "What is Deep Learning?"} and reads one vector; the
    quick tour (docs/source/en/quick_tour.md) the other requests of SUCCESS above."""
    vectors = check(servers["embed"], "/embed", {"inputs": "What is Deep Learning?"}, 200)
    assert np.array(vectors).shape == (1, 32) and abs(np.linalg.norm(vectors[0]) - 1) < 1e-5


def test_the_huggingface_hub_client_through_teis_routes(servers, monkeypatch):
    """huggingface_hub's InferenceClient as it calls TEI: text classification on a classifier's /predict, and
    sentence similarity on POST / where $TASK is sentence-similarity (how Inference Endpoints run TEI)."""
    hub = pytest.importorskip("huggingface_hub")
    client = hub.InferenceClient(timeout=15)
    base = str(servers["classify"].base_url).rstrip("/")
    best = client.text_classification("the movie was good", model=base + "/predict")  # TEI's flat list: its best
    want = servers["classify"].post("/predict", json={"inputs": "the movie was good"}).json()[0]
    assert (best.label, round(best.score, 6)) == (want["label"], round(want["score"], 6))
    monkeypatch.setenv("TASK", "sentence-similarity")
    embed = str(servers["embed"].base_url).rstrip("/")
    scores = client.sentence_similarity("good", other_sentences=["bad", "good"], model=embed + "/")
    direct = servers["embed"].post("/similarity", json={"inputs": {"source_sentence": "good",
                                                                   "sentences": ["bad", "good"]}}).json()
    np.testing.assert_allclose(scores, direct, rtol=0, atol=1e-6)
    assert abs(scores[1] - 1) < 1e-5


def test_an_application_frameworks_embedder_works_unchanged(servers, monkeypatch):
    """Haystack's OpenAI embedder pointed at the server's OpenAI-compatible route (as at TEI's): the vectors are
    the server's /v1 ones (normalised, TEI's rule)."""
    monkeypatch.setenv("HAYSTACK_TELEMETRY_ENABLED", "False")
    embedders = pytest.importorskip("haystack.components.embedders", reason="needs haystack-ai: pip install -e '.[test]'")
    from haystack.utils import Secret

    url = str(servers["embed"].base_url).rstrip("/") + "/v1"
    embedder = embedders.OpenAITextEmbedder(api_key=Secret.from_token("unused"), model="embed", api_base_url=url,
                                            timeout=15, max_retries=0)
    got = embedder.run(text="What is Deep Learning?")["embedding"]
    want = servers["embed"].post("/v1/embeddings", json={"input": "What is Deep Learning?"}).json()
    np.testing.assert_allclose(got, want["data"][0]["embedding"], rtol=0, atol=1e-6)
    assert abs(np.linalg.norm(got) - 1) < 1e-5
