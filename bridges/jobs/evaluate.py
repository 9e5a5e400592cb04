"""Evaluate an environment on a model and save every rollout, resumably (``python -m bridges.eval``).

Evaluation runs are long and run against rate-limited or flaky endpoints, so nothing that finished may
be lost: each finished group is appended to ``results.jsonl`` and flushed at once, and the same command
run again resumes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bridges.envs.types import StopReason
from bridges.jobs.eval_resume import (
    DATASET_FOLDER,
    METADATA_FILE,
    RESULTS_FILE,
    check_resumable,
    model_fingerprint,
    resume,
    start_afresh,
)
from bridges.models.hardware import DEVICE_HELP, DTYPE_HELP, DTYPES, check_device
from bridges.runs.config import option
from bridges.runs.preflight import build_environment, check_dataset, check_model, check_writable_folder
from bridges.runtime.errors import ConfigError, RewardFunctionError


@dataclass
class SamplingConfig:
    max_tokens: int | None = option(None, ge=1, help="tokens per model turn; None: the environment's own")
    temperature: float | None = option(None, ge=0.0, le=2.0, help="sampling temperature (0: greedy)")
    top_p: float | None = option(None, gt=0.0, le=1.0, help="nucleus sampling mass")


@dataclass
class EvalConfig:
    env: str = option("repeat_letter", help="environment id: bundled, entry point, module, or vf:<module>")
    env_args: dict[str, Any] = option(
        factory=dict, help="keyword arguments of the environment's load_environment"
    )
    model: str = option(
        "tiny", help="'tiny', a local checkpoint folder, a hub id, or the endpoint's model name"
    )
    engine: str = option(
        "hf", help="hf: a local model, token-exact; openai: any endpoint; module:Class: your own engine"
    )
    base_url: str | None = option(None, help="engine=openai: the endpoint (default: the SDK's)")
    api_key_var: str = option(
        "OPENAI_API_KEY", help="engine=openai: the environment variable holding the key"
    )
    device: str = option("auto", help=f"engine=hf: where the model runs: {DEVICE_HELP}")
    dtype: str = option("auto", choices=DTYPES, help=f"engine=hf: {DTYPE_HELP}")
    num_examples: int = option(-1, ge=-1, help="examples to evaluate; -1 = all")
    rollouts_per_example: int = option(1, ge=1, help="rollouts of each example")
    max_concurrent: int = option(32, ge=1, help="rollouts in flight")
    sampling: SamplingConfig = option(factory=SamplingConfig, help="sampling overrides")
    seed: int = option(0, ge=0, help="sampling seed")
    output: str | None = option(None, help="results folder; default outputs/<env>--<model>")
    split: str = option("eval", choices=("eval", "train"), help="which dataset split to evaluate")
    progress: bool = option(True, help="a progress bar")
    overwrite: bool = option(False, help="start output afresh: drop the rows an earlier evaluation saved there")


def default_output(env: str, model: str) -> Path:
    name = Path(model.rstrip("/")).name if os.path.sep in model or model.startswith(".") else model
    return Path("outputs") / re.sub(r"[^A-Za-z0-9._-]+", "-", f"{env}--{name}")


def validate(config: EvalConfig, output: Path) -> None:
    """What the ranges in EvalConfig cannot say, checked before the environment or a model loads."""
    if config.num_examples == 0:
        raise ConfigError(f"num_examples must be positive or -1 (all), got {config.num_examples}.")
    check_writable_folder(output, "output")
    if config.engine not in ("hf", "openai") and ":" not in config.engine:
        raise ConfigError(
            f"engine must be hf, openai or module:Class (your own engine), got '{config.engine}'."
        )
    if config.engine != "openai":
        check_model(config.model)
    if config.engine == "hf":
        check_device(config.device)
    if ":" in config.engine:
        from bridges.runs.engines import engine_class

        engine_class(config.engine)  # an unimportable path is one sentence, before anything runs


# ---------------------------------------------------------------- results


class ResultsWriter:
    """Appends each finished group to the JSONL file and flushes it, so a crash loses no finished group."""

    def __init__(self, path: Path) -> None:
        from bridges.envs.results import state_to_record

        self._to_record = state_to_record
        self.path = path
        self.records: list[dict[str, Any]] = []

    def __call__(self, states: list[Any]) -> None:
        from bridges.envs.results import dumps

        records = [self._to_record(s) for s in states]
        with self.path.open("a") as f:
            f.write("".join(dumps(r) + "\n" for r in records))
            f.flush()
            os.fsync(f.fileno())
        self.records.extend(records)


# ---------------------------------------------------------------- summary


def summarize(records: list[dict[str, Any]], rollouts_per_example: int) -> dict[str, Any]:
    """The environment layer's summary, over resumed and new rows alike (rebuilt from the records)."""
    from bridges.envs.base import GenerateResult
    from bridges.envs.results import record_to_state

    states = [record_to_state(r) for r in records]
    return GenerateResult(states=states, rollouts_per_example=rollouts_per_example).summary()


def _number(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_table(summary: dict[str, Any], header: str, token_ids: bool) -> str:
    """The run at a glance; token counts of a remote endpoint come from its reported usage."""
    k = summary["pass_at_k"]["k"]
    stderr = summary["reward_stderr"]
    rows = [
        ("rollouts", f"{summary['num_rollouts']} ({summary['num_examples']} examples x {k})"),
        ("reward", _number(summary["reward_mean"]) + ("" if stderr is None else f" ± {stderr:.4f}")),
        *[(f"  {name}", _number(value)) for name, value in summary["metrics"].items()],
        (f"pass@{k} (reward >= {summary['pass_threshold']})", _number(summary["pass_at_k"]["value"])),
        (f"pass all {k}", _number(summary["pass_all_k"])),
        ("stop reasons", ", ".join(f"{name} {n}" for name, n in summary["stop_reasons"].items()) or "-"),
        ("prompt tokens (mean)", _number(summary["prompt_tokens_mean"], 1)),
        ("completion tokens (mean)", _number(summary["completion_tokens_mean"], 1)),
        ("errors", str(summary["num_errored"])),
        ("token ids", "yes (trainable)" if token_ids else "no: evaluation only"),
    ]
    width = max(len(name) for name, _ in rows)
    line = "-" * max(len(header), width + 24)
    return "\n".join([header, line, *(f"{name.ljust(width)}  {value}" for name, value in rows), line])


# ---------------------------------------------------------------- main


def build_client(config: EvalConfig) -> Any:
    """An ``openai.AsyncOpenAI``: the remote endpoint itself, or a local engine behind ``EngineClient``."""
    if config.engine == "openai":
        from bridges.adapters.openai import build_openai_client

        return build_openai_client(config.base_url, config.api_key_var)
    import torch

    from bridges.client import EngineClient
    from bridges.runs.engines import load_engine
    from bridges.runs.metrics import quiet_library_bars

    quiet_library_bars()
    torch.manual_seed(config.seed)
    options = {"device": config.device, "dtype": config.dtype} if config.engine == "hf" else {}
    return EngineClient(load_engine(config.engine, config.model, **options), model_name=config.model)


def save_dataset(records: list[dict[str, Any]], path: Path) -> None:
    from datasets import Dataset

    staging = path.with_name(path.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    Dataset.from_list(records).save_to_disk(str(staging))
    shutil.rmtree(path, ignore_errors=True)
    staging.rename(path)


def _dataset(config: EvalConfig, env: Any) -> Any:
    """The rows to evaluate. An environment without an eval split would hand back its training rows for
    ``split=eval`` (``get_eval_dataset`` falls back to them): that is refused, not done silently."""
    if config.split == "eval" and env.eval_dataset is None:
        raise ConfigError(
            f"environment '{config.env}' has no eval split, so split=eval would evaluate its training rows; pass "
            "split=train to evaluate on those (named so in the summary), or build it with eval_dataset=."
        )
    check_dataset(env, config.split, config.env)
    split = env.get_eval_dataset if config.split == "eval" else env.get_dataset
    return split(n=config.num_examples)


def check_rewards(records: list[dict[str, Any]], results: Path) -> None:
    """A reward function that raised is a bug to fix, not a score: exit 2 quoting its own message and the
    row it failed on. The failed groups are saved, and generated again by the same command once fixed."""
    failed = [r for r in records if r.get("stop_reason") == StopReason.REWARD_ERROR.value]
    if failed:
        first = failed[0]
        prompt = first.get("prompt")
        asked = prompt[-1].get("content") if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict) else prompt
        raise RewardFunctionError(
            f"{first['error'].rstrip('.')} (example {first['example_id']}, prompt {str(asked)[:80]!r}; {len(failed)} "
            f"of {len(records)} rollouts failed, each saved in {results} with its error); fix it and run the same "
            "command again: those examples are scored again."
        )


def evaluate(config: EvalConfig) -> int:
    """Evaluate, resuming what ``output`` already holds; every check runs before a model loads or the
    folder is written. Returns the exit code."""
    output = Path(config.output) if config.output else default_output(config.env, config.model)
    validate(config, output)
    env = build_environment(config.env, config.env_args)
    dataset = _dataset(config, env)
    sampling_args = {k: v for k, v in asdict(config.sampling).items() if v is not None}
    identity = {"env": config.env, "env_args": config.env_args, "model": config.model,
                "model_fingerprint": model_fingerprint(config.model), "engine": config.engine,
                "base_url": config.base_url if config.engine == "openai" else None,
                "rollouts_per_example": config.rollouts_per_example, "split": config.split,
                "sampling_args": {**(env.sampling_args or {}), **sampling_args}}
    if config.overwrite:
        start_afresh(output)
    check_resumable(output, identity)
    token_ids = config.engine != "openai"
    # a missing API key fails here, before any work; a local model loads only if something is left to do
    remote = build_client(config) if config.engine == "openai" else None
    output.mkdir(parents=True, exist_ok=True)
    resumed, rows = resume(output, dataset, config.rollouts_per_example)
    metadata = {**identity, "num_examples": len(dataset), "seed": config.seed, "token_ids": token_ids,
                "started": datetime.now(UTC).isoformat(timespec="seconds")}
    (output / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    writer = ResultsWriter(output / RESULTS_FILE)
    if len(rows):
        client = remote if remote is not None else build_client(config)
        asyncio.run(
            env.generate(rows, client, config.model, rollouts_per_example=config.rollouts_per_example,
                         sampling_args=sampling_args, max_concurrent=config.max_concurrent,
                         progress=config.progress, on_group=writer)
        )
    records = resumed + writer.records
    summary = summarize(records, config.rollouts_per_example)
    save_dataset(records, output / DATASET_FOLDER)
    metadata.update(summary=summary, resumed_rows=len(resumed), new_rows=len(writer.records),
                    finished=datetime.now(UTC).isoformat(timespec="seconds"))
    (output / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    split = "" if config.split == "eval" else " | split=train (the training rows)"
    header = (
        f"{config.env} | {config.model} ({config.engine}) | {config.rollouts_per_example} rollouts per example"
        f"{split} | {len(resumed)} rows resumed, {len(writer.records)} new"
    )
    print(format_table(summary, header, token_ids))
    print(f"saved {len(records)} rows to {output / RESULTS_FILE} and {output / DATASET_FOLDER}")
    check_rewards(records, output / RESULTS_FILE)
    return 0
