"""Start a training run: validate everything that needs no model, then hand the run to its backend
(``python -m bridges.train``), or start ``trainer.num_processes`` copies of the command and wait.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

from bridges.models.hardware import check_process_devices
from bridges.runs.backends import Backend, backend_section, installed_sections, resolve_backend
from bridges.runs.config import HelpRequested, help_text, parse_config, to_yaml, with_open_sections
from bridges.runs.metrics import quiet_library_bars
from bridges.runs.preflight import (
    build_environment,
    check_dataset,
    check_eval_split,
    check_run_name,
    check_writable_folder,
    claim_run_folder,
)
from bridges.runs.train_config import TrainConfig, refuse_ignored_keys
from bridges.runs.training_signal import describe_signal
from bridges.runtime.errors import BridgesError, ConfigError, MissingExtraError
from bridges.runtime.launch import is_main_process, launch, launched_size, restarts_allowed


def validate(config: TrainConfig, backend: Backend) -> Any:
    """Every check that needs no model: names, environment and data, folders, then the backend's own
    section and checks. Returns the backend's parsed options."""
    env = build_environment(config.env, config.env_args)
    check_dataset(env, "train", config.env)
    if config.eval_every > 0:
        check_eval_split(env, config.env)
    check_run_name(config.resolved_run_name)
    check_writable_folder(Path(config.output_dir), "output_dir")
    run_dir = Path(config.output_dir) / config.resolved_run_name
    claim_run_folder(run_dir, resume=config.resume, overwrite=config.overwrite, dry_run=True)
    if config.report_to != "wandb" and (config.wandb.project or config.wandb.entity):
        raise ConfigError(
            "wandb.project/wandb.entity are set but report_to=none, so nothing would go to wandb; add "
            "report_to=wandb, or drop them."
        )
    if config.report_to == "wandb" and importlib.util.find_spec("wandb") is None:
        raise MissingExtraError(
            "'wandb' is needed for report_to=wandb but is not installed; install it with "
            "pip install 'rl-bridges[wandb]'."
        )
    refuse_ignored_keys(config, backend.honoured_keys)
    check_processes(config)
    options = backend.parse_options(backend_section(config, backend.name))
    backend.validate(config, options)
    return options


def check_processes(config: TrainConfig) -> None:
    """Several processes split every step's groups between them: the batch must divide, a launcher that
    already started this process must agree with ``trainer.num_processes``, and each process takes
    its own GPU."""
    t = config.trainer
    size = launched_size() if launched_size() > 1 else t.num_processes
    if t.num_processes > 1 and launched_size() > 1 and t.num_processes != launched_size():
        raise ConfigError(
            f"trainer.num_processes={t.num_processes} but this process was started as one of {launched_size()} "
            "(WORLD_SIZE); leave trainer.num_processes unset under torchrun or accelerate launch."
        )
    if t.batch_size % size:
        raise ConfigError(
            f"trainer.batch_size={t.batch_size} does not divide among {size} processes; each process trains "
            f"whole groups, so make trainer.batch_size a multiple of {size}."
        )
    if size > 1 and t.device.startswith("cuda:"):
        raise ConfigError(
            f"trainer.device={t.device} names one GPU, but each of the {size} processes uses its own "
            "(cuda:<local rank>); set trainer.device=auto or cuda."
        )
    check_process_devices(t.device, size)


def template_verdict(model: str) -> str:
    """``bridges.check``'s one-line verdict on the model's chat template, printed as a run starts."""
    from bridges.jobs.check import run_check

    try:
        return f"template check: {run_check(model).verdict()}"
    except BridgesError as exc:  # a model whose tokenizer is not local (a remote Tinker base model)
        return f"template check: skipped ({exc})"


def train_schema() -> type[TrainConfig]:
    """``TrainConfig`` plus a ``<name>.*`` section for each backend an installed package registers."""
    return with_open_sections(
        TrainConfig, installed_sections(), "options of a backend an installed package registers"
    )


def backend_help(args: list[str]) -> None:
    """``help=<backend>`` (tinker, trl, verl, an installed one's name): that backend's own section."""
    from bridges.runs.backends import available_backends

    for arg in args:
        name = arg.split("=", 1)[1] if arg.startswith("help=") else None
        if name is not None and name in available_backends():
            raise HelpRequested(resolve_backend(name).section_help())
        if name is not None:
            try:
                help_text(train_schema(), name)
            except ConfigError as exc:  # the sentence lists the sections; the backends are sections too
                raise ConfigError(f"{str(exc).rstrip('.')}; backends: {', '.join(available_backends())}.") from None


def continued_under_restarts(config: TrainConfig) -> TrainConfig:
    """Under ``torchrun --max-restarts N`` every worker continues the run in its folder (``resume=true``): torchrun
    starts workers again after a failure, and on the other nodes after the failed one rejoins, where the restart
    count it gives them stays 0, so no worker can tell a first start from a restart (torchtitan resumes the
    same way). ``overwrite=true`` would empty the folder at every restart: refused."""
    if not restarts_allowed():
        return config
    if config.overwrite:
        raise ConfigError(
            "overwrite=true under torchrun --max-restarts would empty the run folder at every restart; remove the "
            "folder before starting the job, or pass another run_name=."
        )
    return dataclasses.replace(config, resume=True)


def train(args: list[str]) -> int:
    """Run ``python -m bridges.train`` with these ``key=value`` arguments; returns the exit code."""
    backend_help(args)
    config = parse_config(train_schema(), args)
    config = continued_under_restarts(config)
    backend = resolve_backend(config.backend)
    options = validate(config, backend)
    if config.dry_run:
        print(to_yaml(config), end="")
        print(describe_signal(config.backend), end="")  # what an episode becomes there
        print(backend.describe(config, options), end="")  # what the backend would hand its native trainer (last)
        return 0
    run_dir = Path(config.output_dir) / config.resolved_run_name
    if config.trainer.num_processes > 1 and launched_size() == 1:  # start the processes; each runs main()
        return launch("bridges.train", args, config.trainer.num_processes, run_dir)
    if is_main_process():  # the others wait for it in the backend's first collective
        claim_run_folder(run_dir, resume=config.resume, overwrite=config.overwrite, dry_run=False)
        print(template_verdict(config.model), flush=True)
    quiet_library_bars()
    return int(backend.run(config, options) or 0)
