"""A property-based fuzzer (schemathesis) over bridges.serve's own OpenAPI document: zero server errors,
and every request the document calls valid is answered.

Schemathesis reads ``/openapi.json`` from a real server on loopback and sends schema-shaped requests
and deliberately malformed ones (wrong types, missing fields, out-of-range numbers), a bounded number
per endpoint. Every answer must be below 500: a client's input is never the server's failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from bridges.server.app import ServeLimits, serve_in_thread

NOT_AMONG_TOOLS = "which is not among the tools"
# per endpoint: valid requests generate tokens (slower), malformed ones are refused in milliseconds
MAX_EXAMPLES = {GenerationMode.POSITIVE: 25, GenerationMode.NEGATIVE: 120}


@pytest.fixture(scope="module")
def served_schema(tiny_path: Path) -> Iterator[Any]:
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient

    client = EngineClient(HFEngine.from_pretrained(str(tiny_path)), model_name="tiny", request_timeout=60)
    limits = ServeLimits(model_names=("tiny",), max_body_bytes=256 * 1024, max_n=2)
    with serve_in_thread(client, limits=limits) as server:
        yield schemathesis.openapi.from_url(f"{server.url}/openapi.json")


def _operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize(
    "mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "malformed"]
)
def test_no_request_is_answered_with_a_server_error(served_schema: Any, mode: GenerationMode) -> None:
    seen: list[int] = []
    operations = _operations(served_schema)
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions", "/v1/models/{model}"}
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and operation.method.upper() == "GET":
            continue  # no body, and any string is a well-formed path parameter: nothing can be malformed

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=MAX_EXAMPLES[mode],
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=True,  # seeded: a failure reproduces on the next run
        )
        def one(case: Any) -> None:
            body = case.body
            if isinstance(body, dict):  # keep each generation short (an unbounded one on the tiny model
                # ran past the 60 s request_timeout under a loaded CI machine): a length, not the shape
                for key in ("max_tokens", "max_completion_tokens"):
                    if isinstance(body.get(key), (int, float)) and body[key] > 8:
                        body[key] = 8
                if "max_tokens" not in body and "max_completion_tokens" not in body:
                    body["max_tokens"] = 8
            response = case.call(timeout=120)
            seen.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, body, response.text[:500])
            if mode is GenerationMode.POSITIVE:  # what the document calls valid is taken, but for the one
                # rule JSON Schema cannot state: a named tool_choice must name one of the request's tools
                assert response.status_code == 200 or NOT_AMONG_TOOLS in response.text, (body, response.text[:500])
            if response.status_code >= 400:
                assert "error" in response.json()  # OpenAI's error shape, never a plain-text page

        one()
    assert len(seen) >= 10  # the fuzzer really sent requests
    if mode is GenerationMode.NEGATIVE:
        assert any(400 <= status < 500 for status in seen)
    else:
        assert 200 in seen
