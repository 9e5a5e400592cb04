"""A property-based fuzzer (schemathesis) over bridges.serve's own OpenAPI document: every check schemathesis
has, on every route, with zero failures: no server error, every status, content type, header and body as
documented, every request the document calls valid answered, every request it calls invalid refused; then
a stateful phase that follows the document's links (open a session, call it, read it, close it).

Schemathesis reads ``/openapi.json`` from a real server on loopback and sends schema-shaped requests and
deliberately malformed ones (wrong types, missing fields, out-of-range numbers), a bounded number per
route, seeded. What no JSON Schema can state is supplied the way a client would (``_prepare``): a session
route gets a session that was opened, a weight route the weights key and, for a valid push, a real
safetensors payload; a named ``tool_choice`` names one of the request's tools; a valid request is kept
short (tokens, and a prompt inside the tiny model's context).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

from bridges.server.app import ServeLimits, WeightUpdates, serve_in_thread

KEY = "fuzz-weights-key"
OPENAI_PATHS = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{model}", "/health"}
# per route: valid requests generate tokens (slower), malformed ones are refused in milliseconds
MAX_EXAMPLES = {GenerationMode.POSITIVE: 25, GenerationMode.NEGATIVE: 120}
SEEDED = {"deadline": None, "suppress_health_check": list(HealthCheck), "database": None, "derandomize": True}
# a valid call on a session that was closed earlier in a sequence is answered 410 Gone (its rollout has
# ended), which schemathesis does not list among the refusals a valid request may meet
CONFIG = SchemathesisConfig.from_dict({"checks": {"positive_data_acceptance": {
    "expected-statuses": ["2XX", "3XX", 401, 403, 404, 409, 410, 429, "5XX"]}}})


@pytest.fixture(scope="module")
def served_schema(tiny_path: Path) -> Iterator[tuple[str, Any, Any]]:
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient

    engine = HFEngine.from_pretrained(str(tiny_path))
    client = EngineClient(engine, model_name="tiny", request_timeout=60)
    limits = ServeLimits(model_names=("tiny",), max_body_bytes=256 * 1024, max_n=2)
    with serve_in_thread(client, limits=limits, updates=WeightUpdates(KEY, engine.model)) as server:
        yield server.url, schemathesis.openapi.from_url(f"{server.url}/openapi.json", config=CONFIG), engine


def _valid_push(engine: Any) -> bytes:
    from bridges.models.weight_payload import Payload, encode

    name = "model.norm.weight"
    return encode(Payload("full", int(engine.weight_version), {name: engine.model.state_dict()[name].clone()}, run="fuzz"))


def _prepare(case: Any, url: str, engine: Any, mode: GenerationMode, opened: bool = False) -> None:
    """What the document cannot state, supplied as a client would (see the module doc). ``opened``: the
    stateful phase took the session id from a link, so it is left as it is."""
    path = case.operation.path
    if "{session}" in path and not opened:
        fresh = httpx.post(f"{url}/v1/sessions", json={"sampling": {"max_tokens": 4}}, timeout=30)
        assert fresh.status_code == 201, fresh.text
        case.path_parameters = {**(case.path_parameters or {}), "session": fresh.json()["id"]}
    if path.startswith("/v1/weights"):
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {KEY}"}
    if mode is GenerationMode.POSITIVE and path == "/v1/weights":
        case.body, case.media_type = _valid_push(engine), "application/octet-stream"
    body = case.body
    if not isinstance(body, dict):
        return
    if mode is GenerationMode.POSITIVE and path == "/v1/weights/channel":
        body.update(host="127.0.0.1", timeout_s=1)  # the server joins only its peer; a join fails fast
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):  # a valid length, kept short
        if isinstance(body.get(key), (int, float)) and not isinstance(body.get(key), bool) and 8 < body[key] <= 2**63 - 1:
            body[key] = 8
    if path in OPENAI_PATHS and "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = 8
    if mode is GenerationMode.POSITIVE:
        _fit_the_tiny_model(body)


def _fit_the_tiny_model(body: dict[str, Any]) -> None:
    """A named tool_choice names the request's first tool; a ``previous_response_id`` is one the session
    answered or none; text and tool schemas are cut so a prompt fits the tiny model's 4,096 tokens."""
    choice, tools = body.get("tool_choice"), body.get("tools")
    if isinstance(choice, dict) and isinstance(tools, list) and tools:
        first = tools[0].get("function", {}).get("name") if isinstance(tools[0], dict) else None
        if isinstance(first, str):
            choice["function"] = {"name": first}
    body.pop("previous_response_id", None)
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        if isinstance(tool, dict):  # keys a tool definition holds besides these are rendered too: kept short
            tool = tools[i] = {k: v for k, v in tool.items() if k in ("type", "function", "name", "description",
                                                                       "parameters", "input_schema")}
        function = tool.get("function") if isinstance(tool, dict) and isinstance(tool.get("function"), dict) else tool
        for key in ("parameters", "input_schema"):
            if isinstance(function, dict) and isinstance(function.get(key), dict):
                function[key] = {"type": "object"}
        for key in ("name", "description"):
            if isinstance(function, dict) and isinstance(function.get(key), str):
                function[key] = function[key][:64]
    for message in body.get("messages") or body.get("input") or []:
        if isinstance(message, dict):
            for key in ("content", "reasoning_content"):
                if isinstance(message.get(key), str):
                    message[key] = message[key][:64]
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    call["function"]["arguments"] = str(call["function"].get("arguments", ""))[:64]
    if len(body.get("messages") or body.get("input") or []) > 16:
        key = "messages" if body.get("messages") else "input"
        body[key] = body[key][:16]
    if isinstance(tools, list) and len(tools) > 8:
        body["tools"] = tools[:8]
        if isinstance(choice, dict) and isinstance(tools[0], dict):
            choice["function"] = {"name": (tools[0].get("function") or {}).get("name")}
    for key in ("prompt", "system", "instructions", "input"):
        if isinstance(body.get(key), str):
            body[key] = body[key][:256]


def _operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize(
    "mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "malformed"]
)
def test_every_route_conforms_to_its_document(served_schema: Any, mode: GenerationMode) -> None:
    url, schema, engine = served_schema
    seen: dict[str, list[int]] = {}
    operations = _operations(schema)
    assert {op.path for op in operations} >= OPENAI_PATHS | {
        "/v1/sessions", "/v1/sessions/{session}", "/s/{session}/v1/chat/completions", "/s/{session}/v1/responses",
        "/s/{session}/v1/messages", "/s/{session}/v1/models", "/v1/weights", "/v1/weights/channel",
    }
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and operation.method.upper() != "POST":
            continue  # no body, and any string is a well-formed path parameter: nothing can be malformed

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=MAX_EXAMPLES[mode], **SEEDED)
        def one(case: Any) -> None:
            _prepare(case, url, engine, mode)
            response = case.call_and_validate(timeout=120)  # every check schemathesis has
            seen.setdefault(case.operation.path, []).append(response.status_code)

        one()
    exercised = {path for path, statuses in seen.items() if statuses}
    assert len(exercised) >= (13 if mode is GenerationMode.POSITIVE else 8), sorted(exercised)  # every route reached
    statuses = [status for path in seen.values() for status in path]
    if mode is GenerationMode.NEGATIVE:
        assert all(any(400 <= status < 500 for status in seen[path]) for path in seen)  # refused, by route
    else:
        assert 200 in statuses and 201 in seen["/v1/sessions"]


def test_a_clients_sequence_of_calls_follows_the_documents_links(served_schema: Any) -> None:
    """The stateful phase: open a session, then call, read and close it in any order the links allow."""
    url, schema, engine = served_schema
    base = schema.as_state_machine()
    steps: list[tuple[str, int]] = []

    class Client(base):  # type: ignore[misc, valid-type]
        def before_call(self, case: Any) -> None:
            _prepare(case, url, engine, GenerationMode.POSITIVE, opened=True)

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"timeout": 120}

        def after_call(self, response: Any, case: Any) -> None:
            steps.append((case.operation.path, response.status_code))

    Client.run(settings=settings(max_examples=15, stateful_step_count=6, **SEEDED))
    linked = {path for path, _ in steps if path.startswith(("/s/{session}", "/v1/sessions/{session}"))}
    assert len(linked) >= 3, steps  # sessions were opened and then used through their links
