"""An environment split as the parquet file ``verl.trainer.main_ppo`` reads (``RLHFDataset``).

verl's columns: ``prompt`` (chat messages), ``data_source``, ``reward_model.ground_truth``,
``extra_info`` (``index``, ``split``, anything else) and ``agent_name``, which picks our agent loop.
The environment's full row travels as JSON in ``extra_info.bridges_row``: verl hands every column
to the loop, and the loop needs the row as the environment built it (answer, info, extra
columns), which parquet's fixed nested schema would otherwise flatten or reject.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bridges.envs.base import Environment
from bridges.envs.messages import to_message_dicts
from bridges.runtime.errors import ConfigError
from bridges.workflows.run_loop import held_out_rows

ROW_FIELD = "bridges_row"


def verl_rows(
    env: Environment, split: str, *, data_source: str, agent_name: str, limit: int = 0
) -> list[dict[str, Any]]:
    """The split's rows in verl's format; ``limit`` > 0: the eval split's first ``limit`` rows
    (``eval_examples``, the rows every backend evaluates on)."""
    if split not in ("train", "eval"):
        raise ConfigError(f"split must be 'train' or 'eval', got '{split}'.")
    dataset = env.get_dataset() if split == "train" else held_out_rows(env.get_eval_dataset(), limit)
    rows = []
    for index, row in enumerate(dataset):
        messages = [
            {"role": m["role"], "content": m["content"] or ""} for m in to_message_dicts(row["prompt"])
        ]
        rows.append(
            {
                "data_source": data_source,
                "prompt": messages,
                "ability": str(row.get("task") or "default"),
                "reward_model": {"style": "rule", "ground_truth": str(row.get("answer") or "")},
                "extra_info": {"index": index, "split": split, ROW_FIELD: json.dumps(dict(row), default=str)},
                "agent_name": agent_name,
            }
        )
    return rows


def write_verl_parquet(
    env: Environment, split: str, path: str | Path, *, data_source: str, agent_name: str, limit: int = 0
) -> Path:
    """Write the split (the eval split's first ``limit`` rows when > 0) to ``path`` (parquet); returns the path."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(verl_rows(env, split, data_source=data_source, agent_name=agent_name, limit=limit)).to_parquet(path)
    return path


def row_from_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The environment row of a verl agent-loop call (``run(sampling_params, **row)``)."""
    extra = kwargs.get("extra_info") or {}
    encoded = extra.get(ROW_FIELD) if isinstance(extra, dict) else None
    if encoded is None:
        raise ConfigError(
            "this verl row has no extra_info.bridges_row; write the data with adapters.verl.write_verl_parquet."
        )
    return json.loads(encoded)
