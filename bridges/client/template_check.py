"""What a model's tokenizer and chat template mean for token-exact training, found before training.

``check_template(tokenizer)`` renders one synthetic conversation (a system prompt, tools, a reply
with reasoning, a tool call, its result, a final answer and a follow-up question) and answers:

- *ledger*: replaying the conversation through ``EngineClient`` (an engine that samples exactly the
  template's own text for each reply), does every turn's prompt extend the previous prompt + sampled
  ids, and does it equal a fresh render? A turn that cannot be bridged is re-rendered in full, and
  a trainer then sees a prompt the model never continued from: unsafe.
- *history*: does the template print earlier turns the same way once the conversation moves on?
  Qwen3 drops old reasoning, Mistral moves the tool list and system prompt to the last user turn.
  The ledger still trains on what was sampled, but a re-render drifts from it: reported as drift
  by design (exit 1: a client without a ledger would train on the wrong tokens).
- *end of turn*: which ids close an assistant turn, which of them the engine must sample and which
  the ledger appends itself; whether the template prints BOS and the tokenizer would add another.
- *tool calls and reasoning*: the detected family, and whether our parser reads back the tool calls
  (and the reasoning) the template prints.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from bridges.client.families import ModelFamily, resolve_family
from bridges.client.ledger import tools_key
from bridges.client.rendering import ChatRenderer, ChatTemplateError
from bridges.client.responses import split_reasoning
from bridges.envs.types import Sample, SamplingParams

_TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up.", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]
_CALL = {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "a"}'}}
_TOOLS_KEY = tools_key(_TOOLS)
_SYSTEM = {"role": "system", "content": "You are a careful assistant."}


def synthetic_conversation(reasoning: bool) -> list[dict[str, Any]]:
    """system, user, reply (with reasoning when the family has it), user, tool call, result, answer, user."""
    first: dict[str, Any] = {"role": "assistant", "content": "Hello! How can I help?"}
    if reasoning:
        first["reasoning_content"] = "The user greets me."
    return [
        _SYSTEM,
        {"role": "user", "content": "Hi there."},
        first,
        {"role": "user", "content": "What is stored under a?"},
        {"role": "assistant", "content": None, "tool_calls": [_CALL]},
        {"role": "tool", "tool_call_id": "call_0", "content": '{"value": 42}'},
        {"role": "assistant", "content": "It is 42."},
        {"role": "user", "content": "Thanks."},
    ]


@dataclass
class TemplateReport:
    family: str
    tool_format: str
    reasoning_markers: list[str] | None
    ledger_extends: bool = True
    ledger_breaks: list[str] = field(default_factory=list)
    history_rewritten: bool = False
    rewrites: list[str] = field(default_factory=list)
    engine_must_emit: list[str] = field(default_factory=list)
    ledger_appends: list[str] = field(default_factory=list)
    bos: str = ""
    tool_round_trip: bool = False
    tool_round_trip_detail: str = ""
    reasoning_round_trip: bool | None = None
    forced_opener_matches: bool = False
    error: str | None = None

    @property
    def safe(self) -> bool:
        return (
            self.error is None and self.ledger_extends and self.tool_round_trip and not self.history_rewritten
        )

    def verdict(self) -> str:
        """One line: the verdict and its reason."""
        if self.error is not None:
            return f"cannot check the chat template: {self.error}"
        head = f"{self.family} family, {self.tool_format} tool calls"
        if not self.ledger_extends:
            return f"unsafe: the ledger cannot extend some turns ({self.ledger_breaks[0]}); {head}"
        if not self.tool_round_trip:
            return f"tool calls will not parse: {self.tool_round_trip_detail}; {head}"
        if self.history_rewritten:
            return (f"drift by design: the template rewrites history ({self.rewrites[0]}); training stays "
                    f"token-exact through the ledger, re-rendered prompts would not; {head}")
        return f"safe: prefix-preserving, ledger extends every turn, tool calls round-trip; {head}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "safe": self.safe, "verdict": self.verdict()}


class _ReplayEngine:
    """An ``Engine`` whose samples are the template's own text of the next scripted reply (plus the
    end-of-turn id): the conversation a perfectly canonical model would have produced."""

    name = "replay"
    weight_version = 0
    max_model_len = None

    def __init__(self, tokenizer: Any, replies: list[list[int]]) -> None:
        self.tokenizer, self.replies = tokenizer, replies

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        ids = self.replies.pop(0)
        return [Sample(list(ids), [0.0] * len(ids), "stop")]

    async def aclose(self) -> None:
        return None


def _reply_ids(renderer: ChatRenderer, messages: list[dict[str, Any]], index: int) -> list[int] | None:
    """What the model must sample for ``messages[index]``: the template's text of it after the
    generation prompt, plus the first closing id (None when the reply is not a suffix of the prompt)."""
    prompt = renderer.render_text(messages[:index], _TOOLS, True)
    whole = renderer.render_text(messages[: index + 1], _TOOLS, False)
    if not whole.startswith(prompt):
        return None
    dummy = renderer.dummy(_TOOLS, _TOOLS_KEY)
    closing_text = renderer.decode(list(dummy.closing)) if dummy is not None else ""
    reply = whole[len(prompt) :]
    if closing_text and reply.endswith(closing_text):
        reply = reply[: -len(closing_text)]
    closing = list(dummy.closing[:1]) if dummy is not None else []
    return renderer.encode(reply) + closing


async def _replay(
    renderer: ChatRenderer, family: ModelFamily, messages: list[dict[str, Any]], report: TemplateReport
) -> None:
    """Send the conversation through EngineClient turn by turn; record turns that do not extend."""
    from bridges.client.engine_client import EngineClient

    tokenizer = renderer.tokenizer
    replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    scripted: list[list[int]] = []
    for at in replies:
        ids = _reply_ids(renderer, messages, at)
        if ids is None:
            report.ledger_extends = False
            report.ledger_breaks.append(f"message {at}: the reply is not printed after the generation prompt")
            return
        scripted.append(ids)
    engine = _ReplayEngine(tokenizer, scripted)
    client = EngineClient(engine, family=family.name, tool_parser=family.tool_format)
    sent: list[dict[str, Any]] = []  # what an agent sends: the client's own replies fed back
    history: list[int] | None = None
    for at, message in enumerate(messages):
        if message["role"] != "assistant":
            call_id = (
                sent[-1]["tool_calls"][0]["id"]
                if message["role"] == "tool" and sent[-1].get("tool_calls")
                else None
            )
            sent.append({**message, "tool_call_id": call_id} if call_id else message)
            continue
        response: Any = await client.chat.completions.create(model="check", messages=sent, tools=_TOOLS)
        prompt = response.prompt_token_ids
        if history is not None and prompt[: len(history)] != history:
            report.ledger_extends = False
            report.ledger_breaks.append(f"message {at}: the prompt does not extend the previous turn")
        history = prompt + response.choices[0].token_ids
        sent.append(response.choices[0].message.model_dump(exclude_none=True))


def _history(renderer: ChatRenderer, messages: list[dict[str, Any]], report: TemplateReport) -> None:
    """Whether rendering a longer conversation prints the earlier messages differently."""
    for k in range(2, len(messages)):
        shorter = renderer.render_text(messages[:k], _TOOLS, False)
        longer = renderer.render_text(messages[: k + 1], _TOOLS, False)
        if not longer.startswith(shorter):
            at = next(
                (i for i, (a, b) in enumerate(zip(shorter, longer, strict=False)) if a != b), len(shorter)
            )
            report.history_rewritten = True
            report.rewrites.append(
                f"adding message {k} ({messages[k]['role']}) reprints {shorter[at : at + 40]!r}"
            )


def _tool_round_trip(renderer: ChatRenderer, family: ModelFamily, report: TemplateReport) -> None:
    """The template prints a call; the family's parser must read back the same name and arguments."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What is stored under a?"},
        {"role": "assistant", "content": None, "tool_calls": [_CALL]},
    ]
    ids = _reply_ids(renderer, messages, 1)
    if ids is None:
        report.tool_round_trip_detail = "the template does not print the call after the generation prompt"
        return
    text = renderer.decode(ids[:-1] if ids else ids)
    parsed = family.tools.parse(text, ids)
    got = [(c.name, json.loads(c.arguments) if c.valid else c.arguments) for c in parsed.tool_calls]
    report.tool_round_trip = got == [("lookup", {"key": "a"})]
    report.tool_round_trip_detail = (
        ""
        if report.tool_round_trip
        else f"the {family.tool_format} parser read {got!r:.120} from {text!r:.120}"
    )
    report.forced_opener_matches = text.startswith(family.tools.opener("lookup"))
    if family.reasoning is not None:
        reply = [
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": "Hello.", "reasoning_content": "Greeting."},
        ]
        reply_ids = _reply_ids(renderer, reply, 1)
        reply_text = renderer.decode(reply_ids[:-1]) if reply_ids else ""
        reasoning, content = split_reasoning(reply_text, family.reasoning)
        report.reasoning_round_trip = (reasoning or "").strip() == "Greeting." and content.strip() == "Hello."


def _end_of_turn(tokenizer: Any, renderer: ChatRenderer, report: TemplateReport) -> None:
    dummy = renderer.dummy(_TOOLS, _TOOLS_KEY)
    closing = list(dummy.closing) if dummy is not None else []
    report.engine_must_emit = [renderer.decode([i]) for i in closing[:1]]
    report.ledger_appends = [renderer.decode([i]) for i in closing[1:]]
    bos = tokenizer.bos_token
    text = renderer.render_text([{"role": "user", "content": "x"}], None, True)
    prints = bool(bos) and text.startswith(bos)
    adds = bool(bos) and tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id]
    report.bos = (f"the template prints {bos}" if prints else "no BOS from the template") + (
        f"; the tokenizer would add {bos} too (the client encodes without it)" if adds and prints else "")


def check_template(
    tokenizer: Any, family: str | None = None, tool_parser: str | None = None
) -> TemplateReport:
    """The full report for ``tokenizer``'s chat template (see the module docstring)."""
    import asyncio

    chosen = resolve_family(tokenizer, family, tool_parser)
    report = TemplateReport(
        chosen.name, chosen.tool_format, list(chosen.reasoning) if chosen.reasoning else None
    )
    try:
        renderer = ChatRenderer(tokenizer)
        messages = synthetic_conversation(chosen.reasoning is not None)
        _history(renderer, messages, report)
        _tool_round_trip(renderer, chosen, report)
        _end_of_turn(tokenizer, renderer, report)
        asyncio.run(_replay(renderer, chosen, messages, report))
    except (ChatTemplateError, ValueError) as exc:
        report.error = str(exc)
    return report
