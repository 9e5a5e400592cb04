"""Chat-template rendering and tokenization for the client's hot path.

Why not ``tokenizer.apply_chat_template``: it re-resolves the template, rebuilds kwargs and goes
through the slow tokenizer ``__call__`` on every call (~390 us measured on the development machine). We compile the template
once, exactly the way transformers does (sandboxed jinja, ``trim_blocks``/``lstrip_blocks``, the
non-escaping ``tojson``, ``raise_exception``, ``strftime_now``, the tokenizer's special tokens as
variables), so the text is identical (a test pins it), and tokenize with the Rust backend.
Two measured shortcuts keep a render + tokenize near 20 us: jinja's ``Template.render`` flattens
a ``ChainMap`` of globals on every call (~10 us); we flatten it once. ``encode_batch_fast`` skips
offset bookkeeping (~2x faster than ``encode``).

The renderer also answers the two template questions the token ledger asks (docs/design.md §2):
- the *closing*: the ids the template prints after an assistant message's content
  (``<|im_end|>\\n`` for ChatML), of which an engine usually samples only the first;
- the *bridge*: the ids new messages (+ the generation prompt) add after an assistant turn, found by
  rendering a fixed dummy conversation with and without them and taking the difference, so
  template boundaries (default system prompt, BOS, tool header) are never duplicated. ``None``
  when the difference is not a clean suffix: the caller re-renders and counts the turn drifted.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bridges.client.segments import SegmentEncoder

DUMMY_USER = "dummy question"
DUMMY_REPLY = "dummy reply"
_USER = {"role": "user", "content": DUMMY_USER}
_REPLY = {"role": "assistant", "content": DUMMY_REPLY}
# the shortest dummy first: every message rendered costs ~3-5 us in the sandbox
_DUMMY_CANDIDATES: tuple[list[dict[str, Any]], ...] = ([_REPLY], [_USER, _REPLY])
_PROBES: tuple[list[dict[str, Any]], ...] = (
    [{"role": "user", "content": "probe"}],
    [{"role": "tool", "tool_call_id": "call_0", "content": "probe"}, {"role": "user", "content": "probe"}],
    [{"role": "system", "content": "probe"}, {"role": "user", "content": "probe"}],
)
_MAX_DUMMIES = 256


class ChatTemplateError(ValueError):
    """The chat template refused the conversation (its ``raise_exception``, or a jinja error)."""


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # transformers replaces jinja's tojson (which HTML-escapes) with plain json.dumps; so must we
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_DICT_ATTRIBUTES = frozenset(dir(dict))


@functools.lru_cache(maxsize=1)
def _environment_class() -> type:
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class ChatTemplateEnvironment(ImmutableSandboxedEnvironment):
        """transformers' sandbox, with an exact fast path for ``message.role`` on plain dicts.

        The sandbox first tries ``getattr(dict, "role")``, catches the AttributeError, then looks the
        key up; the exception costs more than the rest of the lookup and a render does dozens. A dict
        has no attribute outside ``dir(dict)``, so for other names going straight to the key gives the
        same value (or the same undefined) without it.
        """

        def getattr(self, obj: Any, attribute: str) -> Any:
            if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
                try:
                    return obj[attribute]
                except KeyError:
                    return self.undefined(obj=obj, name=attribute)
            return super().getattr(obj, attribute)

    class GenerationTag(jinja2.ext.Extension):
        # ``{% generation %}`` only marks assistant spans for masks in transformers; the text is unchanged
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_passthrough"), [], [], body).set_lineno(lineno)

        def _passthrough(self, caller: Any) -> str:
            return caller()

    ChatTemplateEnvironment.generation_extension = GenerationTag  # type: ignore[attr-defined]
    return ChatTemplateEnvironment


@functools.lru_cache(maxsize=32)
def compile_chat_template(source: str) -> Any:
    """A jinja2 ``Template`` configured like transformers' ``_compile_jinja_template``. Cached per
    source: compiling takes ~20 ms and a compiled template is immutable and safe to share, while
    clients are made per rollout in places (verl builds an agent loop, and so a client, per trajectory)."""
    import jinja2.ext

    env_class = _environment_class()
    env = env_class(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[env_class.generation_extension, jinja2.ext.loopcontrols],  # type: ignore[attr-defined]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


@dataclass(frozen=True, slots=True)
class DummyRender:
    """The fixed dummy conversation rendered once per tools key: the base of every bridge diff."""

    messages: list[dict[str, Any]]
    text: str
    ids: list[int]  # never mutated
    closing: tuple[int, ...]  # ids the template prints after an assistant message's content


class ChatRenderer:
    """Renders and tokenizes conversations with one tokenizer's chat template; cheap per call."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None) -> None:
        source = chat_template
        if source is None:
            source = getattr(tokenizer, "chat_template", None)
            if isinstance(source, dict):  # named templates: transformers uses "default"
                source = source.get("default") or next(iter(source.values()), None)
        if not source:
            raise ChatTemplateError(
                "the engine's tokenizer has no chat_template; set tokenizer.chat_template or use "
                "completions.create with a prompt."
            )
        self.tokenizer = tokenizer
        template = compile_chat_template(source)
        self._template = template
        self._env = template.environment
        self._globals = dict(template.globals)  # the ChainMap, flattened once
        self._context_class = self._env.context_class
        self._root = template.root_render_func
        self._blocks = template.blocks
        self._variables: dict[str, Any] = dict(getattr(tokenizer, "special_tokens_map", None) or {})
        self._segments = SegmentEncoder(tokenizer)
        self.__dict__["encode"] = self._segments.encode  # bound once: the hot path calls it every request
        self._decode = tokenizer.backend_tokenizer.decode
        self.eos_token_id: int | None = tokenizer.eos_token_id
        self._dummies: dict[str | None, DummyRender | None] = {}

    # -- text and ids ----------------------------------------------------------------------------
    def render_text(
        self,
        messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The exact text of ``apply_chat_template(messages, tools=tools, tokenize=False)``."""
        variables = {
            **self._globals,
            **self._variables,
            "messages": messages,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        context = self._context_class(
            self._env, variables, self._template.name, self._blocks, globals=self._globals
        )
        try:
            return self._env.concat(self._root(context))
        except Exception as exc:  # a TemplateError from raise_exception, or the template tripping
            raise ChatTemplateError(f"the chat template could not render these messages: {exc}") from exc

    def encode(self, text: str) -> list[int]:  # replaced per instance by SegmentEncoder.encode
        """Token ids of ``text`` without BOS/EOS (the template already printed any it wants)."""
        return self._segments.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept (the caller decides what to strip)."""
        return self._decode(ids, skip_special_tokens=False)

    def render_ids(
        self,
        messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        return self.encode(self.render_text(messages, tools, add_generation_prompt))

    def render_ids_shared(
        self,
        messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        memo: dict[str, list[int]],
    ) -> list[int]:
        """``render_ids`` (with the generation prompt) for one of several prefixes of a conversation:
        pieces already encoded for another prefix come from ``memo`` (see ``SegmentEncoder``)."""
        return self._segments.encode_shared(self.render_text(messages, tools, True), memo)

    # -- what the ledger asks --------------------------------------------------------------------
    def dummy(self, tools: list[dict[str, Any]] | None, tools_key: str | None) -> DummyRender | None:
        """The dummy render for these tools (cached); None when the template renders no usable dummy."""
        try:
            return self._dummies[tools_key]
        except KeyError:
            pass
        dummy = self._build_dummy(tools)
        if len(self._dummies) >= _MAX_DUMMIES:  # tools lists are few per process; stay bounded anyway
            self._dummies.clear()
        self._dummies[tools_key] = dummy
        return dummy

    def _render_dummy(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> DummyRender | None:
        try:
            text = self.render_text(messages, tools, add_generation_prompt=False)
        except ChatTemplateError:
            return None
        at = text.rfind(DUMMY_REPLY)
        if at < 0:
            return None
        ids = self.encode(text)
        closing = self.encode(text[at + len(DUMMY_REPLY) :])
        if closing and ids[-len(closing) :] != closing:
            closing = []  # the closing merges with the reply's last tokens: it cannot be appended alone
        return DummyRender(messages, text, ids, tuple(closing))

    def _suffix(self, dummy: DummyRender, probe: list[dict[str, Any]], tools: Any) -> str | None:
        try:
            text = self.render_text([*dummy.messages, *probe], tools, add_generation_prompt=True)
        except ChatTemplateError:
            return None
        return text[len(dummy.text) :] if text.startswith(dummy.text) else None

    def _build_dummy(self, tools: list[dict[str, Any]] | None) -> DummyRender | None:
        """The shortest candidate dummy whose bridges equal the full dummy's on probe messages.

        Where the full dummy cannot bridge a probe at all (a template that moves the tool list or
        the system prompt to the last user turn re-renders the dummy's own user turn), a shorter
        dummy that can is taken: its bridge is how the template prints the new messages.
        """
        reference = self._render_dummy(_DUMMY_CANDIDATES[-1], tools)
        if reference is None:
            return None
        for candidate in _DUMMY_CANDIDATES[:-1]:
            short = self._render_dummy(candidate, tools)
            if short is None or short.closing != reference.closing:
                continue
            if all(self._bridges_like(short, reference, probe, tools) for probe in _PROBES):
                return short
        return reference

    def _bridges_like(self, short: DummyRender, reference: DummyRender, probe: Any, tools: Any) -> bool:
        bridge = self._suffix(short, probe, tools)
        if bridge is None:
            return False
        expected = self._suffix(reference, probe, tools)
        return expected is None or bridge == expected

    def closing_ids(
        self,
        sampled: Sequence[int],
        finish_reason: str,
        tools: list[dict[str, Any]] | None,
        tools_key: str | None,
    ) -> tuple[int, ...]:
        """The end-of-turn ids the template prints that the engine did not sample.

        A turn that stopped on ``<|im_end|>`` needs only the trailing ``\\n``; a turn cut by length
        or by a stop string gets the whole ``<|im_end|>\\n`` (never a splice). These ids get mask 0.
        """
        dummy = self.dummy(tools, tools_key)
        if dummy is None or not dummy.closing:
            return ()
        closing = dummy.closing
        if finish_reason == "stop" and sampled:
            if sampled[-1] == closing[0] and closing[0] not in closing[1:]:
                # the common case: the engine sampled the end-of-turn token, and no longer overlap can
                # exist because every longer prefix of the closing ends in a different id
                return closing[1:]
            for k in range(min(len(closing), len(sampled)), 0, -1):
                if tuple(sampled[-k:]) == closing[:k]:
                    return closing[k:]
        return closing

    def bridge_ids(
        self,
        new_messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tools_key: str | None,
    ) -> list[int] | None:
        """Ids that ``new_messages`` + the generation prompt add after a closed assistant turn.

        None when the difference is not a clean suffix (the template re-rendered the dummy history
        differently once new messages followed, or tokenization merged across the boundary).
        """
        dummy = self.dummy(tools, tools_key)
        if dummy is None:
            return None
        try:
            text = self.render_text([*dummy.messages, *new_messages], tools, add_generation_prompt=True)
        except ChatTemplateError:  # this role order is refused after the dummy: the full render decides
            return None
        if not text.startswith(dummy.text):
            return None
        suffix = text[len(dummy.text) :]
        if self._segments.starts_with_split_token(suffix):
            return self.encode(suffix)  # split out first: tokenizes the same with or without the dummy
        ids = self.encode(text)
        n = len(dummy.ids)
        if ids[:n] != dummy.ids:
            return None
        return ids[n:]
