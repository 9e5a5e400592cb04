"""``python -m bridges.train backend=verl``: data, agent-loop registration and hydra overrides for verl.

verl is launched as its users launch it, ``python -m verl.trainer.main_ppo <hydra overrides>``; we
write what that command needs into ``runs/<run_name>/verl/``:
- ``train.parquet``/``eval.parquet``: the environment's splits in verl's format, every row routed to
  our loop by its ``agent_name`` column;
- ``agent_loops.yaml``: registers ``BridgesAgentLoop`` under that name with ``env_id``/``env_args``
  (the file form works in every Ray worker; a ``@register`` decorator would only run where imported).
The shared keys become overrides once, here; each ``verl.*`` key passes through verbatim (hydra
syntax, ``+`` prefixes included) and wins. ``dry_run=true`` writes the files and prints the
command without importing verl, so it works without the ``[verl]`` extra or a GPU.

Fixed choices, all overridable through ``verl.*``: the async rollout (``engine=``: vLLM where a GPU
and vllm are present, else our transformers rollout ``hf``), GRPO advantages, the legacy
(``trainer.use_v1=false``) trainer, whose data path needs no TransferQueue install. Without a GPU
the launcher adds the overrides verl needs on a CPU and the plugin (``adapters/verl/plugin.py``,
loaded by verl in each of its processes) selects the CPU platform.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from bridges.adapters.verl.placement import (
    GpuLayout,
    attention,
    check_batch_fits,
    check_cluster_fits,
    flatten,
    gpu_layout,
    placement_overrides,
    rollout_name,
)
from bridges.runs.backends import Backend
from bridges.runs.config import check_passthrough
from bridges.runs.train_config import (
    TrainConfig,
    check_one_sequence_a_rollout,
    check_synchronous,
    completion_budget,
    shared_keys,
    turn_max_tokens,
)
from bridges.runtime.errors import ConfigError, require_extra

AGENT_LOOP_TARGET = "bridges.adapters.verl.agent_loop.BridgesAgentLoop"
MICRO_BATCH_PER_GPU = (
    4  # sequences per forward pass on one GPU (verl.actor_rollout_ref.*.micro_batch... to change)
)

# verl's own trainer takes these from the shared keys (overrides()); accumulation, the generation
# pipeline, concurrency, the rollout process and LoRA dropout are verl.* settings of its own
HONOURED_KEYS = shared_keys() - {
    "trainer.grad_accum_steps", "trainer.max_concurrent",
    "trainer.rollout_process", "trainer.lora_dropout",
    # verl places, shards and checkpoints its own workers (verl.trainer.n_gpus_per_node, verl.actor_rollout_ref.*)
    "trainer.device", "trainer.dtype", "trainer.gradient_checkpointing", "trainer.logprob_chunk_tokens",
    "trainer.num_processes", "trainer.strategy",
    "trainer.micro_batch_tokens",  # verl packs with its own use_remove_padding (verl.actor_rollout_ref.*)
    "trainer.kernels",  # verl's own: actor_rollout_ref.model.use_liger / use_fused_kernels
    "trainer.peer_timeout_s",  # Ray watches verl's workers
}


def agent_name(config: TrainConfig) -> str:
    return "bridges_" + "".join(ch if ch.isalnum() else "_" for ch in config.env)


def hydra_value(value: Any) -> str:
    """A Python value in hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def prompt_budget(env: Any, tokenizer: Any) -> int:
    """``data.max_prompt_length``: the longest rendered prompt of either split (with tools), and what the
    environment's rollouts add to it (``prompt_overhead_tokens``: a harness program's own prompt),
    rounded up to 64."""
    from bridges.client.rendering import ChatRenderer
    from bridges.envs.base import build_prompt

    renderer = ChatRenderer(tokenizer)
    longest = 1
    for dataset in {id(d): d for d in (env.get_dataset(), env.get_eval_dataset())}.values():
        for row in dataset:
            tools = getattr(env, "tool_defs", None) or None
            longest = max(longest, len(renderer.render_ids(build_prompt(row), tools)))
    return 64 * math.ceil((longest + env.prompt_overhead_tokens) / 64)


PLUGIN = "bridges.adapters.verl.plugin"


def launch_env(gpus: int, run_dir: Path) -> dict[str, str]:
    """What every verl process needs: our plugin (``VERL_USE_EXTERNAL_MODULES``; on a CPU it selects the
    CPU platform), the Python path to import it, where verl's file logger writes, and every ``BRIDGES_*``
    variable of this process (the cache folder of the tiny models among them) but ``BRIDGES_VERL_CPU``,
    which is set here exactly when the run chose CPU mode."""
    from bridges.adapters.verl.placement import CPU_FLAG
    from bridges.adapters.verl.run_files import NATIVE_METRICS

    modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m and m != PLUGIN]
    env = {k: v for k, v in os.environ.items() if k.startswith("BRIDGES_") and k != CPU_FLAG}
    env |= {"VERL_USE_EXTERNAL_MODULES": ",".join([*modules, PLUGIN]), "PYTHONPATH": worker_pythonpath(),
            "VERL_FILE_LOGGER_PATH": str(run_dir / NATIVE_METRICS)}
    if gpus == 0:
        env[CPU_FLAG] = "1"
    return env


def ray_runtime_env(env: dict[str, str]) -> dict[str, Any]:
    """``env`` as overrides of verl's Ray runtime environment. Why not only the launcher's environment: on
    a cluster started with ``ray start``, each node's raylet starts the workers, and they inherit the
    raylet's environment, not ours; the job's ``runtime_env`` reaches every worker on every node."""
    for key, value in env.items():
        if "'" in value:
            raise ConfigError(f"the environment variable {key} holds a quote (') that verl's config cannot carry.")
    return {f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}": f"'{v}'" for k, v in env.items()}


def finish(config: TrainConfig, run_dir: Path, resume_step: int, code: int) -> int:
    """After verl exits: metrics.jsonl under the shared names, the reward curve, the summary line."""
    from bridges.adapters.verl.run_files import fold_metrics
    from bridges.envs.registry import load_environment
    from bridges.runs.metrics import finish_run
    from bridges.workflows.traces import reward_failure

    names = tuple(load_environment(config.env, **config.env_args).rubric.get_reward_func_names())
    rows = fold_metrics(run_dir, resume_step, names)
    if code != 0:
        print(exit_sentence(run_dir, code, sum(r.get("step", 0) > resume_step for r in rows)),
              file=sys.stderr)
    else:
        finish_run(rows, run_dir, f"{config.env} · {config.model} · verl",
                   ["metrics.jsonl", "traces.jsonl.gz", "checkpoints/", "verl/"], reward_failure(run_dir))
    return code


def exit_sentence(run_dir: Path, code: int, finished: int) -> str:
    """Why verl stopped, in one sentence: the first error its log names (the cause, which the log's last
    lines only echo), what was finished and saved, and whether ``resume=true`` has anything to continue."""
    from bridges.adapters.verl.console import CONSOLE_LOG, first_error
    from bridges.adapters.verl.run_files import latest_checkpoint_step

    error = first_error(run_dir / CONSOLE_LOG)
    cause = f"its first error: {error}" if error else f"its log, {run_dir / CONSOLE_LOG}, names no error"
    saved = latest_checkpoint_step(run_dir / "checkpoints")
    if not saved:
        return (f"verl's trainer exited with code {code} ({cause}) after {finished} steps and before it saved a "
                f"checkpoint, so there is nothing to resume; its whole output is in {run_dir / CONSOLE_LOG}.")
    return (f"verl's trainer exited with code {code} ({cause}); the {finished} steps it finished in this launch "
            f"are in {run_dir / 'metrics.jsonl'}, and resume=true continues from its checkpoint of step {saved}.")


def loss_agg_mode(loss: str, aggregation: str) -> str:
    """``trainer.loss``/``loss_aggregation`` as verl's ``loss_agg_mode``: each sequence's token mean averaged
    over sequences (grpo's default), the token mean over the mini-batch, or dr_grpo's constant-length sums."""
    if loss == "dr_grpo":
        return "seq-mean-token-sum-norm"
    return {"sample": "seq-mean-token-mean", "token": "token-mean"}[aggregation]


def overrides(
    config: TrainConfig, files: dict[str, Path], lengths: tuple[int, int], model_path: str, layout: GpuLayout
) -> dict[str, Any]:
    """The shared keys as verl hydra overrides, then ``verl.*`` on top (``lengths``: prompt, response)."""
    t = config.trainer
    prompt_length, response_length = lengths
    keys: dict[str, Any] = {
        "algorithm.adv_estimator": "bridges_grpo",  # verl's GRPO over valid members only (advantages.py)
        "algorithm.norm_adv_by_std_in_grpo": t.loss != "dr_grpo",
        "data.train_files": str(files["train"]),
        "data.val_files": str(files["eval"]),
        "data.train_batch_size": t.batch_size,
        "data.max_prompt_length": prompt_length,
        "data.max_response_length": response_length,
        "data.seed": config.seed,
        "actor_rollout_ref.model.path": model_path,
        "actor_rollout_ref.actor.optim.lr": config.resolved_learning_rate,
        "actor_rollout_ref.actor.optim.lr_warmup_steps": t.warmup_steps,
        "actor_rollout_ref.actor.optim.weight_decay": t.weight_decay,
        "actor_rollout_ref.actor.grad_clip": t.max_grad_norm,
        "actor_rollout_ref.actor.ppo_mini_batch_size": t.batch_size,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": MICRO_BATCH_PER_GPU,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": MICRO_BATCH_PER_GPU,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": MICRO_BATCH_PER_GPU,
        "actor_rollout_ref.actor.clip_ratio_low": t.epsilon,
        "actor_rollout_ref.actor.clip_ratio_high": t.epsilon if t.epsilon_high is None else t.epsilon_high,
        **ratio_cap_overrides(t.ratio_cap, layout.gpus_per_node > 0),
        "actor_rollout_ref.actor.use_kl_loss": t.beta > 0,
        "actor_rollout_ref.actor.kl_loss_coef": t.beta,
        "actor_rollout_ref.actor.loss_agg_mode": loss_agg_mode(t.loss, t.loss_aggregation),
        # dr_grpo's constant normaliser: trainer.max_completion_length, as on grpo (verl: the padded width)
        "actor_rollout_ref.actor.loss_scale_factor": t.max_completion_length if t.loss == "dr_grpo" else None,
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.n": t.group_size,
        "actor_rollout_ref.rollout.temperature": config.sampling.temperature,
        "actor_rollout_ref.rollout.top_p": config.sampling.top_p,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(files["agent_loops"]),
        "actor_rollout_ref.rollout.agent.default_agent_loop": agent_name(config),
        "trainer.total_training_steps": t.max_steps,
        "trainer.save_freq": config.save_every if config.save_every > 0 else t.max_steps,  # 0: at the end
        "trainer.test_freq": config.eval_every if config.eval_every > 0 else -1,  # -1: only before training
        "trainer.max_actor_ckpt_to_keep": config.keep_checkpoints or None,  # 0: keep all
        "trainer.default_local_dir": str(files["run_dir"] / "checkpoints"),
        "trainer.resume_mode": "auto" if config.resume else "disable",
        "trainer.project_name": config.wandb.resolved_project(),
        "trainer.experiment_name": config.resolved_run_name,
        "trainer.logger": ["console", "file"] + ([] if config.report_to == "none" else [config.report_to]),
        "trainer.use_v1": False,
        **placement_overrides(config, layout, model_path),
    }
    if t.lora_rank > 0:
        keys["actor_rollout_ref.model.lora_rank"] = t.lora_rank
        keys["actor_rollout_ref.model.lora_alpha"] = t.lora_alpha
        keys["actor_rollout_ref.model.target_modules"] = list(t.lora_target_modules)
    return {**keys, **flatten(config.verl)}


def ratio_cap_overrides(cap: float | None, recomputed: bool) -> dict[str, Any]:
    """``trainer.ratio_cap`` in verl's terms. The bundled trainer truncates the unclipped ratio at the cap,
    which for a negative advantage is exactly verl's dual clip (``clip_ratio_c``; for a positive one PPO's
    clip already binds lower). Where verl recomputes the old logprobs (GPUs) they differ from the
    sampler's, and the same cap truncates that importance weight per token (``rollout_correction``); on
    the CPU the sampler's logprobs are the old ones (bypass mode) and there is nothing to correct."""
    if cap is None:
        return {"actor_rollout_ref.actor.clip_ratio_c": 1e9}  # no truncation
    keys: dict[str, Any] = {"actor_rollout_ref.actor.clip_ratio_c": cap}
    if recomputed:
        keys |= {"algorithm.rollout_correction.rollout_is": "token",
                 "algorithm.rollout_correction.rollout_is_threshold": cap}
    return keys


def prepare(
    config: TrainConfig, cluster_gpus: list[int] | None = None
) -> tuple[list[str], dict[str, Path], dict[str, str]]:
    """Write the data and the loop registration; return the command, the files and the environment.
    ``cluster_gpus``: the GPUs each node of a running Ray cluster declares (``placement.gpu_layout``)."""
    from transformers import AutoTokenizer

    from bridges.adapters.verl.dataset import write_verl_parquet
    from bridges.envs.registry import load_environment
    from bridges.models.tiny import resolve_model_path

    env = load_environment(config.env, **config.env_args)
    run_dir = Path(config.output_dir).resolve() / config.resolved_run_name
    files = {"run_dir": run_dir, "agent_loops": run_dir / "verl" / "agent_loops.yaml"}
    name = agent_name(config)
    for split in ("train", "eval"):
        files[split] = write_verl_parquet(
            env, split, run_dir / "verl" / f"{split}.parquet", data_source=config.env, agent_name=name,
            limit=config.eval_examples if split == "eval" else 0,
        )
    model_path = resolve_model_path(config.model)
    layout = gpu_layout(config, cluster_gpus)
    check_batch_fits(config, layout)
    gpus = layout.gpus_per_node
    provenance = {"backend": "verl", "engine": rollout_name(config, gpus), "model": config.model,
                  "env_id": config.env, "env_args": config.env_args, "seed": config.seed}
    registration = [{"name": name, "_target_": AGENT_LOOP_TARGET, "env_id": config.env, "env_args": config.env_args,
                     "run_dir": str(run_dir), "provenance": provenance,
                     "sampling_args": turn_max_tokens(config)}]  # per model turn, as on every backend
    files["agent_loops"].write_text(json.dumps(registration, indent=2) + "\n")  # JSON is valid YAML
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    lengths = prompt_budget(env, tokenizer), completion_budget(config, env)
    variables = launch_env(gpus, run_dir)
    keys = {**ray_runtime_env(variables), **overrides(config, files, lengths, str(model_path), layout)}
    command = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        *(f"{k}={hydra_value(v)}" for k, v in keys.items()),
    ]
    return command, files, variables


@functools.cache
def verl_defaults() -> dict[str, Any]:
    """verl's PPO trainer config, flattened to dotted keys, from the YAML verl ships; empty when verl is
    not installed (``dry_run`` works without the extra)."""
    import importlib.util

    import yaml

    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        return {}
    path = Path(spec.origin).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    return flatten(yaml.safe_load(path.read_text()))


def verl_config_keys() -> dict[str, Any]:
    """Every key of verl's config -> the type its value is checked against (numbers are numbers: a
    YAML default of 0 may hold 0.2; strings, lists and null defaults are left to verl)."""
    kinds = {bool: bool, int: float, float: float}
    return {key: kinds.get(type(value), Any) for key, value in verl_defaults().items()}


def parse_options(section: dict[str, Any]) -> dict[str, Any]:
    """``verl.*`` checked against verl's own config: a key verl does not have, or a scalar of the wrong
    type, is one sentence here instead of a hydra stack trace later (``+key`` adds a new key)."""
    known = verl_config_keys()
    if known:
        open_nodes = tuple(
            f"{k}." for k, kind in known.items() if kind is Any
        )  # None/{} defaults take any sub-key
        flat = {k: v for k, v in flatten(section).items() if not k.startswith(("+", *open_nodes))}
        check_passthrough(
            flat, known, "verl.", "verl's PPO trainer config", "; add a new key with verl.+<key>"
        )
    return section


def validate(config: TrainConfig, options: dict[str, Any]) -> None:
    """backend=verl's checks before anything is written or launched."""
    from bridges.runs.preflight import check_model

    check_model(config.model)
    check_one_sequence_a_rollout(config)
    check_synchronous(config)
    layout = gpu_layout(config)  # this machine's view; a running cluster's is read when the run joins it
    gpus = layout.gpus_per_node
    workers_key = "actor_rollout_ref.rollout.agent.num_workers"
    workers = flatten(config.verl).get(workers_key, 1 if gpus == 0 else None)
    workers = int(verl_defaults().get(workers_key) or 1) if workers is None else workers
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"verl.{workers_key} must be a whole number of at least 1, got {workers!r}.")
    if config.trainer.batch_size % workers:
        raise ConfigError(
            f"trainer.batch_size={config.trainer.batch_size} is not a multiple of verl's {workers} agent-loop "
            f"workers ({workers_key}), so a group's rollouts could land in two workers and not be scored "
            "together; change either."
        )
    check_validation_groups(config, workers)
    if os.environ.get("RAY_ADDRESS"):  # the cluster's GPUs are read when the run joins it (run())
        return
    check_batch_fits(config, layout)
    if config.engine == "vllm" and gpus == 0:
        raise ConfigError(
            "engine=vllm needs a GPU and none is visible; use engine=hf (or auto) for verl on a CPU."
        )


def check_validation_groups(config: TrainConfig, workers: int) -> None:
    """With ``val_kwargs.n > 1`` verl pads the validation batch with copies of its first rows up to a
    multiple of the agent-loop workers and cuts it in equal chunks: unless the eval rows divide among the
    workers, a chunk boundary falls inside a group, whose members then wait for each other in two
    workers for 30 minutes. One sentence instead, before anything starts."""
    from bridges.envs.registry import load_environment

    n = flatten(config.verl).get("actor_rollout_ref.rollout.val_kwargs.n", 1)
    if not isinstance(n, int) or n <= 1:
        return
    rows = len(load_environment(config.env, **config.env_args).get_eval_dataset())
    if rows % workers:
        raise ConfigError(
            f"verl.actor_rollout_ref.rollout.val_kwargs.n={n} validates {rows} eval rows on {workers} agent-loop "
            f"workers, so verl's padded validation batch would split a group between two workers; set "
            f"verl.actor_rollout_ref.rollout.agent.num_workers to a divisor of {rows}, or give the environment an "
            f"eval split of a multiple of {workers} rows."
        )


def describe(config: TrainConfig, options: dict[str, Any]) -> str:
    """For ``dry_run=true``: the files written and the exact command, without importing verl."""
    command, files, env = prepare(config)
    listed = "".join(f"#   {key}: {path}\n" for key, path in files.items() if key != "run_dir")
    variables = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k != "PYTHONPATH")
    return f"# verl files\n{listed}# verl command\n{variables} {shlex.join(command)}\n"


def worker_pythonpath() -> str:
    """Ray workers must import ``adapters``/``bridges`` and a user's env module from the current folder."""
    repo = str(Path(__file__).resolve().parents[2])
    parts = [repo, os.getcwd(), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(dict.fromkeys(p for p in parts if p))


def run(config: TrainConfig, options: dict[str, Any]) -> int:
    require_extra("verl", "verl", "backend=verl")
    from bridges.adapters.verl.console import run_verl
    from bridges.adapters.verl.run_files import cut_back
    from bridges.runs.metrics import StepProgress

    cluster_gpus = None
    if os.environ.get("RAY_ADDRESS"):  # a running cluster: every node must import the plugin, and fit verl
        from bridges.adapters.verl.cluster import check_nodes

        nodes = check_nodes(launch_env(1, Path(config.output_dir).resolve() / config.resolved_run_name))
        cluster_gpus = [node.gpus for node in nodes]
        check_cluster_fits(gpu_layout(config, cluster_gpus), nodes)
    command, files, env = prepare(config, cluster_gpus)
    print(attention(gpu_layout(config, cluster_gpus).gpus_per_node)[1], flush=True)
    run_dir = files["run_dir"]
    resume_step = cut_back(run_dir, config.resume)
    progress = StepProgress(config.progress, config.trainer.max_steps, resume_step, "verl")
    code = run_verl(command, {**os.environ, **env}, run_dir, progress)
    if os.environ.get("RAY_ADDRESS"):  # workers on other nodes wrote their episodes to their own disks
        from bridges.adapters.verl.cluster import gather_traces

        gather_traces(run_dir, env)
    return finish(config, run_dir, resume_step, code)


def section_help() -> str:
    """``help=verl``: the section is verl's own PPO trainer config, dotted."""
    return (
        "verl keys: any key of verl's PPO trainer config (verl/trainer/config/ppo_trainer.yaml), dotted, as\n"
        "verl.<path>=value, e.g. verl.actor_rollout_ref.rollout.name=vllm; each is checked against verl's own\n"
        "config, and verl.+<path>=value adds a key it does not have. The shared keys (trainer.*, sampling.*)\n"
        "set the verl keys they name; dry_run=true prints the whole config verl would receive.\n"
    )


BACKEND = Backend(
    name="verl", run=run, honoured_keys=HONOURED_KEYS, parse_options=parse_options, validate=validate,
    describe=describe, section_help=section_help,
)
