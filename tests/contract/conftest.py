"""The contract suite's engines: a copy of the tiny model fine-tuned to really call a tool.

A random tiny model never emits well-formed tool-call markup, so the tool-call round trip would be
untestable on real generations. The session fixture overfits a copy of the tiny model (plain torch,
AdamW) on one fixed conversation: for the add-tool prompt, greedy decoding emits
``<tool_call>\\n{"name": "add", "arguments": {"a": 2, "b": 3}}\\n</tool_call><|im_end|>``, and after
the tool result ``The sum is 5.<|im_end|>``. Training stops as soon as greedy decoding reproduces
both (usually ~120 steps); the result is cached under BRIDGES_CACHE_DIR.

Every check runs over two client paths (``path`` fixture):
- ``in_process``: ``EngineClient(HFEngine(model))``;
- ``http``: the stock ``openai.AsyncOpenAI`` against ``bridges.serve`` on loopback, serving an
  ``EngineClient`` over its own ``HFEngine`` (same weights).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOL_PROMPT = [{"role": "user", "content": "What is 2 + 3? Use the add tool."}]
TOOL_CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
ANSWER_TEXT = "The sum is 5."
_RECIPE = {
    "version": 1,
    "lr": 1e-2,
    "max_steps": 300,
    "seed": 0,
    "call": TOOL_CALL_TEXT,
    "answer": ANSWER_TEXT,
}


def _training_pairs(tokenizer: Any) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids) for the tool-call turn and the answer turn after the tool result."""
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
        ],
    }
    result = {"role": "tool", "tool_call_id": "c0", "content": "5"}

    def prompt(messages: list[dict[str, Any]]) -> list[int]:
        return tokenizer.apply_chat_template(messages, tools=[ADD_TOOL], add_generation_prompt=True)[
            "input_ids"
        ]

    def target(text: str) -> list[int]:
        return tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids + [
            tokenizer.eos_token_id
        ]

    return [
        (prompt(TOOL_PROMPT), target(TOOL_CALL_TEXT)),
        (prompt([*TOOL_PROMPT, call, result]), target(ANSWER_TEXT)),
    ]


def _greedy_ok(model: Any, pairs: list[tuple[list[int], list[int]]]) -> bool:
    import torch

    with torch.no_grad():
        for prompt, target in pairs:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=len(target), do_sample=False)
            if out[0, len(prompt) :].tolist() != target:
                return False
    return True


def _fine_tune(source: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    pairs = _training_pairs(tokenizer)
    length = max(len(p) + len(t) for p, t in pairs)
    ids = torch.full((len(pairs), length), tokenizer.pad_token_id)
    labels = torch.full((len(pairs), length), -100)
    mask = torch.zeros((len(pairs), length), dtype=torch.long)
    for row, (prompt, answer) in enumerate(pairs):
        sequence = prompt + answer
        ids[row, : len(sequence)] = torch.tensor(sequence)
        labels[row, len(prompt) : len(sequence)] = torch.tensor(answer)  # loss on the reply only
        mask[row, : len(sequence)] = 1
    torch.manual_seed(_RECIPE["seed"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=_RECIPE["lr"])
    for step in range(_RECIPE["max_steps"]):
        model.train()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.05 and step % 10 == 0:
            model.eval()
            if _greedy_ok(model, pairs):
                break
    model.eval()
    if not _greedy_ok(model, pairs):
        raise RuntimeError(
            f"fine-tuning did not make greedy decoding emit the tool call (loss {loss.item():.3f})."
        )
    model.generation_config.do_sample = False
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


@pytest.fixture(scope="session")
def tool_model_path(tiny_path: Path) -> Path:
    """The fine-tuned copy (cached per recipe next to the tiny model)."""
    digest = hashlib.sha1(json.dumps([_RECIPE, str(tiny_path.name)], sort_keys=True).encode()).hexdigest()[
        :10
    ]
    target = tiny_path.parent / f"tiny-tool-{digest}"
    if (target / "config.json").exists():
        return target
    staging = tiny_path.parent / f".tiny-tool-{digest}-staging"
    shutil.rmtree(staging, ignore_errors=True)
    _fine_tune(tiny_path, staging)
    try:
        staging.rename(target)
    except OSError:  # another session finished first; its copy is identical
        shutil.rmtree(staging, ignore_errors=True)
    return target


@pytest.fixture(scope="session")
def tool_model(tool_model_path: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tool_model_path).eval(), AutoTokenizer.from_pretrained(
        tool_model_path
    )


@dataclass
class ClientPath:
    """One way of reaching the engine: ``client`` is an ``openai.AsyncOpenAI`` either way."""

    name: str
    client: Any
    tokenizer: Any


@pytest.fixture(scope="module")
def engines(tool_model: tuple[Any, Any]) -> Iterator[dict[str, Any]]:
    """One EngineClient in-process and one behind a loopback server, each over its own HFEngine."""
    from adapters.hf import HFEngine
    from bridges.client import EngineClient
    from bridges.serve import serve_in_thread

    model, tokenizer = tool_model
    local_engine = HFEngine(model, tokenizer, name="tiny-tool")
    served_engine = HFEngine(model, tokenizer, name="tiny-tool")
    server = serve_in_thread(EngineClient(served_engine, model_name="tiny-tool", request_timeout=60))
    try:
        yield {
            "in_process": EngineClient(local_engine, model_name="tiny-tool", request_timeout=60),
            "server": server,
            "tokenizer": tokenizer,
        }
    finally:
        server.close()
        local_engine.close()
        served_engine.close()


@pytest.fixture(params=["in_process", "http"])
def path(request: pytest.FixtureRequest, engines: dict[str, Any]) -> ClientPath:
    import openai

    if request.param == "in_process":
        client = engines["in_process"]
    else:  # a fresh SDK client per test: its connection pool belongs to the test's event loop
        client = openai.AsyncOpenAI(base_url=engines["server"].base_url, api_key="unused", max_retries=0)
    return ClientPath(request.param, client, engines["tokenizer"])


@dataclass(frozen=True)
class ToolCase:
    tools: list[dict[str, Any]]
    prompt: list[dict[str, Any]]
    call_text: str
    answer: str


@pytest.fixture(scope="session")
def tool_case() -> ToolCase:
    """The conversation the fine-tuned model has learned (constants shared with the tests)."""
    return ToolCase([ADD_TOOL], TOOL_PROMPT, TOOL_CALL_TEXT, ANSWER_TEXT)
