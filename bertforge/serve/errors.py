"""The errors a request is answered with, and their JSON shape: text-embeddings-inference's, or OpenAI's under
/v1/ (which its client reads)."""

from __future__ import annotations

from typing import Any


#: The scope key set on a request whose body missed its deadline (`connections.GuardedProtocol`): its handler
#: then counts it as 408, not as a client that hung up.
TIMED_OUT = "bertforge.timed_out"


class ApiError(Exception):
    """A request the server answers with `status` and a JSON error naming the problem."""

    def __init__(self, status: int, message: str, kind: str = "Validation") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


class Overloaded(ApiError):
    """The server takes no more now: 429 when the queue is full (TEI's answer to a request past
    --max-concurrent-requests), 503 while it shuts down; both with Retry-After."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(status, message, "Overloaded")


def _error_body(path: str, err: ApiError) -> dict[str, Any]:
    if path.startswith("/v1/") or path == "/embeddings":  # OpenAI's error shape, which its client reads
        kind = {424: "server_error", 429: "rate_limit_exceeded", 500: "server_error",
                503: "server_error"}.get(err.status, "invalid_request_error")
        return {"error": {"message": err.message, "type": kind, "param": None, "code": None}}
    return {"error": err.message, "error_type": err.kind}
