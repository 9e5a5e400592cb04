"""Parsers turn a model's reply into the answer a reward function compares, plus a format reward.

They follow the verifiers surface (``parse``, ``parse_answer``, ``get_format_reward_func``) so
environments written for it port unchanged. One addition matters for this library: an engine or
client that splits a leading ``<think>`` block into ``reasoning_content`` (the EngineClient does)
leaves only the answer in ``content``; ``ThinkParser`` treats such a message as already split
instead of reporting an empty answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from bridges.envs.messages import to_message_dicts


def _identity(text: str) -> str:
    return text


def _messages_with_role(completion: Any, role: str) -> list[dict[str, Any]]:
    if isinstance(completion, str):
        return [{"role": "assistant", "content": completion}] if role == "assistant" else []
    return [m for m in to_message_dicts(completion) if m["role"] == role]


class Parser:
    """Extracts the answer from a reply with ``extract_fn`` (identity by default)."""

    def __init__(self, extract_fn: Callable[[str], Any] = _identity) -> None:
        self.extract_fn = extract_fn

    def parse(self, text: str) -> Any:
        return self.extract_fn(text)

    def parse_answer(self, completion: str | Sequence[Any]) -> Any:
        """The parsed answer of a string, or of the last assistant message of a conversation (None if none)."""
        if isinstance(completion, str):
            return self.parse(completion)
        assistants = self.get_assistant_messages(completion)
        if not assistants:
            return None
        return self.parse(assistants[-1]["content"] or "")

    def get_assistant_messages(self, completion: Any) -> list[dict[str, Any]]:
        return _messages_with_role(completion, "assistant")

    def get_user_messages(self, completion: Any) -> list[dict[str, Any]]:
        return _messages_with_role(completion, "user")

    def get_system_messages(self, completion: Any) -> list[dict[str, Any]]:
        return _messages_with_role(completion, "system")

    def get_tool_messages(self, completion: Any) -> list[dict[str, Any]]:
        return _messages_with_role(completion, "tool")

    def get_format_reward_func(self) -> Callable[..., float]:
        """A plain parser imposes no format, so every reply is well formed."""

        def format_reward(completion: Any, **kwargs: Any) -> float:
            return 1.0

        return format_reward


class XMLParser(Parser):
    """Reads ``<field>...</field>`` sections; a field may be a tuple of alternative tag names.

    ``parse`` returns a namespace with one attribute per tag name (alternatives included), ``None``
    where the tag is absent.
    """

    def __init__(
        self,
        fields: Sequence[str | tuple[str, ...]],
        answer_field: str = "answer",
        extract_fn: Callable[[str], Any] = _identity,
    ) -> None:
        super().__init__(extract_fn)
        if not fields:
            raise ValueError("XMLParser needs at least one field.")
        self._fields: list[tuple[str, ...]] = []
        for field in fields:
            names = (field,) if isinstance(field, str) else tuple(field)
            if not names or not all(isinstance(n, str) and n for n in names):
                raise ValueError(
                    f"an XMLParser field must be a tag name or a tuple of tag names, got {field!r}."
                )
            self._fields.append(names)
        self.answer_field = answer_field
        self._patterns = {
            name: re.compile(rf"<{re.escape(name)}>\s*(.*?)\s*</{re.escape(name)}>", re.DOTALL)
            for names in self._fields
            for name in names
        }

    def get_fields(self) -> list[str]:
        """The canonical (first) name of every field."""
        return [names[0] for names in self._fields]

    def parse(self, text: str, strip: bool = True, last: bool = False) -> SimpleNamespace:
        values: dict[str, Any] = {}
        for name, pattern in self._patterns.items():
            matches = pattern.findall(text)
            if not matches:
                values[name] = None
                continue
            value = matches[-1] if last else matches[0]
            values[name] = value.strip() if strip else value
        return SimpleNamespace(**values)

    def parse_answer(self, completion: str | Sequence[Any]) -> Any:
        """The answer field from a string, or from the newest assistant message that has one."""
        texts = (
            [completion]
            if isinstance(completion, str)
            else [m["content"] or "" for m in reversed(self.get_assistant_messages(completion))]
        )
        for text in texts:
            value = getattr(self.parse(text, last=True), self.answer_field, None)
            if value is not None:
                return self.extract_fn(value)
        return None

    def format(self, **kwargs: Any) -> str:
        """Render values in field order (any alternative name may be used as the keyword)."""
        parts = []
        for names in self._fields:
            for name in names:
                if name in kwargs:
                    parts.append(f"<{name}>\n{kwargs[name]}\n</{name}>")
                    break
        return "\n".join(parts)

    def get_format_str(self) -> str:
        """A description of the expected format, for a system prompt."""
        lines = [f"<{names[0]}>\n...\n</{names[0]}>" for names in self._fields]
        return "Respond in the following format:\n" + "\n".join(lines)

    def _message_format_score(self, text: str) -> float:
        stripped = text.strip()
        present = [names for names in self._fields if any(self._patterns[n].search(text) for n in names)]
        score = 0.4 * len(present) / len(self._fields)
        if present and all(
            any(re.search(rf"<{re.escape(n)}>\n.*?\n</{re.escape(n)}>", text, re.DOTALL) for n in names)
            for names in present
        ):
            score += 0.2
        if any(stripped.startswith(f"<{n}>") for n in self._fields[0]):
            score += 0.2
        if any(stripped.endswith(f"</{n}>") for n in self._fields[-1]):
            score += 0.2
        return score

    def get_format_reward_func(self) -> Callable[..., float]:
        """Mean over assistant messages of: 0.4 x share of fields present, 0.2 for newline-separated
        tags, 0.2 for starting with the first field, 0.2 for ending with the last field."""

        def format_reward(completion: Any, **kwargs: Any) -> float:
            messages = self.get_assistant_messages(completion)
            if not messages:
                return 0.0
            return sum(self._message_format_score(m["content"] or "") for m in messages) / len(messages)

        return format_reward


class ThinkParser(Parser):
    """For models that reason inside ``<think>...</think>`` before answering: the answer is what follows.

    Without a closing ``</think>`` the reply is unfinished reasoning and the answer is ``""``. A message
    whose ``reasoning_content`` was already split off by the client counts as finished reasoning.
    """

    def parse(self, text: str) -> Any:
        if "</think>" not in text:
            return ""
        return self.extract_fn(text.rsplit("</think>", 1)[-1].strip())

    def parse_answer(self, completion: str | Sequence[Any]) -> Any:
        if isinstance(completion, str):
            return self.parse(completion)
        assistants = self.get_assistant_messages(completion)
        if not assistants:
            return None
        last = assistants[-1]
        content = last["content"] or ""
        if last.get("reasoning_content") is not None and "</think>" not in content:
            return self.extract_fn(content.strip())
        return self.parse(content)

    @staticmethod
    def _well_formed(message: dict[str, Any]) -> bool:
        content = message["content"] or ""
        if message.get("reasoning_content") is not None and "<think>" not in content:
            return bool(message["reasoning_content"].strip()) and bool(content.strip())
        stripped = content.strip()
        return (
            stripped.startswith("<think>")
            and stripped.count("<think>") == 1
            and stripped.count("</think>") == 1
            and bool(stripped.split("</think>", 1)[1].strip())
        )

    def get_format_reward_func(self) -> Callable[..., float]:
        """Share of assistant messages with exactly one think block followed by a non-empty answer."""

        def format_reward(completion: Any, **kwargs: Any) -> float:
            messages = self.get_assistant_messages(completion)
            if not messages:
                return 0.0
            return sum(1.0 for m in messages if self._well_formed(m)) / len(messages)

        return format_reward


__all__ = ["Parser", "XMLParser", "ThinkParser"]
