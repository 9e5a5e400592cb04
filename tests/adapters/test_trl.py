"""The TRL adapter inside a real ``GRPOTrainer`` on CPU, with the tiny model (no vLLM)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from bridges.adapters.trl import (
    ROW_KEY,
    SCORES_KEY,
    RowIndex,
    trl_dataset,
    trl_rollout_func,
    trl_trainer_kwargs,
)
from bridges.envs.registry import load_environment
from bridges.runtime.errors import ConfigError

GENERATIONS = 4


def make_trainer(model_path: Path, env: Any, tmp_path: Path, **overrides: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    settings = dict(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=2 * GENERATIONS,
        num_generations=GENERATIONS, max_completion_length=32, max_steps=2, learning_rate=5e-3,
        use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, seed=0,
    )
    settings.update(overrides)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    return GRPOTrainer(
        model=model,
        args=GRPOConfig(**settings),
        processing_class=AutoTokenizer.from_pretrained(model_path),
        **trl_trainer_kwargs(env, num_generations=GENERATIONS),
    )


def capture_batches(trainer: Any) -> list[dict[str, Any]]:
    """Spy on what TRL built for each step (ids, masks) after our functions returned."""
    batches: list[dict[str, Any]] = []
    original = trainer._generate_and_score_completions

    def spy(inputs: Any) -> Any:
        out = original(inputs)
        batches.append(out)
        return out

    trainer._generate_and_score_completions = spy
    return batches


def train_and_check(trainer: Any) -> list[dict[str, Any]]:
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logs) == 2
    for log in logs:
        assert torch.isfinite(torch.tensor(log["loss"])) and log["env/errored_fraction"] == 0.0
        assert log["reward"] == pytest.approx(
            log["rewards/lowercase_share/mean"] + log["rewards/group_rank/mean"]
        )
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the policy moved
    return logs


def test_single_turn_env_trains_on_trls_own_generation(tiny_path: Path, tmp_path: Path):
    import bridges_test_trl_envs as envs

    env = envs.single_turn()
    kwargs = trl_trainer_kwargs(env, GENERATIONS)
    assert "rollout_func" not in kwargs and [f.__name__ for f in kwargs["reward_funcs"]] == [
        "lowercase_share",
        "group_rank",
    ]
    envs.GROUP_CALLS.clear()
    trainer = make_trainer(tiny_path, env, tmp_path, max_completion_length=8)
    logs = train_and_check(trainer)
    # the rubric's weight (0.5) is applied: a group_rank reward is 0 or 0.5, never 1
    assert 0.0 < logs[0]["rewards/group_rank/mean"] <= 0.5
    assert len(envs.GROUP_CALLS) == 4  # 2 steps x 2 prompts, each scored as its own group
    for seen in envs.GROUP_CALLS:
        assert len(seen) == GENERATIONS and len(set(seen)) == 1


def test_multi_turn_env_masks_environment_tokens(tiny_path: Path, tmp_path: Path, tiny_tokenizer: Any):
    import bridges_test_trl_envs as envs

    env = envs.two_turns()
    envs.GROUP_CALLS.clear()
    trainer = make_trainer(tiny_path, env, tmp_path, max_completion_length=64)  # 2 turns of 8 + the reply
    batches = capture_batches(trainer)
    train_and_check(trainer)
    assert len(envs.GROUP_CALLS) == 4 and all(
        len(set(g)) == 1 and len(g) == GENERATIONS for g in envs.GROUP_CALLS
    )
    reply = "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    for batch in batches:
        ids, completion_mask, tool_mask = (
            batch["completion_ids"],
            batch["completion_mask"],
            batch["tool_mask"],
        )
        for row in range(ids.shape[0]):
            real = completion_mask[row].bool()
            masked = ids[row][real & (tool_mask[row] == 0)].tolist()
            # masked: exactly the environment's reply, after the end-of-turn ids that closed the first turn
            # ("\n" after a sampled <|im_end|>, the whole "<|im_end|>\n" after a turn cut by length)
            assert tiny_tokenizer.decode(masked) in ("\n" + reply, "<|im_end|>\n" + reply)
            assert int(tool_mask[row][real].sum()) > 0  # the sampled turns are trained


def test_tool_env_masks_tool_results(tool_model_path: Path, tmp_path: Path, tiny_tokenizer: Any):
    import bridges_test_trl_envs as envs

    trainer = make_trainer(
        tool_model_path, envs.add_tool(), tmp_path, max_steps=1, temperature=0.1, max_completion_length=160
    )
    batches = capture_batches(trainer)
    trainer.train()
    batch = batches[0]
    decoded = []
    for row in range(batch["completion_ids"].shape[0]):
        ids, mask = batch["completion_ids"][row], batch["tool_mask"][row]
        real = batch["completion_mask"][row].bool()
        decoded.append(
            (tiny_tokenizer.decode(ids[real & (mask == 1)]), tiny_tokenizer.decode(ids[real & (mask == 0)]))
        )
    assert all('"name": "add"' in sampled and "The sum is 5." in sampled for sampled, _ in decoded)
    assert all("<tool_response>\n5\n</tool_response>" in added for _, added in decoded)
    log = next(h for h in trainer.state.log_history if "reward" in h)
    assert log["env/tool_calls"] == 1.0 and log["reward"] == 1.0


def test_rollouts_are_cut_to_max_completion_length(tiny_path: Path, tmp_path: Path):
    import bridges_test_trl_envs as envs

    env = envs.two_turns()
    trainer = make_trainer(tiny_path, env, tmp_path, max_completion_length=12)
    rows = trl_dataset(env)
    prompts = [rows[0]["prompt"]] * GENERATIONS + [rows[1]["prompt"]] * GENERATIONS
    out = trl_rollout_func(env)(prompts, trainer)
    assert len(out["prompt_ids"]) == 2 * GENERATIONS
    for ids, mask, logprobs in zip(out["completion_ids"], out["env_mask"], out["logprobs"], strict=True):
        assert len(ids) == len(mask) == len(logprobs) <= 12
    assert all(not s["errored"] for s in out[SCORES_KEY])


def test_sampling_max_tokens_caps_each_turn_inside_the_episode_budget(tiny_path: Path, tmp_path: Path):
    """``backend=trl`` passes ``sampling.max_tokens`` as the rollout's per-turn cap (the environment's own is 8):
    each sampled turn is at most 3 ids, and both turns run inside ``max_completion_length``."""
    import bridges_test_trl_envs as envs

    env = envs.two_turns()
    trainer = make_trainer(tiny_path, env, tmp_path, max_completion_length=200)
    rows = trl_dataset(env)
    func = trl_trainer_kwargs(env, GENERATIONS, {"max_tokens": 3})["rollout_func"]
    out = func([rows[0]["prompt"]] * GENERATIONS, trainer)
    for mask in out["env_mask"]:
        runs = [r for r in "".join(map(str, mask)).split("0") if r]
        assert len(runs) == 2 and all(1 <= len(r) <= 3 for r in runs)
    capped = trl_rollout_func(env, sampling_args={"max_tokens": 500})([rows[0]["prompt"]] * GENERATIONS,
                                                                       make_trainer(tiny_path, env, tmp_path,
                                                                                    max_completion_length=5))
    assert all(len(ids) <= 5 for ids in capped["completion_ids"])  # a turn never exceeds the episode's budget


@pytest.mark.parametrize("setting", [{"repetition_penalty": 1.2}, {"min_p": 0.05}, {"generation_kwargs": {"typical_p": 0.9}}])
def test_sampling_settings_a_multi_turn_rollout_cannot_honour_are_refused(
    tiny_path: Path, tmp_path: Path, setting: dict[str, Any]
):
    """TRL applies these to its own generation only; the rollout's turns would sample without them."""
    import bridges_test_trl_envs as envs

    env = envs.two_turns()
    trainer = make_trainer(tiny_path, env, tmp_path, **setting)
    with pytest.raises(ConfigError, match=f"which has no {next(iter(setting))}"):
        trl_rollout_func(env)([trl_dataset(env)[0]["prompt"]] * GENERATIONS, trainer)


def test_tools_given_to_trl_as_well_are_refused(tiny_path: Path, tmp_path: Path):
    import bridges_test_trl_envs as envs

    env = envs.two_turns()
    trainer = make_trainer(tiny_path, env, tmp_path)
    trainer.tools = [envs.add]  # what GRPOTrainer(tools=[...]) sets
    with pytest.raises(ConfigError, match="ignores env_mask"):
        trl_rollout_func(env)([trl_dataset(env)[0]["prompt"]] * GENERATIONS, trainer)


def test_rows_are_found_by_tag_and_ambiguous_untagged_prompts_are_refused():
    env = load_environment("guess_number")
    index = RowIndex(env)
    tagged = trl_dataset(env)
    for position in (0, 5, 17):
        prompt = tagged[position]["prompt"]
        assert prompt[0][ROW_KEY] == f"train:{position}"
        assert index.row_for(prompt)["answer"] == env.get_dataset()[position]["answer"]
    untagged = env.get_dataset()[0]["prompt"]
    with pytest.raises(ConfigError, match="matches several rows"):
        index.row_for(untagged)
    unique = load_environment("reverse_text")
    assert RowIndex(unique).row_for(unique.get_dataset()[3]["prompt"])["example_id"] == 3
    with pytest.raises(ConfigError, match="matches no row"):
        RowIndex(unique).row_for([{"role": "user", "content": "not in the dataset"}])


@pytest.mark.slow
def test_backend_trl_reward_rises_on_the_toy_env(tmp_path: Path):
    from bridges.train import main

    args = [
        "backend=trl", f"output_dir={tmp_path}", "progress=false", "trainer.max_steps=100",
        "trainer.batch_size=8", "trainer.group_size=8", "trainer.learning_rate=5e-3",
    ]
    assert main(args) == 0
    rows = [
        json.loads(x) for x in (tmp_path / "trl-repeat_letter" / "metrics.jsonl").read_text().splitlines()
    ]
    rewards = [r["reward/mean"] for r in rows]
    assert [r["step"] for r in rows] == list(range(1, 101))
    first, last = sum(rewards[:10]) / 10, sum(rewards[-20:]) / 20
    assert first < 0.05 and last > first + 0.05, (first, last)
    assert (tmp_path / "trl-repeat_letter" / "reward_curve.png").exists()


@pytest.mark.slow
def test_backend_trl_on_two_processes_writes_its_run_files_once(tmp_path):
    """accelerate's data parallelism under bridges.runtime.launch; the first process alone claims the folder and
    writes metrics.jsonl (every process used to, each line twice)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "bridges.train", "backend=trl", "trainer.num_processes=2",
                           "trainer.max_steps=2", "trainer.batch_size=4", "trainer.group_size=4", "progress=false"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("reward: first") == 1 and done.stdout.count("template check") == 1
    assert done.stderr.strip() == ""  # nothing repeated per process either
    rows = [json.loads(x) for x in (tmp_path / "runs" / "trl-repeat_letter" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["episodes/total"] == 16 for r in rows)
