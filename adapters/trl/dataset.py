"""An environment's rows in TRL's conversational format, and the way back from a prompt to its row.

TRL hands a ``rollout_func`` nothing but the prompts (deep copies of the ``prompt`` column), yet a
multi-turn environment needs the whole row to respond (the secret number, the target list).
Prompts alone are ambiguous: ``guess_number`` has hundreds of rows with the same prompt and
different secrets. So ``trl_dataset`` tags the first prompt message with the row's split and
position (``ROW_KEY``: ``"train:17"``); chat templates ignore keys they do not know, and transformers drops ``None``-valued
keys before rendering, so the tag changes no token. ``RowIndex`` reads the tag back, and falls
back to matching the prompt itself for datasets a user built without ``trl_dataset``.
"""

from __future__ import annotations

import json
from typing import Any

from bridges.envs.base import Environment
from bridges.envs.messages import to_message_dicts
from bridges.runtime.errors import ConfigError

ROW_KEY = "bridges_row"
_SPLITS = ("train", "eval")


def _rows(env: Environment, split: str) -> Any:
    if split not in _SPLITS:
        raise ConfigError(f"split must be 'train' or 'eval', got '{split}'.")
    return env.get_dataset() if split == "train" else env.get_eval_dataset()


def trl_dataset(env: Environment, split: str = "train") -> Any:
    """The split as a ``datasets.Dataset`` TRL's ``GRPOTrainer`` accepts as ``train_dataset``.

    Every column the environment has stays (``answer``, ``info``, ``task``, ``example_id`` and any
    extra ones), because TRL passes every column to reward functions. ``prompt`` is the complete
    prompt (system prompt and few-shot included), with the first message tagged by row position.
    """
    dataset = _rows(env, split)

    def tag(row: dict[str, Any], index: int) -> dict[str, Any]:
        messages = to_message_dicts(row["prompt"])
        messages[0] = {**messages[0], ROW_KEY: f"{split}:{index}"}
        return {"prompt": messages}

    return dataset.map(tag, with_indices=True, desc=None)


def prompt_key(messages: Any) -> str:
    """A prompt's identity for lookup: its messages without the row tag, as canonical JSON."""
    return json.dumps(strip_row_tags(to_message_dicts(messages)), sort_keys=True)


class RowIndex:
    """Finds the environment row a TRL prompt came from (by tag, else by an unambiguous prompt)."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self._rows: dict[str, Any] = {}
        self._by_prompt: dict[str, dict[str, int | None]] = {}

    def rows(self, split: str) -> Any:
        if split not in self._rows:
            self._rows[split] = _rows(self.env, split)
        return self._rows[split]

    def _prompt_lookup(self, split: str) -> dict[str, int | None]:
        if split not in self._by_prompt:
            lookup: dict[str, int | None] = {}
            for index, row in enumerate(self.rows(split)):
                key = prompt_key(row["prompt"])
                lookup[key] = None if key in lookup else index  # None: several rows share this prompt
            self._by_prompt[split] = lookup
        return self._by_prompt[split]

    def row_for(self, prompt: list[dict[str, Any]], split: str = "train") -> dict[str, Any]:
        tag = prompt[0].get(ROW_KEY) if prompt and isinstance(prompt[0], dict) else None
        if tag is not None:
            tag_split, _, position = str(tag).partition(":")
            return dict(self.rows(tag_split)[int(position)])
        lookup = self._prompt_lookup(split)
        key = prompt_key(prompt)
        if key not in lookup:
            raise ConfigError(
                "a TRL prompt matches no row of the environment's dataset; build the trainer's "
                "train_dataset with adapters.trl.trl_dataset(env)."
            )
        index = lookup[key]
        if index is None:
            raise ConfigError(
                "a TRL prompt matches several rows of the environment's dataset with different data; "
                "build the trainer's train_dataset with adapters.trl.trl_dataset(env), which tags each row."
            )
        return dict(self.rows(split)[index])


def strip_row_tags(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the environment wrote them (the tag and the ``None`` keys Arrow adds removed)."""
    return [{k: v for k, v in m.items() if k != ROW_KEY and v is not None} for m in messages]
