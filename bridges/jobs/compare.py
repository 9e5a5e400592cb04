"""Compare backends on one environment: paired rollouts, bootstrap intervals, reward curves
(``python -m bridges.compare``); the report's tables and plots are drawn by ``compare_report``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridges.jobs.compare_report import (
    BackendResult,
    caveats,
    comparisons,
    plot_curves,
    plot_distributions,
    tables,
    write_reports,
)
from bridges.jobs.evaluate import SamplingConfig
from bridges.runs.config import option
from bridges.runs.metrics import read_metric_rows
from bridges.runtime.errors import ConfigError

BACKENDS = ("grpo", "trl", "tinker", "verl")


@dataclass
class TinkerTarget:
    base_url: str = option("local", help="'local' starts the local Tinker server; else a service URL")


@dataclass
class CompareConfig:
    env: str = option("reverse_text", help="environment id evaluated on every backend")
    env_args: dict[str, Any] = option(
        factory=dict, help="keyword arguments of the environment's load_environment"
    )
    backends: list[str] = option(
        factory=lambda: ["grpo", "trl", "tinker"], help="engines to compare: grpo, trl, tinker, verl"
    )
    model: str = option("tiny", help="'tiny', a local checkpoint folder or a hub id")
    num_examples: int = option(8, ge=1, help="examples evaluated per backend")
    rollouts_per_example: int = option(4, ge=1, help="rollouts of each example per backend")
    seed: int = option(0, ge=0, help="sampling seed, the same on every backend")
    sampling: SamplingConfig = option(
        factory=SamplingConfig, help="the same sampling.* keys as bridges.eval",
        replaces={"temperature": "sampling.temperature", "max_tokens": "sampling.max_tokens"},
    )
    backend_sampling: dict[str, Any] = option(
        factory=dict, help="per-backend sampling overrides: <backend>.<arg>=value"
    )
    tinker: TinkerTarget = option(factory=lambda: TinkerTarget(), replaces={"tinker_base_url": "tinker.base_url"})
    runs: list[str] = option(
        factory=list, help="finished training run folders whose reward curves to overlay"
    )
    bootstrap: int = option(2000, ge=100, help="bootstrap resamples for the paired verdicts")
    last_k: int = option(10, ge=1, help="runs=: the steps at each end of a curve its verdicts compare")
    output: str = option("outputs/compare", help="where the report, plot and results dataset go")
    progress: bool = option(False, help="progress bars")
    dry_run: bool = option(False, help="check everything and print the resolved config; compare nothing")

    @property
    def temperature(self) -> float:
        """The temperature every backend samples at (1.0 unless sampling.temperature says otherwise)."""
        return 1.0 if self.sampling.temperature is None else self.sampling.temperature


def check(config: CompareConfig) -> None:
    unknown = [b for b in config.backends if b not in BACKENDS]
    if unknown:
        raise ConfigError(f"unknown backend '{unknown[0]}' in backends; choose from {', '.join(BACKENDS)}.")
    if not config.backends and not config.runs:
        raise ConfigError("nothing to compare: give backends=[...] and/or runs=[dir,...].")
    stray = sorted(set(config.backend_sampling) - set(config.backends))
    if stray:
        raise ConfigError(f"backend_sampling.{stray[0]} names a backend that is not in backends.")


def validate(config: CompareConfig) -> Any:
    """What a dry run and a real run both check before any engine starts; returns the environment
    (None when only training runs' curves are compared)."""
    from bridges.runs.preflight import build_environment, check_model

    check(config)
    if not config.backends:
        return None
    check_model(config.model)
    return build_environment(config.env, config.env_args)


@contextlib.asynccontextmanager
async def backend_client(name: str, config: CompareConfig, model_path: str) -> Any:
    """An ``EngineClient`` over the engine ``name`` trains with (and the label of that engine)."""
    from bridges.client import EngineClient
    from bridges.runs.engines import load_engine

    if name in ("grpo", "trl"):
        engine = load_engine("hf", model_path)
        try:
            yield EngineClient(engine, model_name=config.model), "hf"
        finally:
            await engine.aclose()
    elif name == "verl":
        from bridges.adapters.verl.engine import VerlServerEngine
        from bridges.adapters.verl.hf_rollout import HFRolloutServer

        manager = HFRolloutServer(model_path)
        base = {"temperature": config.temperature, "top_p": config.sampling.top_p or 1.0, "top_k": -1, "logprobs": True}
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        verl_engine = VerlServerEngine(manager, tokenizer, base_sampling_params=base, response_length=1 << 30)
        yield EngineClient(verl_engine, model_name=config.model), "verl hf rollout"
    else:
        async with _tinker_client(config, model_path) as (client, label):
            yield client, label


@contextlib.asynccontextmanager
async def _tinker_client(config: CompareConfig, model_path: str) -> AsyncIterator[tuple[Any, str]]:
    """An ``EngineClient`` over a Tinker sampler (a local server started for it when asked). The
    session is finished before its server stops, while the server still answers."""
    import os

    from transformers import AutoTokenizer

    from bridges.runtime.errors import require_extra

    require_extra("tinker", "tinker", "comparing backend tinker")

    from bridges.adapters.tinker.engine import TinkerEngine
    from bridges.adapters.tinker.session import open_service
    from bridges.client import EngineClient

    os.environ.setdefault("TINKER_TELEMETRY", "0")
    base_url, label = config.tinker.base_url, f"tinker ({config.tinker.base_url})"
    with contextlib.ExitStack() as stack:
        if base_url == "local":
            from bridges.adapters.tinker.server import start_local_server

            server = start_local_server(model_path, Path(config.output) / "tinker", model_name=config.model)
            stack.callback(server.close)
            base_url, label = server.url, "tinker (local server)"
        service = stack.enter_context(open_service(base_url))
        sampler = await service.create_sampling_client(base_model=config.model)
        engine = TinkerEngine(sampler, AutoTokenizer.from_pretrained(model_path))
        yield EngineClient(engine, model_name=config.model), label


async def evaluate_backend(name: str, env: Any, config: CompareConfig, model_path: str) -> BackendResult:
    from bridges.envs.results import state_to_record

    args: dict[str, Any] = {
        **(env.sampling_args or {}),
        "temperature": config.temperature,
        "seed": config.seed,
    }
    if config.sampling.max_tokens is not None:
        args["max_tokens"] = config.sampling.max_tokens
    if config.sampling.top_p is not None:
        args["top_p"] = config.sampling.top_p
    args.update(config.backend_sampling.get(name, {}))
    async with backend_client(name, config, model_path) as (client, label):
        started = time.perf_counter()
        result = await env.evaluate(
            client, config.model, num_examples=config.num_examples,
            rollouts_per_example=config.rollouts_per_example, sampling_args=args, progress=config.progress,
        )
        seconds = time.perf_counter() - started
    states = result.states
    rows = [{"backend": name, **state_to_record(s)} for s in states]
    return BackendResult(
        name=name,
        engine=label,
        rewards=[None if s.errored else s.reward for s in states],
        stop_reasons=[s.stop_reason or "none" for s in states],
        drift_tokens=[int(s.drift_tokens or 0) for s in states],
        completion_tokens=sum(len(t.completion_ids) for s in states for t in s.turns),
        seconds=seconds,
        rows=rows,
    )


def read_curves(runs: list[str]) -> tuple[dict[str, list[tuple[int, float]]], str]:
    """Each run's reward curve, against samples seen (cumulative ``episodes/total``) when every run logs
    it, so runs with different batch shapes line up, else against steps. Returns the curves and the axis."""
    tables = {}
    for run in runs:
        path = Path(run) / "metrics.jsonl"
        if not path.exists():
            raise ConfigError(
                f"runs: '{run}' has no metrics.jsonl; point at a finished training run's folder."
            )
        tables[Path(run).name] = read_metric_rows(path)
    by_samples = all(r.get("episodes/total") is not None for rows in tables.values() for r in rows)
    curves = {}
    for name, rows in tables.items():
        seen, points = 0, []
        for r in rows:
            seen += int(r.get("episodes/total") or 0)
            if r.get("reward/mean") is not None:
                points.append((seen if by_samples else r["step"], r["reward/mean"]))
        curves[name] = points
    return curves, "samples seen" if by_samples else "step"


def curve_sections(curves: dict[str, list[tuple[int, float]]], config: CompareConfig) -> dict[str, list[list[str]]]:
    """The report's tables on the training runs (did each learn; how their ends compare), also printed."""
    from bridges.jobs.curve_verdict import curve_rows, pair_rows

    rewards = {name: [y for _, y in points] for name, points in curves.items() if points}
    runs = curve_rows(rewards, config.last_k, config.bootstrap, config.seed)
    pairs = pair_rows(rewards, config.last_k, config.bootstrap, config.seed) if len(rewards) > 1 else []
    for name, _, first, last, moved, said in runs[1:]:
        print(f"{name}: first steps {first} -> last steps {last}, {moved} -> {said}")
    for a, b, gap, said in pairs[1:]:
        print(f"{a} vs {b}: last {config.last_k} steps {gap} -> {said}")
    return {"Training runs": runs, **({"Training runs compared": pairs} if pairs else {})}


def compare(config: CompareConfig) -> int:
    """Evaluate each backend on the same rows and seeds, read the training curves, write the report."""
    from datasets import Dataset

    from bridges.models.tiny import resolve_model_path
    from bridges.runs.config import to_yaml

    env = validate(config)
    if config.dry_run:
        print(to_yaml(config), end="")
        return 0
    output = Path(config.output)
    output.mkdir(parents=True, exist_ok=True)
    curves, axis = read_curves(config.runs)
    results: list[BackendResult] = []
    if config.backends:
        model_path = str(resolve_model_path(config.model))
        for name in config.backends:
            print(f"evaluating {config.env} through {name} ...", flush=True)
            results.append(asyncio.run(evaluate_backend(name, env, config, model_path)))
    images, sections, notes = [], {}, caveats(results)
    for note in notes:
        print(note)
    if results:
        pairs = comparisons(results, config.bootstrap, config.seed)
        sections = tables(results, pairs)
        images.append(
            plot_distributions(results, output / "rewards.png", f"{config.env} · {config.model}").name
        )
        Dataset.from_list([row for r in results for row in r.rows]).save_to_disk(str(output / "results"))
        for p in pairs:
            print(
                f"{p['a']} vs {p['b']}: difference {p['diff']:+.4f} [{p['lo']:+.4f}, {p['hi']:+.4f}] -> {p['verdict']}"
            )
    if curves:
        images.append(plot_curves(curves, output / "curves.png", axis).name)
        sections.update(curve_sections(curves, config))
    header = [
        f"environment {config.env} {config.env_args or ''}, model {config.model}, {config.num_examples} examples x "
        f"{config.rollouts_per_example} rollouts, seed {config.seed}, temperature {config.temperature}",
        "Rollouts are paired across backends (same rows, same seeds); 'same' means the paired 95% bootstrap "
        "interval of the mean reward difference contains 0.",
        *notes,
    ]
    md, page = write_reports(output, "rl-bridges backend comparison", header, sections, images)
    print(f"report written to {md} and {page}")
    return 0
