"""Tests of `bertforge.serve.errors`: an error's JSON body is text-embeddings-inference's `ErrorResponse`, and its
flat `OpenAICompatErrorResponse` under /v1/; the error types are TEI's enum, each with TEI's status
(`tests/serve/test_conformance.py` validates both shapes over HTTP against TEI's OpenAPI document)."""

from __future__ import annotations

import pytest

from bertforge.serve.errors import STATUS, ApiError, Overloaded, _error_body, batch_too_large


def test_an_error_body_is_teis_shape_and_its_flat_openai_shape_under_v1():
    error = ApiError(None, "`inputs` cannot be empty", "Empty")
    assert error.status == 400
    assert _error_body("/embed", error) == {"error": "`inputs` cannot be empty", "error_type": "Empty"}
    assert _error_body("/v1/embeddings", error) == {"message": "`inputs` cannot be empty", "code": 400,
                                                    "type": "Empty"}
    assert _error_body("/embeddings", batch_too_large(33, 32)) == {
        "message": "batch size 33 > maximum allowed batch size 32", "code": 422, "type": "Validation"}


def test_the_error_types_are_teis_enum_with_its_statuses():
    assert STATUS == {"Unhealthy": 503, "Backend": 424, "Overloaded": 429, "Validation": 422, "Tokenizer": 422,
                      "Empty": 400}
    with pytest.raises(ValueError, match="not one of TEI's"):
        ApiError(400, "x", "Payload")


def test_overloaded_is_a_429_and_shutting_down_a_503_unhealthy():
    assert (Overloaded("the queue is full", status=429).kind, Overloaded("stopping").kind) == ("Overloaded",
                                                                                              "Unhealthy")
    assert Overloaded("stopping").status == 503
    assert _error_body("/embed", Overloaded("full", 429)) == {"error": "full", "error_type": "Overloaded"}
