"""OpenAI request arguments -> engine sampling parameters, refusing what an engine cannot honour.

The rule (docs/design.md §2): an argument is either honoured, a documented no-op (it changes nothing a
local engine does: ``user``, ``metadata``, ``store=False``...), or refused with
``openai.BadRequestError`` naming it. Silently dropping ``response_format`` or a penalty would make
an evaluation quietly differ from the hosted run it is compared with.

Names the SDK's ``create`` does not know at all raise ``TypeError``, exactly as the SDK would.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from openai import NotGiven, Omit
from openai.resources.chat.completions import AsyncCompletions as _SDKChatCompletions
from openai.resources.completions import AsyncCompletions as _SDKCompletions

from bridges.client.api_errors import bad_request
from bridges.envs.types import MAX_TOP_LOGPROBS, SamplingParams

CHAT_PATH = "/chat/completions"
COMPLETIONS_PATH = "/completions"

_CHAT_SDK_PARAMS = frozenset(inspect.signature(_SDKChatCompletions.create).parameters) - {"self"}
_COMPLETION_SDK_PARAMS = frozenset(inspect.signature(_SDKCompletions.create).parameters) - {"self"}
CHAT_EXTRA_BODY_KEYS = ("top_k", "stop_token_ids", "return_drift", "return_token_ids", "declared_tools_only")
COMPLETION_EXTRA_BODY_KEYS = ("top_k", "stop_token_ids", "return_token_ids")
NO_OPS = frozenset({"user", "metadata", "parallel_tool_calls", "prompt_cache_key", "safety_identifier"})
_IGNORED = frozenset({"extra_headers", "extra_query"})  # transport-level: nothing to send them over
_ZERO_OK = frozenset({"presence_penalty", "frequency_penalty"})
_FALSE_OK = frozenset({"store", "echo"})
ROLES = ("system", "user", "assistant", "tool")
_ROLE_SET = frozenset(ROLES)
TEXT_PART_TYPES = ("text", "input_text", "output_text")
MAX_TEMPERATURE = 2.0  # OpenAI's range


def is_absent(value: Any) -> bool:
    return value is None or isinstance(value, (NotGiven, Omit))


@dataclass(slots=True)
class Streaming:
    """``stream=True`` and its ``stream_options``: whether the last chunk reports usage."""

    include_usage: bool = False


@dataclass(slots=True)
class ChatRequest:
    messages: list[Any]
    model: str
    n: int = 1
    tools: list[dict[str, Any]] | None = None
    tool_choice: str = "auto"  # "auto", "none", "required" or "function" (``tool_name`` then names it)
    tool_name: str | None = None
    max_tokens: int | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    logprobs: bool = False
    return_drift: bool = False
    # a call to a name the request never declared (or to no name: a broken <tool_call>) is left out of
    # the reply, which is then the model's text: what an agent framework needs (it fails on such a call
    # with "Tool not found"). Off by default, as in vLLM: an environment answers such a call with an error
    declared_tools_only: bool = False
    timeout: float | None = None
    stream: Streaming | None = None
    stream_options: Any = None

    @property
    def parse_tools(self) -> bool:
        return self.tools is not None and self.tool_choice != "none"


@dataclass(slots=True)
class CompletionRequest:
    prompt: str | list[int]
    model: str
    n: int = 1
    max_tokens: int = 16  # the OpenAI (and vLLM) default for completions
    params: SamplingParams = field(default_factory=SamplingParams)
    logprobs: bool = False
    timeout: float | None = None
    stream: Streaming | None = None
    stream_options: Any = None


def _bad(message: str, param: str, path: str) -> Exception:
    return bad_request(message, param=param, path=path)


def integral(value: Any) -> int | None:
    """``value`` as an int when it is one, a float such as 2.0 included (JSON does not tell 2 from 2.0,
    and JSON Schema's ``integer``, which the server's OpenAPI document uses, admits both); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _int(name: str, value: Any, path: str, minimum: int, maximum: int = 2**63 - 1) -> int:
    number = integral(value)
    if number is None or not minimum <= number <= maximum:
        raise _bad(f"'{name}' must be an integer from {minimum} to {maximum}, got {value!r:.40}.", name, path)
    return number


def _number(name: str, value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"'{name}' must be a finite number, got {value!r:.40}.", name, path)
    return float(value)


def _temperature(value: Any, path: str) -> float:
    temperature = _number("temperature", value, path)
    if not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise _bad(
            f"'temperature' must be between 0 and {MAX_TEMPERATURE:g}, got {value!r}.", "temperature", path
        )
    return temperature


def check_text(value: str, param: str, path: str) -> None:
    """Text a tokenizer can encode: an unpaired surrogate (a lone \\ud800 escape in JSON) cannot."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(
            f"'{param}' holds an unpaired UTF-16 surrogate, which is not valid text.", param, path
        ) from None


def _check_content(content: Any, param: str, path: str) -> None:
    if content is None:
        return
    if isinstance(content, str):
        check_text(content, param, path)
        return
    if not isinstance(content, (list, tuple)):
        raise _bad(
            f"'{param}' must be a string, a list of text parts or null, got {type(content).__name__}.",
            param,
            path,
        )
    for i, part in enumerate(content):
        where = f"{param}[{i}]"
        kind = _field(part, "type")
        if kind not in TEXT_PART_TYPES:
            raise _bad(
                f"'{where}' is a {kind!r:.40} part; this engine takes text only (type 'text').", where, path
            )
        text = _field(part, "text")
        if not isinstance(text, str):
            raise _bad(f"'{where}.text' must be a string.", f"{where}.text", path)
        check_text(text, f"{where}.text", path)


def _field(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _tools(value: Any, path: str) -> list[dict[str, Any]] | None:
    """Tool definitions as dicts: a list of {"type": "function", "function": {"name": ...}}."""
    if not isinstance(value, (list, tuple)):
        raise _bad("'tools' must be a list of tool definitions.", "tools", path)
    tools = [t.model_dump(exclude_none=True) if hasattr(t, "model_dump") else t for t in value]
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(function, dict) and tool.get("type") == "function" and _well_typed(function, _FUNCTION_TYPES)
                and function.get("name")):
            raise _bad(
                f"'tools[{i}]' must be {{'type': 'function', 'function': {{'name': ..., 'description': ..., "
                "'parameters': {...}}}}} with a non-empty name.",
                f"tools[{i}]",
                path,
            )
        check_text(json.dumps(tool, ensure_ascii=False), f"tools[{i}]", path)
    return tools or None


_FUNCTION_TYPES: dict[str, Any] = {"name": str, "description": str, "parameters": dict, "strict": bool}
# the no-op arguments change nothing a local engine does, but a value of the wrong type is still refused
_NO_OP_TYPES: dict[str, Any] = {"user": str, "metadata": dict, "parallel_tool_calls": bool, "prompt_cache_key": str,
                                "safety_identifier": str}


def _well_typed(obj: dict[str, Any], types: dict[str, Any]) -> bool:
    """Each listed key, when present and not null, of its type (a bool is no other type)."""
    for key, kind in types.items():
        value = obj.get(key)
        if value is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
            return False
    return True


def check_messages(messages: list[Any], path: str) -> None:
    """Every message has a known role, text content and readable tool calls, or a 400 naming the field.

    On every call's hot path: a plain dict with a known role and ASCII text and no tool calls (most
    messages; ``"tool_calls": None``, as verifiers writes its replies, is none) is accepted after
    three lookups; anything else takes the full check.
    """
    for i, message in enumerate(messages):
        if type(message) is dict and message.get("role") in _ROLE_SET and message.get("tool_calls") is None:
            content = message.get("content")
            if type(content) is str and content.isascii():
                continue
        where = f"messages[{i}]"
        if not isinstance(message, dict) and not hasattr(message, "role"):
            raise _bad(f"'{where}' must be a message object, got {type(message).__name__}.", where, path)
        role = _field(message, "role")
        if role not in ROLES:
            raise _bad(
                f"'{where}.role' must be one of {', '.join(ROLES)}, got {role!r:.40}.", f"{where}.role", path
            )
        _check_content(_field(message, "content"), f"{where}.content", path)
        for key in ("name", "tool_call_id", "reasoning_content"):
            value = _field(message, key)
            if value is not None and not isinstance(value, str):
                raise _bad(f"'{where}.{key}' must be a string.", f"{where}.{key}", path)
        calls = _field(message, "tool_calls")
        if calls is not None and not isinstance(calls, (list, tuple)):
            raise _bad(f"'{where}.tool_calls' must be a list.", f"{where}.tool_calls", path)
        for j, call in enumerate(calls or []):
            function = _field(call, "function")
            name = _field(function, "name") if function is not None else None
            arguments = _field(function, "arguments") if function is not None else None
            if not isinstance(name, str) or not isinstance(arguments, str | dict | None):
                raise _bad(
                    f"'{where}.tool_calls[{j}]' needs a function with a string name and string arguments.",
                    f"{where}.tool_calls[{j}]",
                    path,
                )
            check_text(name, f"{where}.tool_calls[{j}].function.name", path)
            if isinstance(arguments, str):
                check_text(arguments, f"{where}.tool_calls[{j}].function.arguments", path)


def _stop(value: Any, path: str) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, (list, tuple)) and all(isinstance(s, str) and s for s in value):
        return list(value)
    raise _bad(f"'stop' must be a string or a list of non-empty strings, got {value!r}.", "stop", path)


MAX_TIMEOUT_S = 86_400.0


def _timeout(value: Any, path: str) -> float | None:
    """Seconds a call may take: a finite number above 0 (a day at most), or an httpx ``Timeout`` (its read
    timeout bounds the answer). NaN would never time out and 0 or less would time out at once: refused."""
    if is_absent(value):
        return None
    read = value if isinstance(value, (int, float)) else getattr(value, "read", None)
    if read is None and not isinstance(value, (str, list, dict)):
        return None  # an httpx Timeout without a read timeout: no bound
    if isinstance(read, bool) or not isinstance(read, (int, float)) or not 0 < read <= MAX_TIMEOUT_S:
        raise _bad(f"'timeout' must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:.0f}, got {value!r:.40}.",
                   "timeout", path)
    return float(read)


def _refuse(name: str, value: Any, path: str) -> Exception:
    return _bad(
        f"'{name}'={value!r} is not supported by EngineClient: a local engine cannot honour it "
        f"(remove it, or use a hosted endpoint through adapters.openai).",
        name,
        path,
    )


def _apply_extra_body(
    extra: Any, params: SamplingParams, path: str, allowed: tuple[str, ...]
) -> frozenset[str]:
    """Engine knobs passed the vLLM way (``extra_body={"top_k": 20}``); returns the flags set true
    (``return_drift``, ``declared_tools_only``)."""
    if not isinstance(extra, dict):
        raise _bad(f"'extra_body' must be a dict, got {type(extra).__name__}.", "extra_body", path)
    flags: set[str] = set()
    for key, value in extra.items():
        if key not in allowed:
            raise _bad(
                f"extra_body key '{key}' is not supported by EngineClient; supported keys: {', '.join(allowed)}.",
                key,
                path,
            )
        if value is None or key == "return_token_ids":  # token ids are always returned
            continue
        if key == "top_k":
            top_k = integral(value)
            if top_k is None or top_k < -1:
                raise _bad(
                    f"'top_k' must be -1 (disabled) or a positive integer, got {value!r}.", "top_k", path
                )
            params.top_k = top_k if top_k > 0 else -1
        elif key == "stop_token_ids":
            ids = [integral(i) for i in value] if isinstance(value, (list, tuple)) else [None]
            if any(i is None for i in ids):
                raise _bad(
                    f"'stop_token_ids' must be a list of token ids, got {value!r}.", "stop_token_ids", path
                )
            params.stop_token_ids = [i for i in ids if i is not None]
        elif key in ("return_drift", "declared_tools_only"):
            if not isinstance(value, bool):
                raise _bad(f"'{key}' must be a boolean, got {value!r:.40}.", key, path)
            if value:
                flags.add(key)
    return frozenset(flags)


def _check_other(name: str, value: Any, sdk_params: frozenset[str], path: str) -> None:
    """Everything without its own handling: a no-op, a default value, or refused by name."""
    if name not in sdk_params:
        raise TypeError(f"create() got an unexpected keyword argument '{name}'")
    if name in NO_OPS and not _well_typed({name: value}, _NO_OP_TYPES) or (
            name == "metadata" and isinstance(value, dict) and not all(isinstance(v, str) for v in value.values())):
        raise _bad(f"'{name}' must be {'an object of strings' if name == 'metadata' else _NO_OP_TYPES[name].__name__}.",
                   name, path)
    if name in NO_OPS or name in _IGNORED or is_absent(value):
        return
    if name in _FALSE_OK and value is False:
        return
    if name in _ZERO_OK and value == 0:
        return
    raise _refuse(name, value, path)


def _stream_option(name: str, value: Any, request: ChatRequest | CompletionRequest, path: str) -> bool:
    """``stream`` and ``stream_options`` into ``request``; False when ``name`` is neither."""
    if name == "stream":
        if not isinstance(value, bool):
            raise _bad(f"'stream' must be a boolean, got {value!r:.40}.", name, path)
        request.stream = Streaming() if value else None
    elif name == "stream_options":
        request.stream_options = value
    else:
        return False
    return True


def _finish_streaming(request: ChatRequest | CompletionRequest, path: str) -> None:
    """``stream_options`` is only valid with ``stream=True`` (as on OpenAI), and holds only known keys."""
    options = request.stream_options
    if options is None:
        return
    if request.stream is None:
        raise _bad("'stream_options' is only allowed when 'stream' is true.", "stream_options", path)
    if not isinstance(options, dict):
        raise _bad("'stream_options' must be an object.", "stream_options", path)
    for key, value in options.items():
        if key == "include_usage" and isinstance(value, bool):
            request.stream.include_usage = value
        elif key == "include_obfuscation" and isinstance(value, bool):
            continue  # padding against side channels on a network; nothing to hide in-process
        else:
            raise _bad(
                f"'stream_options.{key}'={value!r:.40} is not supported; use include_usage (a boolean).",
                f"stream_options.{key}",
                path,
            )


def _top_logprobs(value: Any, path: str, name: str = "top_logprobs") -> int:
    return _int(name, value, path, 0, MAX_TOP_LOGPROBS)


def _tool_choice(value: Any, request: ChatRequest, path: str) -> None:
    """``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function", "function": {"name": ...}}``."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(exclude_none=True)
    if value in ("auto", "none", "required"):
        request.tool_choice = value
        return
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(name, str):
        raise _bad(
            f"'tool_choice' must be 'none', 'auto', 'required' or {{'type': 'function', 'function': "
            f"{{'name': ...}}}}, got {value!r:.60}.",
            "tool_choice",
            path,
        )
    request.tool_choice, request.tool_name = "function", name


def _finish_tools(request: ChatRequest, path: str) -> None:
    """A forced tool call needs tools, and a named one must be among them."""
    if request.tool_choice in ("auto", "none"):
        return
    if not request.tools:
        raise _bad(f"'tool_choice'={request.tool_choice!r} needs 'tools' to call.", "tool_choice", path)
    if request.tool_choice == "required" and len(request.tools) == 1:
        # one declared tool: the only call allowed is to it, so its name is prefilled too (what a
        # constrained decoder would force), and the model writes only the arguments
        request.tool_name = request.tools[0]["function"]["name"]
    if request.tool_name is not None:
        names = [t["function"]["name"] for t in request.tools]
        if request.tool_name not in names:
            raise _bad(
                f"'tool_choice' names the function {request.tool_name!r:.60}, which is not among the "
                f"tools ({', '.join(names)}).",
                "tool_choice",
                path,
            )


def _sampling_option(name: str, value: Any, params: SamplingParams, path: str) -> bool:
    """The sampling arguments both endpoints share, into ``params``; False when ``name`` is not one."""
    if name == "temperature":
        params.temperature = _temperature(value, path)
    elif name == "top_p":
        params.top_p = _number(name, value, path)
        if not 0.0 < params.top_p <= 1.0:
            raise _bad(f"'top_p' must be in (0, 1], got {value!r}.", name, path)
    elif name == "stop":
        params.stop = _stop(value, path)
    elif name == "seed":
        params.seed = _int(name, value, path, -(2**63))
    else:
        return False
    return True


def _required(kwargs: dict[str, Any], first: str) -> tuple[Any, str]:
    """``first`` (messages or prompt) and ``model``, as the SDK's own signature demands them."""
    value, model = kwargs.get(first), kwargs.get("model")
    if value is None or model is None:
        missing = first if value is None else "model"
        raise TypeError(f"create() missing 1 required keyword-only argument: '{missing}'")
    return value, str(model)


def _chat_messages(messages: Any, path: str) -> list[Any]:
    if not isinstance(messages, list):
        if isinstance(messages, (str, bytes, dict)) or not hasattr(messages, "__iter__"):
            raise _bad("'messages' must be a list of chat messages.", "messages", path)
        messages = list(messages)
    if not messages:
        raise _bad("'messages' must contain at least one message.", "messages", path)
    check_messages(messages, path)
    return messages


def _chat_option(name: str, value: Any, request: ChatRequest, path: str) -> None:
    """One ``chat.completions.create`` argument (present, not the messages or model) into ``request``."""
    if _sampling_option(name, value, request.params, path) or _stream_option(name, value, request, path):
        return
    if name in ("max_tokens", "max_completion_tokens"):
        tokens = _int(name, value, path, 1)  # max_completion_tokens wins when both are given
        request.max_tokens = (
            tokens if request.max_tokens is None or name == "max_completion_tokens" else request.max_tokens
        )
    elif name == "n":
        request.n = _int(name, value, path, 1)
    elif name == "tools":
        request.tools = _tools(value, path)
    elif name == "tool_choice":
        _tool_choice(value, request, path)
    elif name == "logprobs":
        if not isinstance(value, bool):
            raise _bad(f"'logprobs' must be a boolean, got {value!r}.", name, path)
        request.logprobs = value
    elif name == "top_logprobs":
        request.params.top_logprobs = _top_logprobs(value, path)
    elif name == "extra_body":
        flags = _apply_extra_body(value, request.params, path, CHAT_EXTRA_BODY_KEYS)
        request.return_drift, request.declared_tools_only = "return_drift" in flags, "declared_tools_only" in flags
    else:
        _check_other(name, value, _CHAT_SDK_PARAMS, path)


def _read_options(
    kwargs: dict[str, Any], required: str, request: ChatRequest | CompletionRequest, sdk_params: frozenset[str],
    path: str, option: Callable[[str, Any], None],
) -> None:
    """Every argument but the required one and ``model``, read the same way on both endpoints: the
    timeout, then an argument the SDK sends as absent (checked, never applied), then ``option``."""
    for name, value in kwargs.items():
        if name in (required, "model"):
            continue
        if name == "timeout":
            request.timeout = _timeout(value, path)
        elif is_absent(value):
            _check_other(name, value, sdk_params, path)
        else:
            option(name, value)


def parse_chat(kwargs: dict[str, Any]) -> ChatRequest:
    """Validate ``chat.completions.create`` keyword arguments (raises BadRequestError/TypeError)."""
    path = CHAT_PATH
    messages, model = _required(kwargs, "messages")
    request = ChatRequest(_chat_messages(messages, path), model)
    _read_options(kwargs, "messages", request, _CHAT_SDK_PARAMS, path, lambda name, value: _chat_option(name, value, request, path))
    if request.params.top_logprobs and not request.logprobs:
        raise _bad("'top_logprobs' needs 'logprobs' set to true.", "top_logprobs", path)
    _finish_tools(request, path)
    _finish_streaming(request, path)
    return request


def _completion_prompt(prompt: Any, path: str) -> str | list[int]:
    ids = [integral(i) for i in prompt] if isinstance(prompt, list) and prompt else [None]
    if all(i is not None for i in ids):
        return [i for i in ids if i is not None]
    if isinstance(prompt, str):
        check_text(prompt, "prompt", path)
        return prompt
    raise _bad(
        "'prompt' must be one string or one list of token ids (batched prompts are not supported; "
        "send one request per prompt).",
        "prompt",
        path,
    )


def _completion_option(name: str, value: Any, request: CompletionRequest, n_given: Any, path: str) -> None:
    """One ``completions.create`` argument (present, not the prompt or model) into ``request``."""
    if _sampling_option(name, value, request.params, path) or _stream_option(name, value, request, path):
        return
    if name == "max_tokens":
        request.max_tokens = _int(name, value, path, 1)
    elif name == "n":
        request.n = _int(name, value, path, 1)
    elif name == "logprobs":  # the number of alternatives per position, as on OpenAI's legacy endpoint
        request.params.top_logprobs = _top_logprobs(value, path, "logprobs")
        request.logprobs = True
    elif name == "best_of":
        if value not in (1, n_given):
            raise _refuse(name, value, path)
    elif name == "extra_body":
        _apply_extra_body(value, request.params, path, COMPLETION_EXTRA_BODY_KEYS)
    else:
        _check_other(name, value, _COMPLETION_SDK_PARAMS, path)


def parse_completion(kwargs: dict[str, Any]) -> CompletionRequest:
    """Validate ``completions.create`` keyword arguments (a single prompt: text or token ids)."""
    path = COMPLETIONS_PATH
    prompt, model = _required(kwargs, "prompt")
    request = CompletionRequest(_completion_prompt(prompt, path), model)
    _read_options(kwargs, "prompt", request, _COMPLETION_SDK_PARAMS, path,
                  lambda name, value: _completion_option(name, value, request, kwargs.get("n"), path))
    _finish_streaming(request, path)
    return request
