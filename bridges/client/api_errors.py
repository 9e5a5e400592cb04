"""Failures mapped onto the OpenAI SDK's own exception types.

Code written against the SDK already handles ``BadRequestError``/``APITimeoutError``/
``InternalServerError``; raising exactly those (with the same ``code``/``param`` fields the HTTP
server sends) means an environment behaves the same in-process and over HTTP.
"""

from __future__ import annotations

from typing import Any

_BASE_URL = "http://engine-client.invalid/v1"


def _request(path: str) -> Any:
    import httpx2

    return httpx2.Request("POST", _BASE_URL + path)


def bad_request(
    message: str, *, param: str | None = None, code: str | None = None, path: str = "/chat/completions"
) -> Any:
    """An ``openai.BadRequestError`` (400) whose body matches what bridges.serve returns."""
    import httpx2
    import openai

    body = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    response = httpx2.Response(400, request=_request(path), json={"error": body})
    return openai.BadRequestError(message, response=response, body=body)


def timeout_error(seconds: float, path: str = "/chat/completions") -> Any:
    import openai

    error = openai.APITimeoutError(request=_request(path))
    error.message = f"the engine did not answer within {seconds:g} s (request_timeout)."
    error.args = (error.message,)
    return error


def internal_error(message: str, path: str = "/chat/completions") -> Any:
    import httpx2
    import openai

    body = {"message": message, "type": "server_error", "param": None, "code": "engine_error"}
    response = httpx2.Response(500, request=_request(path), json={"error": body})
    return openai.InternalServerError(message, response=response, body=body)


def error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """(HTTP status, OpenAI error JSON) for an exception raised by the client: what bridges.serve sends."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {"message": exc.message}
        return exc.status_code, {"error": {"type": None, "param": None, "code": None, **body}}
    if isinstance(exc, openai.APITimeoutError):
        return 504, {"error": {"message": exc.message, "type": "timeout", "param": None, "code": "timeout"}}
    message = f"{type(exc).__name__}: {exc}"
    return 500, {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
