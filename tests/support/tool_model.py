"""A copy of the tiny model fine-tuned to really call a tool, shared by every suite that needs one.

A random tiny model never emits well-formed tool-call markup, so a tool round trip would be
untestable on real generations. The session fixture overfits a copy of the tiny model (plain torch,
AdamW) on one fixed conversation: for the add-tool prompt, greedy decoding emits
``<tool_call>\\n{"name": "add", "arguments": {"a": 2, "b": 3}}\\n</tool_call><|im_end|>``, and after
the tool result ``The sum is 5.<|im_end|>``. Training stops as soon as greedy decoding reproduces
both (usually ~120 steps); the result is cached under BRIDGES_CACHE_DIR. Import the fixtures into a
suite's conftest to use them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
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
