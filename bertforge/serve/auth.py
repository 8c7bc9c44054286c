"""`--api-key`: every route but the health probes (`GET /health`, `GET /`, `GET /ping`) and `GET /metrics` answers
401 unless the request carries `Authorization: Bearer KEY` (text-embeddings-inference's rule: those are public
there too)."""

from __future__ import annotations

import hmac
from typing import Any

from .errors import ApiError, _error_body
from .responses import json_bytes

#: The routes a load balancer's probe and a Prometheus scraper reach without the key, as in TEI (GET only: POST /
#: is the model's route).
PUBLIC = frozenset({"/health", "/metrics", "/ping", "/", "/docs", "/api-doc/openapi.json"})


class ApiKeyMiddleware:
    """A plain ASGI middleware in front of the routes: a request without the bearer key gets 401 (with
    `WWW-Authenticate: Bearer` and the route's JSON error shape) before its body is read."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        public = scope["type"] == "http" and scope["path"] in PUBLIC and scope["method"] in ("GET", "HEAD")
        if scope["type"] != "http" or public or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        error = ApiError(401, "missing or wrong API key: send the header `Authorization: Bearer <key>`",
                         "Validation")
        body = json_bytes(_error_body(scope["path"], error))
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope: Any) -> bool:
        given = [value for name, value in scope["headers"] if name == b"authorization"]
        return len(given) == 1 and hmac.compare_digest(given[0], self.expected)
