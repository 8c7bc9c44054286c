"""The errors a request is answered with, and their JSON shape: text-embeddings-inference's `ErrorResponse`
(`{"error", "error_type"}`), or under /v1/ (and its alias /embeddings) TEI's flat `OpenAICompatErrorResponse`
(`{"message", "code", "type"}`). The error types are TEI's enum only (`ERROR_TYPES`); each has its status
(`STATUS`), as TEI's router maps them; a few statuses TEI's HTTP framework answers (413 past the payload limit, 400
for a body that is not JSON, 401, 404, 405) keep their status with the type `Validation`."""

from __future__ import annotations

from typing import Any


#: The scope key set on a request whose body missed its deadline (`connections.GuardedProtocol`): its handler
#: then counts it as 408, not as a client that hung up.
TIMED_OUT = "bertforge.timed_out"

#: TEI's `ErrorType` and the status each is answered with (router/src/http/server.rs, `From<&ErrorType>`).
STATUS = {"Unhealthy": 503, "Backend": 424, "Overloaded": 429, "Validation": 422, "Tokenizer": 422, "Empty": 400}
ERROR_TYPES = tuple(STATUS)


class ApiError(Exception):
    """A request the server answers with a JSON error naming the problem: `kind` is one of TEI's `ERROR_TYPES`,
    `status` by default the one TEI answers for it."""

    def __init__(self, status: int | None, message: str, kind: str = "Validation") -> None:
        if kind not in STATUS:
            raise ValueError(f"error type {kind!r} is not one of TEI's ({', '.join(ERROR_TYPES)})")
        super().__init__(message)
        self.status = STATUS[kind] if status is None else status
        self.message = message
        self.kind = kind


def invalid(message: str) -> ApiError:
    """TEI's 422 Validation error."""
    return ApiError(None, message, "Validation")


def empty(message: str) -> ApiError:
    """TEI's 400 Empty error (an empty batch)."""
    return ApiError(None, message, "Empty")


def backend(message: str) -> ApiError:
    """TEI's 424 Backend error (a route of the other model kind; the model failed)."""
    return ApiError(None, message, "Backend")


def batch_too_large(count: int, limit: int) -> ApiError:
    """TEI's answer to more inputs than --max-client-batch-size: 422, in its words."""
    return invalid(f"batch size {count} > maximum allowed batch size {limit}")


class Overloaded(ApiError):
    """The server takes no more now: 429 Overloaded when the queue is full (TEI's answer to a request past
    --max-concurrent-requests), 503 Unhealthy while it shuts down; both with Retry-After."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(status, message, "Overloaded" if status == 429 else "Unhealthy")


def openai_route(path: str) -> bool:
    return path.startswith("/v1/") or path == "/embeddings"


def _error_body(path: str, err: ApiError) -> dict[str, Any]:
    if openai_route(path):  # TEI's OpenAICompatErrorResponse (its `error_type` serialised as "type")
        return {"message": err.message, "code": err.status, "type": err.kind}
    return {"error": err.message, "error_type": err.kind}
