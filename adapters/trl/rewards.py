"""An environment's rubric as TRL reward functions: one per weighted rubric function, named after it.

TRL sums its reward functions (times ``GRPOConfig.reward_weights``, 1.0 each by default), so each
function here returns ``weight * value``: with TRL's defaults the summed reward equals the
rubric's. Per-function values land in TRL's logs as ``rewards/<name>/mean``; unweighted values and
the rubric's other metrics go through TRL's ``log_metric`` as ``env/<name>``.

The rubric runs once per TRL batch, however many functions TRL calls: the first call scores the
batch and the rest read the result. Scores come from one of two places:
- TRL generated single-turn completions itself: the batch is split back into GRPO groups (TRL's
  sampler puts each prompt's ``num_generations`` completions next to each other) and each group is
  scored with ``rubric.score_group``, so group reward functions see exactly one prompt's completions.
- ``trl_rollout_func`` already ran and scored the rollouts: its scores arrive as the extra
  ``SCORES_KEY`` column and are read, not recomputed.
A rollout whose scoring failed returns ``None`` from every function; TRL 1.16 then keeps it out of
the group baseline and gives it advantage 0, which is this project's failure rule too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bridges.envs.base import Environment
from bridges.envs.types import State
from bridges.runtime.asyncutils import run_sync
from bridges.runtime.errors import ConfigError

SCORES_KEY = "bridges_scores"


def state_scores(state: State) -> dict[str, Any]:
    """What a TRL reward function needs from one scored rollout (plain data, safe to pass through TRL)."""
    return {"errored": state.errored, "metrics": dict(state.metrics), "error": state.error}


def split_groups(example_ids: Sequence[Any], num_generations: int | None) -> list[range]:
    """Index ranges of the GRPO groups in a TRL batch.

    With ``num_generations`` known the batch is cut into equal chunks. Without it, a group is a run
    of equal ``example_id``s; a run that is a multiple of the shortest run (the same prompt drawn
    twice in a row across an epoch boundary) is cut to that length.
    """
    size = len(example_ids)
    if num_generations:
        if size % num_generations:
            raise ConfigError(
                f"a TRL batch of {size} completions is not a whole number of groups of {num_generations}."
            )
        return [range(i, i + num_generations) for i in range(0, size, num_generations)]
    runs: list[range] = []
    start = 0
    for i in range(1, size + 1):
        if i == size or example_ids[i] != example_ids[start]:
            runs.append(range(start, i))
            start = i
    shortest = min((len(r) for r in runs), default=0)
    groups: list[range] = []
    for run in runs:
        step = shortest if shortest and len(run) % shortest == 0 else len(run)
        groups.extend(range(i, min(i + step, run.stop)) for i in range(run.start, run.stop, step))
    return groups


class RubricScorer:
    """Scores each TRL batch once (cached by the identity of TRL's ``completions`` list)."""

    def __init__(self, env: Environment, num_generations: int | None = None) -> None:
        self.env = env
        self.num_generations = num_generations
        self._batch: tuple[Any, list[dict[str, Any]]] | None = None

    def scores(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[dict[str, Any]]:
        if self._batch is not None and self._batch[0] is completions:
            return self._batch[1]
        if SCORES_KEY in columns:
            scores = list(columns[SCORES_KEY])
        else:
            scores = self._score(prompts, completions, columns)
        self._batch = (completions, scores)  # holding the list keeps its id from being reused
        log_metric = columns.get("log_metric")
        if log_metric is not None:
            self._log(scores, log_metric)
        return scores

    def _score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[dict[str, Any]]:
        from bridges.adapters.trl.dataset import strip_row_tags

        skip = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"}
        per_row = {k: v for k, v in columns.items() if k not in skip and isinstance(v, list)}
        states = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            row = {k: v[i] for k, v in per_row.items()}
            row["prompt"] = strip_row_tags(prompt) if isinstance(prompt, list) else prompt
            state = self.env.init_state(row)
            if isinstance(completion, str):
                completion = [{"role": "assistant", "content": completion}]
            state.completion = [dict(m) for m in completion]
            states.append(state)
        example_ids = per_row.get("example_id") or [s.example_id for s in states]
        groups = split_groups(example_ids, self.num_generations)

        async def score_all() -> None:
            for group in groups:
                await self.env.score([states[i] for i in group])

        run_sync(score_all())
        return [state_scores(s) for s in states]

    @staticmethod
    def _log(scores: list[dict[str, Any]], log_metric: Callable[[str, float], None]) -> None:
        valid = [s for s in scores if not s["errored"]]
        log_metric("env/errored_fraction", 1.0 - len(valid) / max(1, len(scores)))
        # a broken ledger's segments after the first, left out by TRL's one sequence a rollout (trl_rollout_func)
        log_metric("samples/breaks", float(sum(s.get("breaks", 0) for s in scores)))
        names = sorted({name for s in valid for name in s["metrics"]})
        for name in names:
            values = [s["metrics"][name] for s in valid if name in s["metrics"]]
            log_metric(f"env/{name}", sum(values) / len(values))


def trl_reward_funcs(env: Environment, num_generations: int | None = None) -> list[Callable[..., list]]:
    """The rubric's weighted functions as TRL reward functions (pass as ``reward_funcs=``).

    Works for both paths: completions TRL generated (single-turn environments) and rollouts from
    ``trl_rollout_func``. ``num_generations`` (GRPOConfig's) makes group splitting exact; without
    it groups are found from ``example_id`` runs, which ``trl_dataset`` provides.
    """
    weighted = rubric_weights(env)
    if not weighted:
        raise ConfigError("the environment's rubric has no reward function with a non-zero weight.")
    scorer = RubricScorer(env, num_generations)
    return [_reward_func(scorer, name, weight) for name, weight in weighted.items()]


def rubric_weights(env: Environment) -> dict[str, float]:
    """``{function: weight}`` of the rubric's functions TRL scores (those of non-zero weight), in order:
    the reward functions ``trl_reward_funcs`` builds, and what divides their logged means back out."""
    rubric = env.rubric
    pairs = zip(rubric.get_reward_func_names(), rubric.get_reward_weights(), strict=True)
    return {name: float(weight) for name, weight in pairs if weight != 0.0}


def _reward_func(scorer: RubricScorer, name: str, weight: float) -> Callable[..., list]:
    def reward_func(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        scores = scorer.scores(prompts, completions, columns)
        return [
            None if s["errored"] or name not in s["metrics"] else weight * float(s["metrics"][name])
            for s in scores
        ]

    reward_func.__name__ = reward_func.__qualname__ = name
    reward_func.__doc__ = f"{weight} x the environment's '{name}' reward."
    return reward_func
