"""The locally built tiny model: a real checkpoint folder, an exact tokenizer, a known chat template."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bridges.models.tiny import CHARACTERS, MARKUP_TOKENS, SPECIAL_TOKENS, build_tiny_model, tiny_model_path

TOOL_CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "reasoning_content": "need tool", "tool_calls": [TOOL_CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "18C"},
    {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
    {"role": "assistant", "content": "18C and sunny."},
]


def test_builds_once_and_reloads_through_the_auto_classes(tiny_path, bridges_cache_dir):
    assert tiny_path.parent == bridges_cache_dir
    assert tiny_model_path() == tiny_path  # cached: the same folder, not rebuilt
    config = json.loads((tiny_path / "config.json").read_text())
    assert config["model_type"] == "llama"
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (
        len(tokenizer)
        == model.config.vocab_size
        == len(SPECIAL_TOKENS) + len(MARKUP_TOKENS) + len(CHARACTERS)
    )
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 0)
    assert model.config.max_position_embeddings == 4096
    logits = model(torch.tensor([tokenizer.encode("hi")])).logits
    assert logits.shape == (1, 2, len(tokenizer)) and torch.isfinite(logits).all()


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world! 1+1=2 ~`|\\",
        "line one\n\tindented  two spaces",
        "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><tool_response>\nok\n</tool_response>',
        "<think>maybe</think>answer <not-a-token> <|im_end",
        "".join(CHARACTERS),
    ],
)
def test_tokenizer_round_trips_text_exactly(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text
    assert tiny_tokenizer.unk_token_id not in ids


def test_special_and_markup_tokens_are_single_ids(tiny_tokenizer):
    for token in [*SPECIAL_TOKENS, *MARKUP_TOKENS]:
        assert tiny_tokenizer.encode(token, add_special_tokens=False) == [
            tiny_tokenizer.convert_tokens_to_ids(token)
        ]
    assert len(tiny_tokenizer.encode("abc", add_special_tokens=False)) == 3  # character level, no BOS


def test_chat_template_renders_every_role(tiny_tokenizer):
    rendered = tiny_tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>need tool</think>"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n18C and sunny.<|im_end|>\n"
    )
    prompt = tiny_tokenizer.apply_chat_template(CONVERSATION[1:2], tokenize=False, add_generation_prompt=True)
    assert (
        prompt == "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )  # no default system
    dict_args = [
        {
            "role": "assistant",
            "content": "a",
            "tool_calls": [{"function": {"name": "g", "arguments": {"x": 1}}}],
        }
    ]
    assert tiny_tokenizer.apply_chat_template(dict_args, tokenize=False) == (
        '<|im_start|>assistant\na\n<tool_call>\n{"name": "g", "arguments": {"x": 1}}\n</tool_call><|im_end|>\n'
    )


def test_chat_template_lists_tools_in_the_system_turn(tiny_tokenizer):
    tool = {
        "type": "function",
        "function": {"name": "f", "description": "d", "parameters": {"type": "object"}},
    }
    rendered = tiny_tokenizer.apply_chat_template(CONVERSATION[:2], tools=[tool], tokenize=False)
    assert rendered == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call functions. Signatures are inside <tools></tools>:\n"
        '<tools>\n{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}\n'
        "</tools>\n\nFor each call, return a JSON object with the function name and arguments inside "
        '<tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    )


def test_tokenized_template_is_the_encoded_text(tiny_tokenizer):
    encoded = tiny_tokenizer.apply_chat_template(CONVERSATION, tokenize=True)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    text = tiny_tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert list(ids) == tiny_tokenizer.encode(text, add_special_tokens=False)


def test_same_seed_gives_identical_weights(tiny_path, tmp_path):
    cached = AutoModelForCausalLM.from_pretrained(tiny_path).state_dict()
    again = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "seed0", seed=0)).state_dict()
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "seed1", seed=1)).state_dict()
    assert cached.keys() == again.keys() == other.keys()
    assert all(torch.equal(cached[k], again[k]) for k in cached)
    assert not torch.equal(cached["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_import_bridges_is_light_and_fast():
    code = (
        "import sys, time\n"
        "start = time.perf_counter()\n"
        "import bridges\n"
        "elapsed = time.perf_counter() - start\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'openai', 'datasets') if m in sys.modules)\n"
        "print(elapsed, ','.join(heavy))\n"
    )
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True
    )
    assert time.perf_counter() - started < 30
    elapsed, heavy = out.stdout.split()[0], out.stdout.split()[1:]
    assert heavy == [], f"import bridges pulled in {heavy}"
    assert float(elapsed) < 0.5
