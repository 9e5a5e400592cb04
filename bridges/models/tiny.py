"""A tiny randomly initialised causal LM and a chat tokenizer, built locally (no download possible).

``model=tiny`` anywhere a model is named resolves here. The model is saved to a local folder and
loaded back through the ordinary ``from_pretrained`` path, so every code path that serves a real
checkpoint serves this one too.

Why the tokenizer looks the way it does:
- character level (printable ASCII + newline/tab) so any text round-trips exactly, and a random
  model starts with a ~1/100 chance per token of the right character: enough reward signal for RL
  from scratch on the toy environment;
- a BPE model with an empty merge list and no pre-tokenizer: it splits into characters ~2.5x faster
  than a regex ``Split`` pre-tokenizer (16 us vs 39 us for a short chat prompt, measured here),
  which matters for the client's per-call overhead;
- a Llama architecture, not Qwen2: transformers 5 forces its own byte-level tokenizer class on
  any ``qwen2`` checkpoint, which would silently replace this tokenizer's pipeline on reload;
- ChatML special tokens plus Hermes/Qwen2.5-style ``<tool_call>``, ``<tool_response>`` and
  ``<think>`` markup tokens, and a chat template (no default system prompt, history rendered
  verbatim, ``<think>`` kept) under which the token ledger extends with zero drift.
"""

from __future__ import annotations

import os
import string
from pathlib import Path
from typing import Any

from bridges.models.local_models import TINY_ARCHITECTURE, cached_build, save_random_model

TINY_MODEL_NAME = "tiny"
FAMILY_MODEL_NAMES = ("tiny-qwen2.5", "tiny-qwen3", "tiny-llama3", "tiny-mistral", "tiny-deepseek-v3")
_TINY_BUILD_VERSION = "1"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
CHARACTERS = list(string.printable[:95]) + ["\n", "\t"]

TINY_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call functions. Signatures are inside <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each call, return a JSON object with the function name and arguments"
    ' inside <tool_call></tool_call> tags:\\n<tool_call>\\n{"name": <function-name>, "arguments":'
    " <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- if not loop.first %}{{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content %}{{- '<think>' + message.reasoning_content + '</think>' }}{%- endif %}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- if message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set fn = tool_call.function %}{%- else %}{%- set fn = tool_call %}{%- endif %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' }}'
    "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

DEFAULT_TINY_CONFIG = TINY_ARCHITECTURE


def tiny_vocab() -> dict[str, int]:
    vocab: dict[str, int] = {}
    for token in [*SPECIAL_TOKENS, *MARKUP_TOKENS, *CHARACTERS]:
        vocab.setdefault(token, len(vocab))
    return vocab


def build_tiny_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` with the tiny chat template (imports transformers lazily)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab=tiny_vocab(), merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        model_max_length=DEFAULT_TINY_CONFIG["max_position_embeddings"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(output_dir: str | os.PathLike[str], seed: int = 0, **config_overrides: Any) -> Path:
    """Build, randomly initialise (seeded) and save the tiny model + tokenizer to ``output_dir``."""
    return save_random_model(build_tiny_tokenizer(), output_dir, seed, **config_overrides)


def tiny_model_path(seed: int = 0, **config_overrides: Any) -> Path:
    """The cached tiny model folder for this seed/config, built on first use (atomic, race-safe)."""
    key = (_TINY_BUILD_VERSION, seed, sorted(config_overrides.items()))
    return cached_build("tiny", key, lambda folder: build_tiny_model(folder, seed=seed, **config_overrides))


def is_builtin_model(model: str) -> bool:
    """``tiny`` or one of the ``tiny-<family>`` models over real vocabularies (bridges/models/family_models.py)."""
    return model == TINY_MODEL_NAME or model in FAMILY_MODEL_NAMES


def resolve_model_path(model: str) -> str:
    """``tiny``/``tiny-<family>`` -> the locally built folder; anything else (path or hub id) unchanged."""
    if model == TINY_MODEL_NAME:
        return str(tiny_model_path())
    if model in FAMILY_MODEL_NAMES:
        from bridges.models.family_models import family_model_path

        return str(family_model_path(model))
    return model
