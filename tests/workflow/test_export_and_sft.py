"""Rollouts -> SFT dataset -> ``bridges.sft``: exact token ids, filters, training, resume, loadable checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridges.envs.results import record_to_state
from bridges.runs.config import run_cli
from bridges.workflows.samples import state_to_samples


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory: pytest.TempPathFactory, tiny_path: Path) -> Path:
    """Real rollouts of the tiny model on a multi-turn environment: 6 examples x 3 rollouts."""
    from bridges.eval import main

    out = tmp_path_factory.mktemp("rollouts")
    args = ["env=guess_number", "model=tiny", "num_examples=6", "rollouts_per_example=3", "progress=false",
            f"output={out}", "split=train"]
    assert main(args) == 0
    return out


def export(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from bridges.export import main

    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, args)
    out, err = capsys.readouterr()
    return exit_info.value.code, out + err


def test_token_ids_and_masks_are_the_rollouts_own(rollouts: Path, tmp_path: Path, capsys):
    from datasets import load_from_disk

    code, _ = export([f"rollouts={rollouts}", f"output={tmp_path / 'data'}", "dedupe=false"], capsys)
    assert code == 0
    rows = load_from_disk(str(tmp_path / "data")).to_list()
    records = [json.loads(line) for line in (rollouts / "results.jsonl").read_text().splitlines()]
    expected = [
        s for r in records for s in state_to_samples(record_to_state(r), 0.0) if record_to_state(r).trainable
    ]
    assert len(rows) == len(expected) > 0
    for row, sample in zip(rows, expected, strict=True):
        assert row["input_ids"] == sample.token_ids and row["assistant_masks"] == sample.loss_mask
        assert 0 < sum(row["assistant_masks"]) < len(row["input_ids"])  # prompts and env turns masked out
    turns = record_to_state(records[0]).turns
    first = rows[0]
    assert first["input_ids"][: len(turns[0].prompt_ids)] == turns[0].prompt_ids
    assert first["messages"][-1]["role"] in ("assistant", "user", "tool")


def test_filters_top_k_and_dedupe(rollouts: Path, tmp_path: Path, capsys):
    from datasets import load_from_disk

    records = [json.loads(line) for line in (rollouts / "results.jsonl").read_text().splitlines()]
    code, out = export(
        [f"rollouts={rollouts / 'results.jsonl'}", f"output={tmp_path / 'top'}", "top_k=1"], capsys
    )
    assert code == 0 and "beyond top k 12" in out
    rows = load_from_disk(str(tmp_path / "top")).to_list()
    assert sorted(r["example_id"] for r in rows) == sorted({r["example_id"] for r in records})
    best = {
        e: max(r["reward"] for r in records if r["example_id"] == e)
        for e in {r["example_id"] for r in records}
    }
    assert all(r["reward"] == best[r["example_id"]] for r in rows)
    code, out = export([f"rollouts={rollouts}", f"output={tmp_path / 'none'}", "min_reward=2"], capsys)
    assert code == 2 and "no rollout in" in out and not (tmp_path / "none").exists()
    code, out = export([f"rollouts={rollouts}", f"output={tmp_path / 'top'}"], capsys)
    assert code == 2 and "already exists" in out
    code, out = export([f"rollouts={tmp_path / 'nope'}", f"output={tmp_path / 'x'}"], capsys)
    assert code == 2 and out.startswith("error: cannot read rollouts from")


def test_sft_trains_resumes_and_writes_a_model_the_other_clis_load(rollouts: Path, tmp_path: Path, capsys):
    from bridges.sft import main as sft

    export([f"rollouts={rollouts}", f"output={tmp_path / 'data'}"], capsys)
    base = [f"data={tmp_path / 'data'}", f"output_dir={tmp_path}", "run_name=warm", "trainer.batch_size=4",
            "trainer.learning_rate=3e-3", "progress=false"]
    assert sft([*base, "trainer.max_steps=4", "save_every=2"]) == 0
    run = tmp_path / "warm"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(
        0 < r["loss"] < 10 and r["grad_norm"] > 0 for r in rows
    )
    assert (run / "loss_curve.png").exists() and (run / "checkpoint-4").is_dir()
    assert sft([*base, "trainer.max_steps=6", "save_every=2", "resume=true"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # continued from step 4, each step once
    from bridges.eval import main as evaluate

    out = tmp_path / "eval"
    assert (
        evaluate(
            [
                "env=guess_number",
                f"model={run / 'final'}",
                "num_examples=2",
                "progress=false",
                f"output={out}",
            ]
        )
        == 0
    )
    from bridges.train import main as train

    args = ["env=bridges_test_dense_env", f"model={run / 'final'}", f"output_dir={tmp_path}", "run_name=rl", "progress=false",
            "trainer.max_steps=1", "trainer.batch_size=2", "trainer.group_size=2", "sampling.max_tokens=4"]
    assert train(args) == 0


def test_sft_refusals_are_one_sentence(tmp_path: Path, capsys):
    from bridges.sft import main as sft

    def refused(args: list[str]) -> str:
        with pytest.raises(SystemExit) as exit_info:
            run_cli(sft, args)
        assert exit_info.value.code == 2
        return capsys.readouterr().err

    assert "give data=" in refused([])
    assert "is not a saved dataset" in refused([f"data={tmp_path}"])
    assert "does not use trainer.group_size" in refused([f"data={tmp_path}", "trainer.group_size=4"])
