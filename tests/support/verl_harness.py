"""verl's real agent-loop worker, driven the way ``backend=verl`` configures it, for CPU tests.

``compose`` builds verl's hydra config from exactly the overrides ``backend=verl`` launches with
(``prepare``), ``batch_of`` reads our parquet with verl's ``RLHFDataset``, ``run_worker`` runs verl's
``AgentLoopWorker`` over a server client, ``rows_of`` unpads its output per sample.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from bridges.adapters.verl.launch import prepare
from bridges.runs.config import parse_config
from bridges.runs.train_config import TrainConfig

N = 2  # rollouts per prompt


def compose(tmp_path: Path, model: Path, kind: str, *extra: str, env: str = "bridges_test_verl_env") -> Any:
    """verl's config tree, composed from exactly the overrides ``backend=verl`` would launch with."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config = parse_config(
        TrainConfig,
        [
            "backend=verl", f"env={env}", *([f"env_args.kind={kind}"] if kind else []), f"model={model}",
            f"output_dir={tmp_path}", "trainer.batch_size=2", f"trainer.group_size={N}",
            "trainer.max_completion_length=160", "verl.actor_rollout_ref.rollout.agent.num_workers=1", *extra,
        ],
    )
    command, files, _ = prepare(config)
    assert command[1:3] == ["-m", "verl.trainer.main_ppo"]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = hydra_compose(config_name="ppo_trainer", overrides=command[3:])
    return cfg, files


def batch_of(cfg: Any, files: dict[str, Path], tokenizer: Any, rows: int = 2) -> Any:
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    dataset = RLHFDataset(data_files=[str(files["train"])], tokenizer=tokenizer, config=cfg.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(rows)]))
    batch.non_tensor_batch["uid"] = np.array([f"group-{i}" for i in range(rows)], dtype=object)
    return batch.repeat(repeat_times=N, interleave=True)  # what verl's trainer does before generation


def run_worker(cfg: Any, batch: Any, client: Any) -> Any:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = AgentLoopWorker(cfg, llm_client=client, reward_loop_worker_handles=None)
    return asyncio.run(worker.generate_sequences(batch))


def rows_of(out: Any, cfg: Any) -> list[dict[str, Any]]:
    """Per sample: prompt ids, response ids/mask/logprobs (unpadded), reward and our extra fields."""
    prompt_len = cfg.actor_rollout_ref.rollout.prompt_length
    rows = []
    for i in range(len(out)):
        attention = out.batch["attention_mask"][i]
        p = int(attention[:prompt_len].sum())
        r = int(attention[prompt_len:].sum())
        rows.append(
            {
                "prompt": out.batch["prompts"][i, prompt_len - p :].tolist(),
                "response": out.batch["responses"][i, :r].tolist(),
                "mask": out.batch["response_mask"][i, :r].tolist(),
                "logprobs": out.batch["rollout_log_probs"][i, :r].tolist(),
                "reward": float(out.batch["rm_scores"][i].sum()),
                "valid": bool(out.non_tensor_batch["bridges_valid"][i]),
                "stop": out.non_tensor_batch["bridges_stop_reason"][i],
                "error": out.non_tensor_batch["bridges_error"][i],
                "metrics": json.loads(out.non_tensor_batch["bridges_metrics"][i]),
            }
        )
    return rows
