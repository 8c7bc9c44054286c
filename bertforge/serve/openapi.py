"""The server's routes, declared once (`ROUTES`): `app.create_app` builds its Starlette routes from them and
`document` its OpenAPI document (served at `/api-doc/openapi.json`, with Swagger UI at `/docs`, as TEI serves
them). Each route names its request and answer schemas (`SCHEMAS`, TEI's components by TEI's names, plus
bertforge's) and its error statuses; bertforge's additions are marked `x-bertforge: true`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import STATUS


@dataclass(frozen=True)
class Route:
    """One route: where, which handler (by name, in `handlers` or `tei`), its schemas and errors."""

    path: str
    method: str
    handler: str
    summary: str
    request: str | None = None  # the request body's schema (a name in SCHEMAS)
    response: str | None = None  # the 200 answer's schema
    errors: tuple[int, ...] = (400, 413, 422, 424, 429)
    bertforge: bool = False  # an addition of bertforge's (not in TEI's API)
    public: bool = False  # answered without the API key (TEI's public routes)
    documented: bool = True  # in the OpenAPI document (TEI leaves its hosted-endpoint aliases out)


ROUTES: tuple[Route, ...] = (
    Route("/embed", "POST", "handle_embed", "Get Embeddings.", "EmbedRequest", "EmbedResponse"),
    Route("/embed_all", "POST", "handle_embed_all", "Get all Embeddings without Pooling.", "EmbedAllRequest",
          "EmbedAllResponse"),
    Route("/embed_sparse", "POST", "handle_embed_sparse", "Get Sparse Embeddings (SPLADE models only).",
          "EmbedSparseRequest", "EmbedSparseResponse"),
    Route("/similarity", "POST", "handle_similarity", "Get Sentence Similarity.", "SimilarityRequest",
          "SimilarityResponse"),
    Route("/predict", "POST", "handle_predict", "Get Predictions (sequence-classification models).",
          "PredictRequest", "PredictResponse"),
    Route("/rerank", "POST", "handle_rerank", "Get Ranks (a sequence-classification model with one label).",
          "RerankRequest", "RerankResponse"),
    Route("/tokenize", "POST", "handle_tokenize", "Tokenize inputs.", "TokenizeRequest", "TokenizeResponse",
          (400, 413, 422)),
    Route("/decode", "POST", "handle_decode", "Decode input ids.", "DecodeRequest", "DecodeResponse",
          (400, 413, 422)),
    Route("/v1/embeddings", "POST", "handle_openai_embeddings", "OpenAI compatible route.", "OpenAICompatRequest",
          "OpenAICompatResponse"),
    Route("/embeddings", "POST", "handle_openai_embeddings", "OpenAI compatible route (TEI's alias).",
          "OpenAICompatRequest", "OpenAICompatResponse", documented=False),
    Route("/vertex", "POST", "handle_vertex", "Vertex AI compatible route.", "VertexRequest", "VertexResponse"),
    Route("/info", "GET", "handle_info", "Text Embeddings Inference endpoint info.", None, "Info", ()),
    Route("/health", "GET", "handle_health", "Health check method.", None, None, (503,), public=True),
    Route("/metrics", "GET", "handle_metrics", "Prometheus metrics scrape endpoint.", None, None, (), public=True),
    Route("/", "POST", "handle_default", "The model's own route (TEI's hosted endpoints).", documented=False),
    Route("/invocations", "POST", "handle_default", "The model's own route (SageMaker).", documented=False),
    Route("/", "GET", "handle_health", "Health (TEI's hosted endpoints).", None, None, (503,), public=True,
          documented=False),
    Route("/ping", "GET", "handle_health", "Health (SageMaker).", None, None, (503,), public=True, documented=False),
)

_INT = {"type": "integer", "minimum": 0}
_IDS = {"type": "array", "items": {"type": "integer", "format": "int32", "minimum": 0}}
_TRUNCATION = {"allOf": [{"$ref": "#/components/schemas/TruncationDirection"}], "default": "right"}
_NULL_BOOL = {"type": "boolean", "nullable": True}
_NULL_STR = {"type": "string", "nullable": True}
_ADAPTER = {"type": "string", "nullable": True, "x-bertforge": True,
            "description": "bertforge: the --adapter NAME to answer with (default: the base model)"}


def _obj(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _array(items: Any) -> dict[str, Any]:
    return {"type": "array", "items": items}


#: The components: TEI's schemas by TEI's names (their fields as TEI 1.9 reads and writes them), bertforge's
#: extra fields marked `x-bertforge`.
SCHEMAS: dict[str, Any] = {
    "ErrorType": {"type": "string", "enum": list(STATUS)},
    "ErrorResponse": _obj(["error", "error_type"], error={"type": "string"}, error_type=_ref("ErrorType")),
    "OpenAICompatErrorResponse": _obj(["message", "code", "type"], message={"type": "string"},
                                      code={"type": "integer", "minimum": 0}, type=_ref("ErrorType")),
    "TruncationDirection": {"type": "string", "enum": ["Left", "Right"]},
    "InputType": {"oneOf": [{"type": "string"}, _IDS]},
    "Input": {"oneOf": [_ref("InputType"), _array(_ref("InputType"))]},
    "InputIds": {"oneOf": [_IDS, _array(_IDS)]},
    "EmbedRequest": _obj(["inputs"], inputs=_ref("Input"), normalize={"type": "boolean", "default": True},
                         truncate=_NULL_BOOL, truncation_direction=_TRUNCATION, prompt_name=_NULL_STR,
                         dimensions=dict(_INT, nullable=True), adapter=_ADAPTER),
    "EmbedAllRequest": _obj(["inputs"], inputs=_ref("Input"), truncate=_NULL_BOOL,
                            truncation_direction=_TRUNCATION, prompt_name=_NULL_STR, adapter=_ADAPTER),
    "EmbedSparseRequest": _obj(["inputs"], inputs=_ref("Input"), truncate=_NULL_BOOL,
                               truncation_direction=_TRUNCATION, prompt_name=_NULL_STR),
    "EmbedResponse": _array(_array({"type": "number", "format": "float"})),
    "EmbedAllResponse": _array(_array(_array({"type": "number", "format": "float"}))),
    "SparseValue": _obj(["index", "value"], index=_INT, value={"type": "number", "format": "float"}),
    "EmbedSparseResponse": _array(_array(_ref("SparseValue"))),
    "SimilarityInput": _obj(["source_sentence", "sentences"], source_sentence={"type": "string"},
                            sentences=_array({"type": "string"})),
    "SimilarityParameters": dict(_obj([], truncate=_NULL_BOOL, truncation_direction=_TRUNCATION,
                                      prompt_name=_NULL_STR), nullable=True),
    "SimilarityRequest": _obj(["inputs"], inputs=_ref("SimilarityInput"), parameters=_ref("SimilarityParameters")),
    "SimilarityResponse": _array({"type": "number", "format": "float"}),
    "PredictInput": {"oneOf": [{"type": "string"}, dict(_array({"type": "string"}), minItems=1, maxItems=2),
                               _array(dict(_array({"type": "string"}), minItems=1, maxItems=2))]},
    "PredictRequest": _obj(["inputs"], inputs=_ref("PredictInput"), raw_scores={"type": "boolean"},
                           truncate=_NULL_BOOL, truncation_direction=_TRUNCATION, adapter=_ADAPTER),
    "Prediction": _obj(["score", "label"], score={"type": "number", "format": "float"}, label={"type": "string"}),
    "PredictResponse": {"oneOf": [_array(_ref("Prediction")), _array(_array(_ref("Prediction")))]},
    "RerankRequest": _obj(["query", "texts"], query={"type": "string"}, texts=_array({"type": "string"}),
                          raw_scores={"type": "boolean"}, return_text={"type": "boolean"}, truncate=_NULL_BOOL,
                          truncation_direction=_TRUNCATION, adapter=_ADAPTER),
    "Rank": _obj(["index", "score"], index=_INT, score={"type": "number", "format": "float"}, text=_NULL_STR),
    "RerankResponse": _array(_ref("Rank")),
    "TokenizeInput": {"oneOf": [{"type": "string"}, _array({"type": "string"})]},
    "TokenizeRequest": _obj(["inputs"], inputs=_ref("TokenizeInput"), add_special_tokens={"type": "boolean"},
                            prompt_name=_NULL_STR),
    "SimpleToken": _obj(["id", "text", "special"], id=_INT, text={"type": "string"}, special={"type": "boolean"},
                        start=dict(_INT, nullable=True), stop=dict(_INT, nullable=True)),
    "TokenizeResponse": _array(_array(_ref("SimpleToken"))),
    "DecodeRequest": _obj(["ids"], ids=_ref("InputIds"), skip_special_tokens={"type": "boolean"}),
    "DecodeResponse": _array({"type": "string"}),
    "EncodingFormat": {"type": "string", "enum": ["float", "base64"]},
    "OpenAICompatRequest": _obj(["input"], input=_ref("Input"), model=_NULL_STR, user=_NULL_STR,
                                encoding_format=_ref("EncodingFormat"), dimensions=dict(_INT, nullable=True)),
    "Embedding": {"oneOf": [_array({"type": "number", "format": "float"}), {"type": "string"}]},
    "OpenAICompatEmbedding": _obj(["object", "embedding", "index"], object={"type": "string"},
                                  embedding=_ref("Embedding"), index=_INT),
    "OpenAICompatUsage": _obj(["prompt_tokens", "total_tokens"], prompt_tokens=_INT, total_tokens=_INT),
    "OpenAICompatResponse": _obj(["object", "data", "model", "usage"], object={"type": "string"},
                                 data=_array(_ref("OpenAICompatEmbedding")), model={"type": "string"},
                                 usage=_ref("OpenAICompatUsage")),
    "VertexRequest": _obj(["instances"], instances=_array({"type": "object"})),
    "VertexResponse": _obj(["predictions"], predictions=_array({})),
    "EmbeddingModel": _obj(["pooling"], pooling={"type": "string"}),
    "ClassifierModel": _obj(["id2label", "label2id"], id2label={"type": "object"}, label2id={"type": "object"}),
    "ModelType": {"oneOf": [_obj(["classifier"], classifier=_ref("ClassifierModel")),
                            _obj(["embedding"], embedding=_ref("EmbeddingModel")),
                            _obj(["reranker"], reranker=_ref("ClassifierModel"))]},
    "Info": _obj(["model_id", "model_dtype", "served_model_name", "model_type", "max_concurrent_requests",
                  "max_input_length", "max_batch_tokens", "max_client_batch_size", "auto_truncate",
                  "tokenization_workers", "version"],
                 model_id={"type": "string"}, model_sha=_NULL_STR, model_dtype={"type": "string"},
                 served_model_name={"type": "string"}, model_type=_ref("ModelType"), max_concurrent_requests=_INT,
                 max_input_length=_INT, max_batch_tokens=_INT, max_batch_requests=dict(_INT, nullable=True),
                 max_client_batch_size=_INT, auto_truncate={"type": "boolean"}, tokenization_workers=_INT,
                 version={"type": "string"}, sha=_NULL_STR, docker_label=_NULL_STR,
                 server={"type": "string", "x-bertforge": True}, max_input_chars=dict(_INT, **{"x-bertforge": True}),
                 hidden_size=dict(_INT, **{"x-bertforge": True})),
}

ERROR_DESCRIPTIONS = {400: "Batch is empty", 413: "Payload too large", 422: "Validation or tokenization error",
                      424: "Inference failed, or a route of the other model kind", 429: "Model is overloaded",
                      503: "Text Embeddings Inference is down"}


def document(version: str) -> dict[str, Any]:
    """The OpenAPI 3.0 document of `ROUTES` (the documented ones), TEI's layout: one operation per route, its
    request body, 200 answer and errors (`OpenAICompatErrorResponse` under /v1/, else `ErrorResponse`)."""
    paths: dict[str, Any] = {}
    for route in ROUTES:
        if not route.documented:
            continue
        error = "OpenAICompatErrorResponse" if route.path.startswith("/v1/") else "ErrorResponse"
        ok: dict[str, Any] = {"description": "OK"}
        if route.response is not None:
            ok["content"] = {"application/json": {"schema": _ref(route.response)}}
        elif route.path == "/metrics":
            ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
        responses = {"200": ok, **{str(status): {"description": ERROR_DESCRIPTIONS[status], "content": {
            "application/json": {"schema": _ref(error)}}} for status in route.errors}}
        operation: dict[str, Any] = {"tags": ["Text Embeddings Inference"], "summary": route.summary,
                                     "operationId": route.handler, "responses": responses}
        if route.request is not None:
            operation["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": _ref(route.request)}}}
        if route.bertforge:
            operation["x-bertforge"] = True
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {"openapi": "3.0.3",
            "info": {"title": "Text Embeddings Inference (bertforge)", "version": version,
                     "description": "text-embeddings-inference 1.9's HTTP API, served by bertforge; "
                                    "x-bertforge marks bertforge's additions",
                     "license": {"name": "Apache 2.0", "url": "https://www.apache.org/licenses/LICENSE-2.0"}},
            "paths": paths, "components": {"schemas": SCHEMAS},
            "tags": [{"name": "Text Embeddings Inference", "description": "Text Embeddings Inference API"}]}


SWAGGER_UI = """<!doctype html>
<html><head><meta charset="utf-8"><title>bertforge serve: API</title>
<link rel="stylesheet" href="https://unpkg.com/swagger-ui-dist@5/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="https://unpkg.com/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "/api-doc/openapi.json", dom_id: "#swagger-ui"});</script>
<noscript>The API's OpenAPI document: <a href="/api-doc/openapi.json">/api-doc/openapi.json</a></noscript>
</body></html>
"""
