"""The OpenAPI document ``bridges.serve`` publishes at ``/openapi.json``.

Written by hand rather than generated: the server takes the OpenAI wire format, whose request
bodies are open (unknown keys travel as vLLM-style extras and are refused by name), so the schema
states what a well-formed request is and what every error looks like. It is also the input of the
property-based fuzz test (schemathesis), which sends thousands of schema-shaped and malformed
requests and requires that none is answered with a server error.
"""

from __future__ import annotations

from typing import Any

from bridges.envs.types import MAX_TOP_LOGPROBS

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "additionalProperties": False,
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
}
# keys a message, tool call or tool definition holds beyond these are ignored, as an SDK's own objects
# carry some (refusal, annotations, audio): the document leaves them open
_TOOL_CALL = {
    "type": "object",
    "required": ["id", "type", "function"],
    "properties": {
        "id": {"type": "string"},
        "type": {"type": "string", "enum": ["function"]},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
        },
    },
}
_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}, {"type": "null"}]},
        "name": {"type": ["string", "null"]},
        "tool_call_id": {"type": ["string", "null"]},
        "reasoning_content": {"type": ["string", "null"]},
        "tool_calls": {"type": ["array", "null"], "items": _TOOL_CALL},
    },
}
_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"type": "string", "enum": ["function"]},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "description": {"type": ["string", "null"]},
                "parameters": {"type": ["object", "null"]},
                "strict": {"type": ["boolean", "null"]},
            },
        },
    },
}
# a forced call ("required" or a named function) needs tools to call; a named one must name one of them,
# which JSON Schema cannot say, so the server refuses that case with 400 naming tool_choice
_FORCED_NEEDS_TOOLS = {
    "if": {"required": ["tool_choice"],
           "properties": {"tool_choice": {"anyOf": [{"const": "required"}, {"type": "object"}]}}},
    "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}},
}


INT64_MAX = 2**63 - 1


def _sampling(max_n: int) -> dict[str, Any]:
    return {
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "n": {"type": "integer", "minimum": 1, "maximum": max_n},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
        "seed": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
        "stop": {
            "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string", "minLength": 1}}]
        },
        "top_k": {"type": "integer", "minimum": -1},
        "stream": {"type": "boolean"},
        "stream_options": {
            "type": "object", "additionalProperties": False, "properties": {"include_usage": {"type": "boolean"}}
        },
    }


def _given(key: str, kind: str, then: dict[str, Any]) -> dict[str, Any]:
    """``then`` applies when ``key`` is present and of JSON type ``kind`` (a null is absent to the server)."""
    return {"if": {"required": [key], "properties": {key: {"type": kind}}}, "then": then}


# stream_options is refused unless stream is true (as OpenAI's API does), top_logprobs unless logprobs is
_STREAM_OPTIONS_NEED_STREAM = _given("stream_options", "object",
                                     {"required": ["stream"], "properties": {"stream": {"const": True}}})
# (a top_logprobs of 0 asks for nothing, so the server takes it without logprobs: the condition says so)
_TOP_LOGPROBS_NEED_LOGPROBS = {"if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer",
                                                                                                    "minimum": 1}}},
                               "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}}


def nullable_optionals(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every property it does not require also taking null: the server reads a null as the
    argument left out (as the OpenAI SDK sends ``None``)."""
    required = set(schema.get("required", ()))
    properties = {key: value if key in required else {"anyOf": [value, {"type": "null"}]}
                  for key, value in schema["properties"].items()}
    return {**schema, "properties": properties}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


# one server-sent event (OpenAPI before 3.2: a stream's schema describes each event): a JSON chunk, or [DONE]
_EVENT = {"type": "object", "required": ["data"],
          "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}}}


def _responses(ok: str, status: str = "200") -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": _ERROR}}}
    return {
        status: {
            "description": ok,
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {"schema": _EVENT},  # stream=true
            },
        },
        "400": {"description": "a request the server refuses, with the field named", **error},
        "401": {"description": "missing or wrong API key", **error},
        "404": {"description": "unknown model or path", **error},
        "413": {"description": "the body is larger than max_body_bytes", **error},
        "4XX": {"description": "refused: no weights key (403), stale weights (409), a closed session (410), "
                               "a cap (429)", **error},
        "5XX": {"description": "the engine or a weight channel is unavailable (503, 504)", **error},
    }


def _request_bodies(
    model_names: list[str], max_n: int, vocabulary: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chat and the completion request schemas. Closed (``additionalProperties: false``): a key
    not listed here is refused by name, so the document says exactly what is taken."""
    model = {"type": "string", "enum": list(model_names)}
    chat = {
        "type": "object",
        "required": ["model", "messages"],
        "additionalProperties": False,
        "allOf": [_STREAM_OPTIONS_NEED_STREAM, _TOP_LOGPROBS_NEED_LOGPROBS, _FORCED_NEEDS_TOOLS],
        "properties": {
            "model": model,
            "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
            "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
            "logprobs": {"type": "boolean"},
            "tools": {"type": "array", "items": _TOOL},
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
            "tool_choice": {
                "oneOf": [
                    {"type": "string", "enum": ["auto", "none", "required"]},
                    {
                        "type": "object",
                        "required": ["type", "function"],
                        "properties": {
                            "type": {"type": "string", "enum": ["function"]},
                            "function": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": {"type": "string"}},
                            },
                        },
                    },
                ]
            },
            "return_drift": {"type": "boolean"},
            "declared_tools_only": {"type": "boolean"},
            "user": {"type": "string"},
            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
            "store": {"type": "boolean", "const": False},
            "parallel_tool_calls": {"type": "boolean"},
            **_sampling(max_n),
        },
    }
    token_ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": vocabulary - 1}}
    completion = {
        "type": "object",
        "required": ["model", "prompt"],
        "additionalProperties": False,
        "allOf": [_STREAM_OPTIONS_NEED_STREAM],
        "properties": {
            "model": model,
            "prompt": {"oneOf": [{"type": "string", "minLength": 1}, token_ids]},
            "logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
            **_sampling(max_n),
        },
    }
    return nullable_optionals(chat), nullable_optionals(completion)


# agent SDKs send keys of their API this server does not read (store, include, reasoning, truncation, an
# item's id and status...): the dialect bodies are open, so an agent is not refused for them
DIALECT_EXTRAS = "Keys of the API not listed here are accepted and not read."


def _responses_request() -> dict[str, Any]:
    """A Responses API body, as a session's ``/responses`` reads it (``responses_dialect``)."""
    item = {"type": "object", "required": ["role", "content"],
            "properties": {"type": {"const": "message"}, "role": {"enum": ["system", "developer", "user", "assistant"]},
                           "content": {"type": "string"}}}
    tool = {"type": "object", "required": ["type", "name"],
            "properties": {"type": {"const": "function"}, "name": {"type": "string", "minLength": 1},
                           "description": {"type": ["string", "null"]}, "parameters": {"type": ["object", "null"]}}}
    return nullable_optionals({
        "type": "object", "required": ["input"], "description": DIALECT_EXTRAS,
        "properties": {
            "input": {"oneOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1, "items": item}]},
            "instructions": {"type": "string"}, "max_output_tokens": {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2}, "stream": {"type": "boolean"},
            # an id this session answered (the fuzzer's stateful phase and a client supply one)
            "previous_response_id": {"type": "string", "minLength": 1}, "tools": {"type": "array", "items": tool},
            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    })


def _messages_request() -> dict[str, Any]:
    """An Anthropic Messages body, as a session's ``/messages`` reads it (``anthropic_dialect``)."""
    message = {"type": "object", "required": ["role", "content"],
               "properties": {"role": {"enum": ["user", "assistant"]}, "content": {"type": "string"}}}
    tool = {"type": "object", "required": ["name", "input_schema"],  # a client tool (server tools are refused)
            "properties": {"name": {"type": "string", "minLength": 1}, "description": {"type": ["string", "null"]},
                           "input_schema": {"type": "object"}}}
    return nullable_optionals({
        "type": "object", "required": ["max_tokens", "messages"], "description": DIALECT_EXTRAS,
        "properties": {
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
            "messages": {"type": "array", "minItems": 1, "items": message},
            "system": {"type": "string"}, "stop_sequences": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "temperature": {"type": "number", "minimum": 0, "maximum": 1}, "stream": {"type": "boolean"},
            "tools": {"type": "array", "items": tool},
        },
    })


SESSION_SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop", "top_k",
                         "user", "metadata", "parallel_tool_calls")


def _session_sampling(chat: dict[str, Any]) -> dict[str, Any]:
    """A session's ``sampling``: sampling arguments forced on every call it answers, checked when it opens
    (``sessions.session_sampling``); one reply a call, and a timeout of at least a second."""
    properties = {key: chat["properties"][key] for key in SESSION_SAMPLING_KEYS}
    properties["n"] = {"anyOf": [{"const": 1}, {"type": "null"}]}
    properties["timeout"] = {"anyOf": [{"type": "number", "minimum": 1, "maximum": 86_400}, {"type": "null"}]}
    return {"type": "object", "additionalProperties": False, "properties": properties}


def _session_and_weight_paths(chat: dict[str, Any], channels: list[str]) -> dict[str, Any]:
    """Sessions (``bridges.server.sessions``) and weight pushes (``bridges.server.weights``)."""
    session_id = {"name": "session", "in": "path", "required": True, "schema": {"type": "string"}}
    opened = {"type": "object", "additionalProperties": False,
              "properties": {"max_calls": {"type": "integer", "minimum": 1, "maximum": 1024},
                             "max_sampled_tokens": {"type": "integer", "minimum": 1, "maximum": 1_048_576},
                             "max_prompt_tokens": {"type": "integer", "minimum": 1, "maximum": 4_194_304},
                             "sampling": _session_sampling(chat)}}
    join = {"type": "object", "required": ["host", "port", "prefix", "backend"],
            "properties": {"host": {"type": "string"}, "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                           "prefix": {"type": "string", "minLength": 1, "maxLength": 200},
                           "backend": {"enum": [c for c in channels if c != "http"]},
                           "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 600}}}
    weights = {"required": True, "content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        "application/json": {"schema": {"type": "object", "required": ["channel", "kind", "version", "tensors"]}}}}

    def op(name: str, answer: str, body: dict[str, Any] | None = None, params: list[Any] | None = None,
           status: str = "200") -> dict[str, Any]:
        operation: dict[str, Any] = {"operationId": name, "responses": _responses(answer, status)}
        if body is not None:
            operation["requestBody"] = body
        if params:
            operation["parameters"] = params
        return operation

    open_session = op("open_session", "the session's id and base URLs", {**_json_body(opened), "required": False},
                      status="201")  # no body at all opens a session with the defaults
    created = open_session["responses"]["201"]
    created["content"] = {"application/json": {"schema": {
        "type": "object", "required": ["id", "base_url", "anthropic_base_url"],
        "properties": {"id": {"type": "string"}, "base_url": {"type": "string"}, "anthropic_base_url": {"type": "string"}}}}}
    # what a client does next with the session it opened (the fuzzer's stateful phase follows these)
    created["links"] = {name: {"operationId": name, "parameters": {"session": "$response.body#/id"}}
                        for name in ("session_record", "close_session", "session_chat", "session_responses",
                                     "session_messages", "session_models")}
    return {
        "/v1/sessions": {"post": open_session},
        "/v1/sessions/{session}": {"get": op("session_record", "the session's record", params=[session_id]),
                                   "delete": op("close_session", "the closed session's record", params=[session_id])},
        # the session decides the model (any name is taken) and samples one reply a call
        "/s/{session}/v1/chat/completions": {"post": op("session_chat", "a chat completion", _json_body(
            {**chat, "required": ["messages"], "properties": {**chat["properties"], "model": {"type": ["string", "null"]},
                                                              "n": {"anyOf": [{"const": 1}, {"type": "null"}]}}}),
            [session_id])},
        "/s/{session}/v1/responses": {"post": op("session_responses", "a response", _json_body(_responses_request()), [session_id])},
        "/s/{session}/v1/messages": {"post": op("session_messages", "a message", _json_body(_messages_request()), [session_id])},
        "/s/{session}/v1/models": {"get": op("session_models", "the session's model", params=[session_id])},
        "/v1/weights": {"post": op("push_weights", "the new weight version", weights)},
        "/v1/weights/channel": {"post": op("join_weight_channel", "the channel being joined", _json_body(join))},
    }


def openapi_document(model_names: list[str], max_n: int, vocabulary: int,
                     channels: tuple[str, ...] = ("http", "gloo")) -> dict[str, Any]:
    """The OpenAPI 3.1 description of every endpoint the server answers (``vocabulary``: the tokenizer's
    size, which bounds the token ids a completion prompt may hold; ``channels``: how it takes weights)."""
    chat, completion = _request_bodies(model_names, max_n, vocabulary)

    def post(operation: str, body: dict[str, Any], answer: str) -> dict[str, Any]:
        return {
            "post": {
                "operationId": operation,
                "requestBody": _json_body(body),
                "responses": _responses(answer),
            }
        }

    model_parameter = {"name": "model", "in": "path", "required": True,
                       "schema": {"type": "string", "enum": list(model_names)}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "rl-bridges engine server", "version": "0.1.0"},
        "paths": {
            "/v1/chat/completions": post("chat", chat, "a chat completion"),
            "/v1/completions": post("completions", completion, "a text completion"),
            "/v1/models": {
                "get": {"operationId": "models", "responses": _responses("the served model names")}
            },
            "/v1/models/{model}": {
                "get": {
                    "operationId": "model",
                    "parameters": [model_parameter],
                    "responses": _responses("one served model"),
                }
            },
            "/health": {"get": {"operationId": "health", "responses": _responses("the server is up")}},
            **_session_and_weight_paths(chat, list(channels)),
        },
    }
