"""bridges.serve against hostile clients: every client error is a 4xx in OpenAI's shape naming the field,
never a 500; limits on body size and n; an OpenAPI document that a property-based fuzzer runs against."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridges.server.app import ServeLimits, serve_in_thread

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tiny_path: Path) -> Iterator[Any]:
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient

    client = EngineClient(HFEngine.from_pretrained(str(tiny_path)), model_name="tiny")
    limits = ServeLimits(model_names=("tiny", "tiny-alias"), max_body_bytes=64 * 1024, max_n=4)
    with serve_in_thread(client, limits=limits) as thread:
        yield thread


@pytest.fixture(scope="module")
def http(server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def post(http: httpx.Client, body: Any, path: str = CHAT) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()
    return http.post(path, content=raw, headers={"content-type": "application/json"})


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": USER, "max_tokens": 2, **fields}


BAD = [  # (body, status, a piece of the message, the param named)
    (b"[" * 6000 + b"]" * 6000, 400, "nested too deeply", None),
    (b"{" + b'"a":' * 1 + b"[" * 6000 + b"]" * 6000 + b"}", 400, "nested too deeply", None),
    (b"{not json", 400, "not valid JSON", None),
    (b"[1, 2]", 400, "must be a JSON object", None),
    (chat(temperature=math.nan), 400, "'temperature' must be a finite number", "temperature"),
    (chat(temperature=math.inf), 400, "'temperature' must be a finite number", "temperature"),
    (chat(temperature=2.5), 400, "'temperature' must be between 0 and 2", "temperature"),
    (chat(top_p=math.nan), 400, "'top_p' must be a finite number", "top_p"),
    (chat(messages=[{"role": "robot", "content": "x"}]), 400, "'messages[0].role' must be one of", "messages[0].role"),
    (chat(messages=[{"role": "user", "content": 5}]), 400, "must be a string, a list of text parts or null", "messages[0].content"),
    (chat(messages=[{"role": "user", "content": "\ud800"}]), 400, "unpaired UTF-16 surrogate", "messages[0].content"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
     "is a 'image_url' part; this engine takes text only", "messages[0].content[0]"),
    (chat(messages=["just a string"]), 400, "'messages[0]' must be a message object", "messages[0]"),
    (chat(messages="hello"), 400, "'messages' must be a list", "messages"),
    ({"model": "tiny"}, 400, "'messages' is required.", "messages"),
    ({"messages": USER}, 400, "'model' is required.", "model"),
    (chat(model="gpt-9"), 404, "the model 'gpt-9' does not exist", "model"),
    (chat(n=5), 400, "'n' must be at most 4 on this server (max_n).", "n"),
    (chat(n=0), 400, "'n' must be an integer from 1", "n"),
    (chat(max_tokens=-1), 400, "'max_tokens' must be an integer from 1", "max_tokens"),
    (chat(seed=2**70), 400, "'seed' must be an integer", "seed"),
    (chat(tools=5), 400, "'tools' must be a list of tool definitions.", "tools"),
    (chat(tools=[{"type": "function"}]), 400, "'tools[0]' must be", "tools[0]"),
    (chat(messages=[{"role": "assistant", "tool_calls": [{"id": "1"}]}]), 400, "must have a string 'id'", "messages[0].tool_calls[0]"),
    (chat(unknown_key=1), 400, "extra_body key 'unknown_key' is not supported", "unknown_key"),
    ({"model": "tiny", "prompt": "\udfff"}, 400, "unpaired UTF-16 surrogate", "prompt"),
]


@pytest.mark.parametrize(("body", "status", "piece", "param"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_client_errors_are_4xx_in_openai_shape(
    http: httpx.Client, body: Any, status: int, piece: str, param: str | None
):
    path = "/v1/completions" if isinstance(body, dict) and "prompt" in body else CHAT
    response = post(http, body, path)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert piece in error["message"] and error["param"] == param, error
    assert "Traceback" not in error["message"] and "TextEncodeInput" not in error["message"]


def test_body_size_limit_is_413_whatever_content_length_says(http: httpx.Client):
    big = json.dumps(chat(messages=[{"role": "user", "content": "x" * 70_000}])).encode()
    assert post(http, big).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length at all: the server counts what arrives
        for _ in range(70):
            yield b" " * 1024

    response = http.post(CHAT, content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"


def test_models_aliases_and_model_by_id(http: httpx.Client):
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["tiny", "tiny-alias"]
    assert http.get("/v1/models/tiny-alias").json()["id"] == "tiny-alias"
    missing = http.get("/v1/models/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    ok = post(http, chat(model="tiny-alias"))
    assert ok.status_code == 200 and ok.json()["choices"][0]["token_ids"]


def test_one_access_line_per_request(tiny_path: Path, capfd: pytest.CaptureFixture[str]):
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient

    client = EngineClient(HFEngine.from_pretrained(str(tiny_path)), model_name="tiny")
    with serve_in_thread(client, limits=ServeLimits(access_log=True)) as server:
        httpx.get(f"{server.url}/health")
        httpx.post(f"{server.url}{CHAT}", json=chat(model="nope"))
    lines = [x for x in capfd.readouterr().err.splitlines() if x.startswith(("GET", "POST"))]
    assert len(lines) == 2
    assert lines[0].startswith("GET /health 200 ") and lines[0].endswith("ms")
    assert lines[1].startswith(f"POST {CHAT} 404 ")


def test_openapi_document_describes_every_endpoint(http: httpx.Client, hf_engine: Any):
    """Every route the app serves (sessions and weights included) is in the document, with its methods."""
    from bridges.client import EngineClient
    from bridges.server.app import create_app

    document = http.get("/openapi.json").json()
    assert document["openapi"].startswith("3.")
    served = {(route.path.replace(":path", ""), method.lower()) for route in create_app(EngineClient(hf_engine)).routes
              for method in route.methods or () if method != "HEAD"}
    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    assert served - {("/openapi.json", "get")} == documented
    chat_schema = document["paths"][CHAT]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert chat_schema["properties"]["model"]["enum"] == ["tiny", "tiny-alias"]
    assert chat_schema["properties"]["n"]["anyOf"][0]["maximum"] == 4  # or null: the argument left out
