"""One vocabulary across commands: the same keys for the same things, old spellings refused with the new
one, ``help=<section>`` for every section a command takes, and no silent substitution."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from bridges.runs.config import run_cli


def run(module: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        run_cli(importlib.import_module(module).main, argv)
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err.strip()


@pytest.mark.parametrize(
    ("old", "new"),
    [("temperature=0.5", "sampling.temperature"), ("max_tokens=8", "sampling.max_tokens"),
     ("tinker_base_url=http://x", "tinker.base_url")],
)
def test_compare_refuses_its_old_spellings_naming_the_shared_key(old, new, capsys, tmp_path: Path):
    code, _, err = run("bridges.compare", [old, "dry_run=true", f"output={tmp_path}"], capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert f"(did you mean '{new}'? every command spells it so)" in err, err


def test_compare_takes_the_shared_keys_and_dry_runs_without_writing(capsys, tmp_path: Path):
    argv = ["sampling.temperature=0.5", "sampling.max_tokens=8", "tinker.base_url=http://x", "dry_run=true",
            f"output={tmp_path}/report", "backends=[grpo]"]
    code, out, err = run("bridges.compare", argv, capsys)
    assert code == 0, err
    assert "temperature: 0.5" in out and "max_tokens: 8" in out and "base_url: http://x" in out
    assert not (tmp_path / "report").exists()


def test_compare_dry_run_fails_as_a_real_run_would(capsys, tmp_path: Path):
    for dry in ("true", "false"):
        code, _, err = run("bridges.compare", ["env=repeat_leter", f"dry_run={dry}", f"output={tmp_path}"], capsys)
        assert code == 2 and "no environment 'repeat_leter' (did you mean 'repeat_letter'?)" in err, err


@pytest.mark.parametrize(
    ("section", "pieces"),
    [
        ("tinker", ["tinker.base_url", "tinker.adam_beta2", "tinker.adam_eps", "tinker.loss_fn"]),
        ("trl", ["trl.GRPOConfig", "trl.num_generations", "trl.beta"]),
        ("verl", ["verl.<path>=value", "verl.+<path>=value"]),
        ("grpo", ["no section of its own", "help=trainer"]),
        ("trainer", ["trainer.learning_rate", "trainer.gradient_checkpointing"]),
        ("sampling", ["sampling.temperature", "sampling.max_tokens"]),
    ],
)
def test_help_answers_for_every_section_of_train(section, pieces, capsys):
    code, out, err = run("bridges.train", [f"help={section}"], capsys)
    assert code == 0 and not err
    for piece in pieces:
        assert piece in out, (piece, out[:800])


@pytest.mark.parametrize(
    ("rank", "said"),
    [("0", "Tinker trains LoRA adapters only: trainer.lora_rank=0 (full fine-tuning) is not offered, so the "
           "adapter takes Tinker's default rank 32"),
     ("8", "Tinker trains a LoRA adapter of rank 8 (trainer.lora_rank).")],
)
def test_tinker_says_which_adapter_rank_it_trains(rank, said, capsys, tmp_path: Path):
    argv = ["backend=tinker", "tinker.base_url=local", f"trainer.lora_rank={rank}", "dry_run=true",
            f"output_dir={tmp_path}"]
    code, out, err = run("bridges.train", argv, capsys)
    assert code == 0, err
    assert said in out


def test_wandb_keys_without_report_to_wandb_are_refused(capsys, tmp_path: Path):
    code, _, err = run("bridges.train", ["wandb.project=mine", "dry_run=true", f"output_dir={tmp_path}"], capsys)
    assert code == 2 and "wandb.project/wandb.entity are set but report_to=none" in err, err


def test_wandb_project_and_entity_reach_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """report_to=wandb with wandb.project/entity: wandb.init gets them (offline, no key, no network)."""
    pytest.importorskip("wandb")
    import wandb

    from bridges.runs.metrics import MetricsLogger
    from bridges.runs.train_config import WandbConfig

    seen: dict[str, object] = {}

    def init(**kwargs: object) -> object:
        seen.update(kwargs)
        raise SystemExit(0)  # stop before a real wandb run starts

    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.setenv("WANDB_ENTITY", "from-env")
    settings = WandbConfig(project="mine")
    with pytest.raises(SystemExit):
        MetricsLogger(tmp_path, {}, "wandb", wandb_project=settings.resolved_project(),
                      wandb_entity=settings.resolved_entity())
    assert (seen["project"], seen["entity"]) == ("mine", "from-env")
