"""Rollout state -> training samples.

Turns are merged into one sample while each turn's prompt extends the previous prompt + sampled
ids token-exactly (the token ledger guarantees that for our clients). When a turn does not extend
(a client that re-renders history, a rewritten conversation), a new sample starts and the break is
counted, instead of training on ids the model never saw.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bridges.envs.types import State, Turn
from bridges.workflows.types import TrainingSample


@dataclass(slots=True)
class SampleStats:
    samples: int = 0
    breaks: int = 0  # turns that did not extend the running sequence and started a new sample


def _check_turn(turn: Turn) -> None:
    if len(turn.logprobs) != len(turn.completion_ids):
        raise ValueError(
            f"a turn has {len(turn.completion_ids)} completion ids but {len(turn.logprobs)} logprobs; "
            "the engine must return exactly one logprob per sampled id."
        )


def extends(running: Sequence[int] | None, prompt_ids: Sequence[int]) -> bool:
    """Whether a turn's prompt continues the running sequence (the last prompt + its sampled ids) token for
    token: the one rule for where a sample ends, here and for a trace's ``count_breaks``."""
    return running is not None and list(prompt_ids[: len(running)]) == list(running)


def count_breaks(turns: Iterable[tuple[Sequence[int], Sequence[int]]]) -> int:
    """The breaks of a rollout given as (prompt ids, sampled ids) per turn: what a trace line holds."""
    breaks, running = 0, None
    for prompt_ids, completion_ids in turns:
        if running is not None and not extends(running, prompt_ids):
            breaks += 1
        running = [*prompt_ids, *completion_ids]
    return breaks


def turns_to_samples(
    turns: list[Turn],
    *,
    advantage: float,
    reward: float | None,
    example_id: int,
    valid: bool = True,
    stats: SampleStats | None = None,
) -> list[TrainingSample]:
    """Merge a rollout's turns into as few samples as token-exact extension allows."""
    samples: list[TrainingSample] = []
    current: TrainingSample | None = None
    for step in turns:
        _check_turn(step)
        running = current.token_ids if current is not None else None
        if running is not None and extends(running, step.prompt_ids):
            new_prompt = step.prompt_ids[len(running) :]
        else:
            if current is not None and stats is not None:
                stats.breaks += 1
            current = TrainingSample(
                token_ids=[],
                loss_mask=[],
                logprobs=[],
                advantage=advantage,
                reward=reward,
                example_id=example_id,
                weight_version=step.weight_version,
                valid=valid,
            )
            samples.append(current)
            new_prompt = list(step.prompt_ids)
        assert current is not None  # set on the first step: running is None there
        current.token_ids.extend(new_prompt)
        current.loss_mask.extend([0] * len(new_prompt))
        current.logprobs.extend([0.0] * len(new_prompt))
        current.token_ids.extend(step.completion_ids)
        current.loss_mask.extend([1] * len(step.completion_ids))
        current.logprobs.extend(step.logprobs)
        if step.weight_version is not None:
            current.weight_version = min(current.weight_version or step.weight_version, step.weight_version)
    if stats is not None:
        stats.samples += len(samples)
    return samples


def state_to_samples(
    state: State, advantage: float, stats: SampleStats | None = None
) -> list[TrainingSample]:
    """Training samples of one rollout; an untrainable one yields fully masked samples (no gradient)."""
    valid = state.trainable
    samples = turns_to_samples(
        state.turns,
        advantage=advantage if valid else 0.0,
        reward=state.reward,
        example_id=state.example_id,
        valid=valid,
        stats=stats,
    )
    if not valid:
        for sample in samples:
            sample.loss_mask = [0] * len(sample.loss_mask)
    return samples


@dataclass(slots=True)
class PromptCompletion:
    """One rollout as a prompt plus one completion: the shape TRL's ``rollout_func`` and verl's
    ``AgentLoopOutput`` each take per rollout (env/tool ids inside the completion, mask 0)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    mask: list[int]
    logprobs: list[float]
    breaks: int  # further samples (turns that did not extend the first) that were left out


def prompt_completion(state: State, max_completion: int | None = None) -> PromptCompletion | None:
    """The rollout's first sample split at its first prompt; None when nothing was sampled.

    With the token ledger every turn extends the last, so that sample is the whole rollout; a break
    (a turn that did not extend) would start a second sample, which is counted and left out. An
    untrainable rollout comes back with every mask entry 0. ``max_completion`` cuts the completion.
    """
    if not state.turns:
        return None
    samples = state_to_samples(state, advantage=0.0)
    first = samples[0]
    cut = len(state.turns[0].prompt_ids)
    end = None if max_completion is None else cut + max_completion
    return PromptCompletion(
        prompt_ids=first.token_ids[:cut],
        completion_ids=first.token_ids[cut:end],
        mask=first.loss_mask[cut:end],
        logprobs=first.logprobs[cut:end],
        breaks=len(samples) - 1,
    )


def truncate_sample(sample: TrainingSample, max_length: int) -> TrainingSample:
    """Cut a sample to ``max_length`` ids (a trainer's context budget), keeping lists aligned."""
    if len(sample.token_ids) <= max_length:
        return sample
    return sample.model_copy(
        update={
            "token_ids": sample.token_ids[:max_length],
            "loss_mask": sample.loss_mask[:max_length],
            "logprobs": sample.logprobs[:max_length],
        }
    )
