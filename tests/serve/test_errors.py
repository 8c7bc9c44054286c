"""Tests of `bertforge.serve.errors`: an error's JSON body is text-embeddings-inference's shape, and OpenAI's under
/v1/ (the shape its client reads; `tests/serve/test_requests.py` checks both over HTTP)."""

from __future__ import annotations

from bertforge.serve.errors import ApiError, Overloaded, _error_body


def test_an_error_body_is_teis_shape_and_openais_under_v1():
    error = ApiError(422, '"inputs" is an empty array')
    assert _error_body("/embed", error) == {"error": '"inputs" is an empty array', "error_type": "Validation"}
    assert _error_body("/v1/embeddings", error) == {"error": {
        "message": '"inputs" is an empty array', "type": "invalid_request_error", "param": None, "code": None}}


def test_overloaded_is_a_503_and_a_server_error_for_openais_client():
    error = Overloaded("the queue is full")
    assert (error.status, error.kind) == (503, "Overloaded")
    assert _error_body("/embed", error) == {"error": "the queue is full", "error_type": "Overloaded"}
    assert _error_body("/v1/embeddings", error)["error"]["type"] == "server_error"
