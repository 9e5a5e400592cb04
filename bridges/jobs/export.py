"""Turn saved rollouts into an SFT dataset (``python -m bridges.export``): filter, dedupe, write
atomically, optionally push to the hub.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from bridges.runs.config import option
from bridges.runtime.errors import ConfigError


@dataclass
class ExportConfig:
    rollouts: str = option("", help="a results.jsonl / traces.jsonl, or the folder holding one")
    output: str = option("", help="the dataset folder to write (save_to_disk)")
    min_reward: float | None = option(None, help="keep rollouts whose reward is at least this")
    metric: str | None = option(None, help="keep rollouts whose metric <metric> is at least min_metric")
    min_metric: float = option(0.0, help="the threshold for metric=")
    top_k: int | None = option(None, ge=1, help="keep the k best rollouts of each example")
    dedupe: bool = option(True, help="keep identical token sequences once")
    overwrite: bool = option(False, help="replace an existing output folder")
    push_to_hub: str | None = option(None, help="also push the dataset to this Hugging Face repo")


def export_rows(config: ExportConfig) -> int:
    """Filter saved rollouts into an SFT dataset, written atomically (a failed write leaves no half folder)."""
    from bridges.workflows.sft_data import ExportFilter, read_records, sft_rows

    if not config.rollouts or not config.output:
        raise ConfigError("give rollouts=<results.jsonl, traces.jsonl or their folder> and output=<folder>.")
    source, output = Path(config.rollouts), Path(config.output)
    if output.exists() and not config.overwrite:
        raise ConfigError(f"{output} already exists; pass overwrite=true to replace it.")
    try:
        records = read_records(source)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read rollouts from {source}: {exc}.") from None
    rule = ExportFilter(config.min_reward, config.metric, config.min_metric if config.metric else None,
                        config.top_k, config.dedupe)  # fmt: skip
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
