"""A broken ledger (an agent that rewrote its history) through each backend's own conversion: grpo's and
Tinker's samples (``groups_to_samples``), TRL's ``rollout_func`` sample and verl's ``AgentLoopOutput`` split.
Under ``trainer.ledger_breaks=first`` all four train the same ids with the same mask; under ``every`` grpo
and Tinker add the later segments, each a sample; every backend counts the break in ``samples/breaks``."""

from __future__ import annotations

import json
import random
from pathlib import Path

from bridges.adapters.trl.rewards import RubricScorer
from bridges.adapters.trl.rollout import to_trl_sample
from bridges.adapters.verl.run_files import NATIVE_METRICS, fold_metrics
from bridges.envs.results import state_to_record
from bridges.envs.types import State, Turn
from bridges.workflows.advantages import build_group
from bridges.workflows.batches import groups_to_samples
from bridges.workflows.samples import SampleStats, count_breaks, prompt_completion, turns_to_samples

FIRST_IDS, FIRST_MASK = [1, 2, 3, 6], [0, 0, 1, 1]


def broken(reward: float, example_id: int = 0) -> State:
    """Three calls: the second re-renders the history (a break), the third extends the second."""
    turns = [
        Turn(prompt_ids=[1, 2], completion_ids=[3, 6], logprobs=[-1.0, -0.5]),
        Turn(prompt_ids=[1, 7, 3, 8], completion_ids=[4], logprobs=[-2.0]),
        Turn(prompt_ids=[1, 7, 3, 8, 4, 9], completion_ids=[5], logprobs=[-3.0]),
    ]
    return State(example_id=example_id, turns=turns, reward=reward, stop_reason="completed",
                 completion=[{"role": "assistant", "content": "x"}])


def plain(reward: float, example_id: int = 0) -> State:
    return State(example_id=example_id, turns=[Turn(prompt_ids=[1, 2], completion_ids=[3], logprobs=[-1.0])],
                 reward=reward, stop_reason="completed", completion=[{"role": "assistant", "content": "y"}])


def test_first_trains_the_same_ids_on_every_backend_and_every_adds_the_later_segments() -> None:
    group = build_group([broken(1.0), plain(0.0)], "grpo")
    first, first_stats = groups_to_samples([group], 512, first_segment_only=True)  # grpo and Tinker
    every, every_stats = groups_to_samples([group], 512)
    assert [s.token_ids for s in first] == [FIRST_IDS, [1, 2, 3]] and first[0].loss_mask == FIRST_MASK
    assert [s.token_ids for s in every] == [FIRST_IDS, [1, 7, 3, 8, 4, 9, 5], [1, 2, 3]]
    assert every[0].advantage == every[1].advantage > 0  # each segment a sample with the episode's advantage
    assert (first_stats.samples, first_stats.breaks) == (2, 1) and (every_stats.samples, every_stats.breaks) == (3, 1)

    trl = to_trl_sample(broken(1.0), renderer=None, max_completion_length=512)  # TRL's rollout_func
    assert trl["prompt_ids"] + trl["completion_ids"] == FIRST_IDS and trl["env_mask"] == FIRST_MASK[2:]
    assert trl["bridges_scores"]["breaks"] == 1
    verl = prompt_completion(broken(1.0), 512)  # verl's agent loop output
    assert verl is not None and verl.prompt_ids + verl.completion_ids == FIRST_IDS and verl.mask == FIRST_MASK[2:]
    assert verl.logprobs == [-1.0, -0.5] == first[0].logprobs[2:] and verl.breaks == 1


def test_trl_logs_the_breaks_of_its_batch() -> None:
    logged: dict[str, float] = {}
    scores = [to_trl_sample(s, None, 512)["bridges_scores"] for s in (broken(1.0), broken(0.0), plain(0.5))]
    RubricScorer._log(scores, logged.__setitem__)
    assert logged["samples/breaks"] == 2.0 and logged["env/errored_fraction"] == 0.0


def test_verls_rows_count_the_breaks_of_its_traces(tmp_path: Path) -> None:
    lines = [{**state_to_record(s), "provenance": {"step": 1, "split": "train"}} for s in (broken(1.0), plain(0.0))]
    (tmp_path / "traces.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / NATIVE_METRICS).parent.mkdir(parents=True)
    (tmp_path / NATIVE_METRICS).write_text(json.dumps({"step": 1, "data": {"actor/pg_loss": 0.1}}) + "\n")
    (row,) = fold_metrics(tmp_path, 0)
    assert row["samples/breaks"] == 1 and row["episodes/total"] == 2


def test_a_traces_breaks_follow_the_samples_rule() -> None:
    """``count_breaks`` (plain ids, as a trace holds them) agrees with ``turns_to_samples`` on random turns."""
    rng = random.Random(0)
    for _ in range(200):
        turns, running = [], [1]
        for _ in range(rng.randint(1, 5)):
            prompt = running + [rng.randint(2, 9)] if rng.random() < 0.7 else [1, rng.randint(2, 9)]
            completion = [rng.randint(2, 9) for _ in range(rng.randint(1, 3))]
            turns.append(Turn(prompt_ids=prompt, completion_ids=completion, logprobs=[0.0] * len(completion)))
            running = prompt + completion
        stats = SampleStats()
        turns_to_samples(turns, advantage=1.0, reward=1.0, example_id=0, stats=stats)
        assert count_breaks((t.prompt_ids, t.completion_ids) for t in turns) == stats.breaks


SMALL = ["env=bridges_test_side_talk_env", "progress=false", "trainer.max_steps=2", "trainer.batch_size=2",
         "trainer.group_size=8", "run_name=side"]


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_grpo_trains_every_segment_or_the_first_as_asked_and_counts_each_break(tmp_path: Path) -> None:
    """The same rollouts both ways (one seed; both steps sampled from the first weights, one step ahead):
    ``every`` trains two sequences for each rollout with an advantage, ``first`` one."""
    from bridges.train import main

    trained = {}
    for rule in ("every", "first"):
        assert main([f"output_dir={tmp_path / rule}", *SMALL, f"trainer.ledger_breaks={rule}"]) == 0
        rows = _rows(tmp_path / rule / "side")
        assert [r["samples/breaks"] for r in rows] == [16, 16]  # every rollout's side conversation, trained or not
        trained[rule] = [r["samples/trained"] for r in rows]
    assert sum(trained["first"]) > 0 and trained["every"] == [2 * n for n in trained["first"]]


def test_trl_trains_the_first_segment_and_counts_each_break(tmp_path: Path) -> None:
    from bridges.train import main

    assert main(["backend=trl", f"output_dir={tmp_path}", *SMALL]) == 0
    assert [r["samples/breaks"] for r in _rows(tmp_path / "side")] == [16.0, 16.0]
