"""Model families: which tool-call format and reasoning markers a chat template speaks.

The client needs two facts about the model behind it that the OpenAI API never states: how a reply
writes a tool call (so ``tool_calls`` can be parsed out and ``tool_choice`` enforced by prefilling
the format's opener) and whether a reply may open with a reasoning block (so it can go to
``reasoning_content``). Both follow from the chat template, which is what ``detect_family`` reads:
every family's template prints markup no other family's does. ``EngineClient(family=...,
tool_parser=...)`` overrides the guess.

Reasoning is split out only when the template prints ``reasoning_content`` back: splitting it out
of a reply whose template then drops it would make every re-render of the history differ from
what was sampled, for no reader's benefit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridges.client.tool_calls import ToolFormat, get_tool_format


@dataclass(frozen=True, slots=True)
class ModelFamily:
    """What a family's chat format means for parsing replies.

    ``markers``: strings that all appear in the family's chat template and identify it.
    ``reasoning``: the (open, close) markers of a reasoning block a reply may start with, or None.
    """

    name: str
    tool_format: str
    reasoning: tuple[str, str] | None
    markers: tuple[str, ...]

    @property
    def tools(self) -> ToolFormat:
        return get_tool_format(self.tool_format)


THINK = ("<think>", "</think>")

FAMILIES: tuple[ModelFamily, ...] = (  # most specific first: detection takes the first match
    ModelFamily("deepseek_v3", "deepseek_v3", THINK, ("<｜tool▁calls▁begin｜>",)),
    ModelFamily("mistral", "mistral", None, ("[TOOL_CALLS]", "[INST]")),
    ModelFamily("llama3", "llama3_json", None, ("<|start_header_id|>", "<|eot_id|>")),
    ModelFamily("qwen3", "hermes", THINK, ("<|im_start|>", "<tool_call>", "<think>", "last_query_index")),
    ModelFamily("hermes", "hermes", THINK, ("<|im_start|>", "<tool_call>")),  # Qwen2.5, Hermes, tiny
)
GENERIC = ModelFamily("generic", "hermes", THINK, ())
"""Any other template: Hermes tool calls are the most common format among open models."""

FAMILY_NAMES: tuple[str, ...] = (*(f.name for f in FAMILIES), GENERIC.name)


def template_source(tokenizer: Any) -> str:
    """The tokenizer's chat template text ("" when it has none; the default of named templates)."""
    source = getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):
        source = source.get("default") or next(iter(source.values()), None)
    return source or ""


def detect_family(template: str) -> ModelFamily:
    """The family whose markers all appear in ``template``; ``GENERIC`` when none does."""
    for family in FAMILIES:
        if all(marker in template for marker in family.markers):
            return family
    return GENERIC


def get_family(name: str) -> ModelFamily:
    """The family called ``name``; an unknown name is one sentence listing the known ones."""
    for family in (*FAMILIES, GENERIC):
        if family.name == name:
            return family
    raise ValueError(f"unknown model family '{name}'; choose one of: {', '.join(FAMILY_NAMES)}.")


def resolve_family(tokenizer: Any, family: str | None, tool_parser: str | None) -> ModelFamily:
    """The family a client uses: named, or detected from the template; ``tool_parser`` overrides its
    tool-call format (an unknown name of either is one sentence). Its reasoning markers are dropped
    when the template never prints ``reasoning_content``."""
    template = template_source(tokenizer)
    chosen = get_family(family) if family else detect_family(template)
    tool_format = chosen.tool_format
    if tool_parser and tool_parser != "auto":
        tool_format = get_tool_format(tool_parser).name  # an unknown name raises the listing sentence
    reasoning = chosen.reasoning if "reasoning_content" in template else None
    return ModelFamily(chosen.name, tool_format, reasoning, chosen.markers)
