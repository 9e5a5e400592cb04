"""What an evaluation's output folder already holds, and whether a run may add to it.

Invariant: every row in ``results.jsonl`` was made by one model, one environment configuration and one
set of sampling arguments. Why: the summary averages over all rows, so rows from another run would be
scored together with this one's and the figure would describe neither (a newcomer re-ran with a token
cap and got 20 rows made without it mixed into 30 made with it). The run's identity, model fingerprint
included, is stored in ``metadata.json``; a run whose identity differs is refused in one sentence
naming what differs, unless ``overwrite=true`` starts the folder afresh.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

from bridges.envs.types import StopReason
from bridges.runtime.errors import ConfigError

RESULTS_FILE = "results.jsonl"
METADATA_FILE = "metadata.json"
DATASET_FOLDER = "dataset"
# What makes two runs the same run; each is stored in metadata.json and compared on resume.
RUN_IDENTITY = ("env", "env_args", "model", "model_fingerprint", "engine", "base_url", "rollouts_per_example",
                "split", "sampling_args")


def model_fingerprint(model: str) -> str | None:
    """Names, sizes and modification times of a local model folder's files, hashed: a folder trained
    or exported again under the same path is another model. None for a built-in or a hub id (its name
    is its identity)."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def read_results(path: Path, rollouts_per_example: int) -> tuple[list[dict[str, Any]], bool]:
    """Records of complete groups (all K rollouts saved), and whether anything else had to be dropped.

    Groups are appended whole, so an incomplete group or an unreadable line can only come from a crash
    in the middle of a write; those rows are generated again. So is a group in which a reward function
    raised: once the reward is fixed, the same command scores those examples again.
    """
    if not path.exists():
        return [], False
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    dropped = False
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            dropped = True
            continue
        if not isinstance(record, dict) or not isinstance(record.get("example_id"), int):
            dropped = True
            continue
        groups[int(record["example_id"])].append(record)
    kept = []
    for records in groups.values():
        failed = any(r.get("stop_reason") == StopReason.REWARD_ERROR.value for r in records)
        if len(records) == rollouts_per_example and not failed:
            kept.extend(records)
        else:
            dropped = True
    return kept, dropped


def check_resumable(output: Path, identity: dict[str, Any]) -> None:
    """Refuse, in one sentence, to add rows to results made by another run (the module's invariant)."""
    path = output / METADATA_FILE
    if not path.exists() or not (output / RESULTS_FILE).exists():
        return
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    differing = [k for k in RUN_IDENTITY if saved.get(k) != identity[k]]
    if differing:
        was = ", ".join(f"{k}={json.dumps(saved.get(k))}" for k in differing)
        now = ", ".join(f"{k}={json.dumps(identity[k])}" for k in differing)
        raise ConfigError(
            f"output '{output}' holds rows made with {was}, not {now}; scoring them together would mix two runs: "
            "run with overwrite=true to start it afresh, or pass another output=<dir>."
        )


def start_afresh(output: Path) -> None:
    """Remove what an earlier evaluation wrote here (only its own files: the folder may hold others)."""
    for name in (RESULTS_FILE, METADATA_FILE):
        (output / name).unlink(missing_ok=True)
    for name in (DATASET_FOLDER, DATASET_FOLDER + ".tmp"):
        shutil.rmtree(output / name, ignore_errors=True)


def resume(output: Path, dataset: Any, rollouts_per_example: int) -> tuple[list[dict[str, Any]], Any]:
    """The rows an earlier run of this evaluation saved, and the dataset rows still to generate."""
    results_path = output / RESULTS_FILE
    saved, dropped = read_results(results_path, rollouts_per_example)
    if dropped:  # rewrite without what is generated again (a crash's partial group, failed rewards)
        from bridges.envs.results import dumps

        results_path.write_text("".join(dumps(r) + "\n" for r in saved))
    wanted = set(dataset["example_id"])
    resumed = [r for r in saved if r["example_id"] in wanted]  # a smaller num_examples uses a subset
    done = {r["example_id"] for r in resumed}
    rows = dataset.filter(lambda row: row["example_id"] not in done) if done else dataset
    same = " (made with this model, environment and sampling)" if resumed else ""
    print(
        f"{len(resumed)} rows resumed from {results_path}{same} ({len(done)} examples); "
        f"generating {len(rows) * rollouts_per_example} rows ({len(rows)} examples)."
    )
    return resumed, rows
