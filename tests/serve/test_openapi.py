"""Tests of `bertforge.serve.openapi`: the route table the app is built from, and the OpenAPI document built from
it (/api-doc/openapi.json, Swagger UI at /docs): every route TEI documents, with TEI's schemas' names and fields,
bertforge's additions marked, the server's answers valid against it."""

from __future__ import annotations

import copy
import os

import pytest

from bertforge.serve.openapi import ROUTES, SCHEMAS, document
from tests.serve.test_conformance import TEI, _json_schema

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")
jsonschema = pytest.importorskip("jsonschema", reason="needs jsonschema: pip install -e '.[test]'")


def test_every_schema_a_route_names_exists_and_every_ref_resolves():
    doc = document("0")
    names = {r.request for r in ROUTES} | {r.response for r in ROUTES}
    assert names - {None} <= set(SCHEMAS)
    refs = set()

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                refs.add(node["$ref"].rsplit("/", 1)[-1])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    assert refs <= set(SCHEMAS)
    assert {path for path in doc["paths"]} == {r.path for r in ROUTES if r.documented}
    assert doc["paths"]["/v1/embeddings"]["post"]["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/OpenAICompatErrorResponse"}


def test_the_servers_openapi_document_covers_teis_and_marks_the_rest(embed_server):
    client = embed_server.client
    ours = client.get("/api-doc/openapi.json").json()
    assert ours["openapi"].startswith("3.0") and "Swagger" in client.get("/docs").text
    for path, operations in TEI["paths"].items():
        assert path in ours["paths"], path
        for method, operation in operations.items():
            mine = ours["paths"][path][method]
            assert set(operation["responses"]) <= set(mine["responses"]) | {"413"}, path
    for name, schema in TEI["components"]["schemas"].items():  # every TEI schema, with TEI's required fields
        if name in ours["components"]["schemas"] and "required" in schema:
            mine = ours["components"]["schemas"][name]
            assert set(schema["required"]) == set(mine["required"]) - ({"type"} if "Error" in name else set()) | (
                {"error_type"} & set(schema["required"]) if name == "OpenAICompatErrorResponse" else set()), name
    extra = {k for name, s in ours["components"]["schemas"].items() for k, v in s.get("properties", {}).items()
             if isinstance(v, dict) and v.get("x-bertforge")}
    assert {"adapter", "max_input_chars"} <= extra
    for name, schema in TEI["components"]["schemas"].items():  # TEI's property names, each kept
        if name in ours["components"]["schemas"] and name != "OpenAICompatErrorResponse":
            assert set(schema.get("properties", {})) <= set(ours["components"]["schemas"][name].get(
                "properties", {})), name
    # our answers validate against our own document too
    doc = copy.deepcopy(ours)
    jsonschema.validate(client.post("/embed", json={"inputs": "x"}).json(),
                        {"$ref": "#/components/schemas/EmbedResponse", "components": _json_schema(doc["components"])})
    assert os.environ.get("TASK") is None
