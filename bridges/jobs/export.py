"""``python -m bridges.export``: saved rollouts into an SFT dataset (filter, dedupe), or a run's trained
model into one loadable folder (``model=``, ``bridges.jobs.export_model``); written atomically,
optionally pushed to the Hub.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from bridges.runs.config import option
from bridges.runtime.errors import ConfigError


@dataclass
class ExportConfig:
    rollouts: str = option("", help="a results.jsonl / traces.jsonl.gz, or the folder holding one")
    model: str = option("", help="a run folder, a checkpoint or a model folder: export its trained model instead")
    output: str = option("", help="the folder to write: a dataset (save_to_disk), or the model model= names")
    min_reward: float | None = option(None, help="keep rollouts whose reward is at least this")
    metric: str | None = option(None, help="keep rollouts whose metric <metric> is at least min_metric")
    min_metric: float = option(0.0, help="the threshold for metric=")
    top_k: int | None = option(None, ge=1, help="keep the k best rollouts of each example")
    dedupe: bool = option(True, help="keep identical token sequences once")
    overwrite: bool = option(False, help="replace an existing output folder")
    merge_lora: bool = option(True, help="a model export folds a LoRA adapter into its base (false: keeps the adapter)")
    push_to_hub: str | None = option(None, help="also push the dataset (or model) to this Hugging Face repo")
    private: bool = option(False, help="create the push_to_hub repo as private")


_ROLLOUT_FILTERS = ("min_reward", "metric", "top_k")


def export(config: ExportConfig) -> int:
    """The export ``model=`` or ``rollouts=`` names (one of them)."""
    if config.model and config.rollouts:
        raise ConfigError("give model=<run folder> to export a model, or rollouts=<file> to export data, not both.")
    if config.model:
        return export_model(config)
    return export_rows(config)


def export_model(config: ExportConfig) -> int:
    """A run's newest trained model as one folder ``from_pretrained`` loads (``export_model`` module)."""
    from bridges.jobs.export_model import find_trained_model, push_folder, write_model

    used = [name for name in _ROLLOUT_FILTERS if getattr(config, name) is not None]
    if used:
        raise ConfigError(f"{used[0]}= filters rollouts; a model export (model=) takes no filters.")
    if not config.output:
        raise ConfigError("give output=<folder> for the exported model.")
    output = _claim_output(Path(config.output), config.overwrite)
    source, kind = find_trained_model(Path(config.model).expanduser())
    if output.resolve() == source.resolve() or output.resolve() in source.resolve().parents:
        raise ConfigError(f"output={output} holds the model being exported ({source}); name another folder.")
    staging = output.with_name(output.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        what = write_model(source, kind, staging, config.merge_lora)
    except ConfigError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    except Exception as exc:  # a folder that does not load: nothing half-written is left
        shutil.rmtree(staging, ignore_errors=True)
        raise ConfigError(f"could not export {source}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None
    shutil.rmtree(output, ignore_errors=True)
    staging.rename(output)
    print(f"saved {what} from {source} to {output}")
    if config.push_to_hub:
        push_folder(output, config.push_to_hub, config.private)
        print(f"pushed {output} to https://huggingface.co/{config.push_to_hub}")
    return 0


def _claim_output(output: Path, overwrite: bool) -> Path:
    if output.exists() and not overwrite:
        raise ConfigError(f"{output} already exists; pass overwrite=true to replace it.")
    if output.exists() and not output.is_dir():
        raise ConfigError(f"output={output} is a file; name a folder.")
    return output


def export_rows(config: ExportConfig) -> int:
    """Filter saved rollouts into an SFT dataset, written atomically (a failed write leaves no half folder)."""
    from bridges.workflows.sft_data import ExportFilter, read_records, sft_rows

    if not config.rollouts or not config.output:
        raise ConfigError(
            "give rollouts=<results.jsonl, traces.jsonl.gz or their folder> (or model=<run folder>) and output=<folder>."
        )
    source, output = Path(config.rollouts), Path(config.output)
    if output.exists() and not config.overwrite:
        raise ConfigError(f"{output} already exists; pass overwrite=true to replace it.")
    try:
        records = read_records(source)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read rollouts from {source}: {exc}.") from None
    rule = ExportFilter(config.min_reward, config.metric, config.min_metric if config.metric else None,
                        config.top_k, config.dedupe)
    rows, report = sft_rows(records, rule)
    print(", ".join(f"{k.replace('_', ' ')} {v}" for k, v in asdict(report).items()))
    if not rows:
        raise ConfigError(f"no rollout in {source} passes the filters; nothing to write.")
    from datasets import Dataset

    staging = output.with_name(output.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    Dataset.from_list(rows).save_to_disk(str(staging))
    shutil.rmtree(output, ignore_errors=True)
    staging.rename(output)
    print(f"saved {len(rows)} rows to {output}")
    if config.push_to_hub:
        try:
            Dataset.load_from_disk(str(output)).push_to_hub(config.push_to_hub)
        except Exception as exc:  # no token, no network, no access: the local copy is already saved
            raise ConfigError(
                f"saved locally, but pushing to {config.push_to_hub} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
    return 0
