"""``python -m bridges.train [backend=grpo] [key=value ...]``: train an environment on a backend.

With no arguments it is the embedded default: the bundled GRPO trainer, the local transformers
engine, the tiny model and the ``repeat_letter`` toy environment, on CPU in a few minutes.
Everything is validated before anything heavy loads (``bridges.preflight`` plus the backend's own
``validate``); ``dry_run=true`` runs the same validation, prints the resolved configuration (and,
for launcher backends, the command) and exits.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from bridges.backends import Backend, backend_section, installed_sections, resolve_backend
from bridges.config import parse_config, run_cli, to_yaml, with_open_sections
from bridges.errors import BridgesError, MissingExtraError
from bridges.preflight import (
    build_environment,
    check_dataset,
    check_run_name,
    check_writable_folder,
    claim_run_folder,
)
from bridges.train_config import TrainConfig, refuse_ignored_keys


def validate(config: TrainConfig, backend: Backend) -> Any:
    """Every check that needs no model: names, environment and data, folders, then the backend's own
    section and checks. Returns the backend's parsed options."""
    env = build_environment(config.env, config.env_args)
    check_dataset(env, "train", config.env)
    check_run_name(config.resolved_run_name)
    check_writable_folder(Path(config.output_dir), "output_dir")
    run_dir = Path(config.output_dir) / config.resolved_run_name
    claim_run_folder(run_dir, resume=config.resume, overwrite=config.overwrite, dry_run=True)
    if config.report_to == "wandb" and importlib.util.find_spec("wandb") is None:
        raise MissingExtraError(
            "'wandb' is needed for report_to=wandb but is not installed; install it with "
            "pip install 'rl-bridges[wandb]'."
        )
    refuse_ignored_keys(config, backend.honoured_keys)
    options = backend.parse_options(backend_section(config, backend.name))
    backend.validate(config, options)
    return options


def template_verdict(model: str) -> str:
    """``bridges.check``'s one-line verdict on the model's chat template, printed as a run starts."""
    from bridges.check import run_check

    try:
        return f"template check: {run_check(model).verdict()}"
    except BridgesError as exc:  # a model whose tokenizer is not local (a remote Tinker base model)
        return f"template check: skipped ({exc})"


def train_schema() -> type[TrainConfig]:
    """``TrainConfig`` plus a ``<name>.*`` section for each backend an installed package registers."""
    return with_open_sections(
        TrainConfig, installed_sections(), "options of a backend an installed package registers"
    )


def main(argv: list[str] | None = None) -> int:
    config = parse_config(train_schema(), sys.argv[1:] if argv is None else argv)
    backend = resolve_backend(config.backend)
    options = validate(config, backend)
    if config.dry_run:
        print(to_yaml(config), end="")
        print(backend.describe(config, options), end="")  # what the backend would hand its native trainer
        return 0
    run_dir = Path(config.output_dir) / config.resolved_run_name
    claim_run_folder(run_dir, resume=config.resume, overwrite=config.overwrite, dry_run=False)
    print(template_verdict(config.model), flush=True)
    return int(backend.run(config, options) or 0)


def cli() -> None:
    """Console-script entry point: errors print as one sentence and exit 2, as with ``python -m``."""
    run_cli(main)


if __name__ == "__main__":
    run_cli(main)
