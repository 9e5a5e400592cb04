"""Recomputation by choice (``trainer.gradient_checkpointing``: off, full, every:K): the same gradients
as without it, exactly the layers chosen run their forward again in the backward, one sentence for a
bad setting on every command, and TRL (which re-enables every layer around its generation) refuses
a stride instead of silently recomputing everything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from bridges.models.recompute import apply_recompute, checkpointed_layers, recompute_stride
from bridges.runtime.errors import ConfigError


@pytest.mark.parametrize(
    ("setting", "stride"),
    [("off", 0), ("false", 0), (False, 0), ("full", 1), ("true", 1), (True, 1), ("every:1", 1), ("every:3", 3)],
)
def test_each_spelling_names_one_stride(setting: Any, stride: int):
    assert recompute_stride(setting) == stride


@pytest.mark.parametrize("setting", ["sometimes", "every:0", "every:", "every:-2", "every:two", "2"])
def test_a_bad_setting_is_one_sentence(setting: str):
    with pytest.raises(ConfigError, match=r"must be off, full or every:K .*got"):
        recompute_stride(setting)


def _model(tiny_path: Path, layers: int) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_path), num_hidden_layers=layers, dtype=torch.float32)
    return model.train()


def _gradients_and_forwards(tiny_path: Path, setting: str) -> tuple[list[torch.Tensor], list[int], int]:
    model = _model(tiny_path, layers=4)
    recomputed = apply_recompute(model, recompute_stride(setting))
    calls = [0] * len(checkpointed_layers(model))
    for index, layer in enumerate(checkpointed_layers(model)):
        layer.register_forward_pre_hook(lambda *_, i=index: calls.__setitem__(i, calls[i] + 1))
    ids = torch.randint(3, 100, (2, 24), generator=torch.Generator().manual_seed(1))
    out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None], calls, recomputed


def test_recomputation_keeps_the_gradients_and_reruns_only_the_chosen_layers(tiny_path: Path):
    reference, plain_calls, none = _gradients_and_forwards(tiny_path, "off")
    assert plain_calls == [1, 1, 1, 1] and none == 0
    for setting, expected_calls, count in (("full", [2, 2, 2, 2], 4), ("every:2", [2, 1, 2, 1], 2),
                                           ("every:3", [2, 1, 1, 2], 2)):
        grads, calls, recomputed = _gradients_and_forwards(tiny_path, setting)
        assert calls == expected_calls and recomputed == count, setting
        assert len(grads) == len(reference)
        for got, want in zip(grads, reference, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_trainer_config_takes_the_old_spellings_and_refuses_a_bad_one_in_one_sentence(tiny_path: Path):
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig

    assert parse_config(TrainConfig, ["trainer.gradient_checkpointing=true"]).trainer.gradient_checkpointing == "full"
    assert parse_config(TrainConfig, ["trainer.gradient_checkpointing=every:2"]).trainer.gradient_checkpointing == "every:2"
    assert parse_config(TrainConfig, []).trainer.gradient_checkpointing == "off"
    done = subprocess.run(
        [sys.executable, "-m", "bridges.train", "trainer.gradient_checkpointing=sometimes", "dry_run=true"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "trainer.gradient_checkpointing must be off, full or every:K" in done.stderr


def test_trl_recomputes_all_layers_or_none_and_refuses_a_stride(tiny_path: Path):
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig

    trl = pytest.importorskip("bridges.adapters.trl.backend")
    config = parse_config(TrainConfig, [f"model={tiny_path}", "backend=trl", "trainer.gradient_checkpointing=every:2"])
    with pytest.raises(ConfigError, match="backend=trl recomputes every decoder layer or none"):
        trl.check_recompute(config)
    full = parse_config(TrainConfig, [f"model={tiny_path}", "backend=trl", "trainer.gradient_checkpointing=full"])
    trl.check_recompute(full)
