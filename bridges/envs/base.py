"""The environment base class: datasets, scoring, and running many rollouts with bounded concurrency.

One ``Environment`` object serves evaluation (``evaluate``), data generation (``generate``) and every
training backend (``run_group``), so the dataset conventions, the concurrency bound and the failure
rules are the same everywhere. The rollout loop itself lives in ``MultiTurnEnv``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bridges.envs.messages import to_message_dicts
from bridges.envs.parsers import Parser
from bridges.envs.rubric import Rubric, as_finite_reward
from bridges.envs.types import Messages, State, StopReason
from bridges.runtime.asyncutils import LoopSemaphore, maybe_await, run_sync
from bridges.runtime.errors import ConfigError
from bridges.runtime.gc_policy import relaxed_gc

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)
DatasetLike = Any  # datasets.Dataset or a zero-argument callable returning one
OnGroup = Callable[[list[State]], Awaitable[None] | None]
CORE_COLUMNS = frozenset({"prompt", "answer", "info", "task", "example_id"})


def parse_info(info: Any) -> dict[str, Any]:
    """``info`` may be a dict, a JSON string or missing; always return a dict."""
    if info is None or info == "":
        return {}
    if isinstance(info, str):
        try:
            value = json.loads(info)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"a dataset row's 'info' is not valid JSON ({exc}).") from exc
        return value if isinstance(value, dict) else {"value": value}
    if isinstance(info, dict):
        return info
    raise ConfigError(f"a dataset row's 'info' must be a dict or a JSON string, got {type(info).__name__}.")


def group_sampling_args(
    sampling_args: dict[str, Any] | None, example_id: int, group_size: int
) -> dict[str, Any] | None:
    """The sampling arguments of one row's group: a ``seed`` moves by ``example_id * group_size``.

    Without the shift every group of a batch would sample with the same seeds, so different prompts
    would share one noise stream; with it every rollout of a batch has its own seed, and a row's
    seeds do not depend on which other rows share the batch (a resumed evaluation regenerates the
    same rollouts).
    """
    seed = (sampling_args or {}).get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        return sampling_args
    return {**sampling_args, "seed": seed + int(example_id) * group_size}  # type: ignore[dict-item]


def build_prompt(
    row: dict[str, Any], system_prompt: str | None = None, few_shot: Messages | None = None
) -> list[dict[str, Any]]:
    """The prompt messages of a row: its ``prompt``, or ``question`` with the system prompt and few-shot."""
    prompt = row.get("prompt")
    if prompt is None:
        if row.get("question") is None:
            raise ConfigError(
                f"a dataset row needs a 'prompt' (list of messages) or a 'question' column; it has {sorted(row)}."
            )
        head = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return [*head, *to_message_dicts(few_shot), {"role": "user", "content": str(row["question"])}]
    messages = to_message_dicts(prompt)
    if system_prompt and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def prompt_problem(prompt: Any) -> str | None:
    """What is wrong with one row's ``prompt`` value (None when it is a string or a list of chat messages)."""
    if isinstance(prompt, str):
        return None
    if not isinstance(prompt, (list, tuple)):
        return f"it is {type(prompt).__name__} {prompt!r:.80}"
    try:
        messages = to_message_dicts(prompt)
    except (TypeError, ValueError, AttributeError) as exc:
        return str(exc).rstrip(".")
    for index, message in enumerate(messages):  # a column of messages reads a missing role as None
        if not isinstance(message.get("role"), str) or not message["role"]:
            return f"message {index} has no 'role' ({message!r:.80})"
    return None


def check_prompts(dataset: Any, where: str) -> None:
    """Refuse, before any rollout starts, a row whose prompt is neither a string nor a list of chat
    messages, naming the row and the column: found mid-run, such a row would end a run that has
    already spent its time, with a traceback from deep inside the rollout."""
    if "prompt" not in dataset.column_names:  # question-only rows get their prompt from build_prompt
        return
    questions = dataset["question"] if "question" in dataset.column_names else None
    for index, prompt in enumerate(dataset["prompt"]):
        if prompt is None:  # build_prompt falls back to the row's question
            has_question = questions is not None and questions[index] is not None
            problem = None if has_question else "it is empty and the row has no 'question'"
        else:
            problem = prompt_problem(prompt)
        if problem is not None:
            raise ConfigError(
                f"row {index} of {where}, column 'prompt': {problem}; a prompt is a string or a list of chat "
                "messages ({'role': ..., 'content': ...})."
            )


@dataclass
class GenerateResult:
    """The states of a ``generate``/``evaluate`` run, in row order, with export and summary helpers."""

    states: list[State]
    rollouts_per_example: int = 1
    model: str | None = None
    env_id: str | None = None
    sampling_args: dict[str, Any] = field(default_factory=dict)

    def to_records(self) -> list[dict[str, Any]]:
        from bridges.envs.results import state_to_record

        return [state_to_record(s) for s in self.states]

    def to_dataset(self) -> Dataset:
        from datasets import Dataset

        return Dataset.from_list(self.to_records())

    def summary(self, pass_threshold: float = 0.5) -> dict[str, Any]:
        """Reward mean/stderr over valid rollouts, pass@k per example, stop reasons, tokens, errors."""
        valid = [s for s in self.states if not s.errored and s.reward is not None]
        rewards = [float(s.reward) for s in valid]  # type: ignore[arg-type]
        n = len(rewards)
        mean = sum(rewards) / n if n else None
        stderr = None
        if n > 1 and mean is not None:
            var = sum((r - mean) ** 2 for r in rewards) / (n - 1)
            stderr = math.sqrt(var / n)
        by_example: dict[int, list[State]] = {}
        for s in self.states:
            by_example.setdefault(s.example_id, []).append(s)
        passed = [
            any(not s.errored and s.reward is not None and s.reward >= pass_threshold for s in group)
            for group in by_example.values()
        ]
        all_passed = [
            all(not s.errored and s.reward is not None and s.reward >= pass_threshold for s in group)
            for group in by_example.values()
        ]
        stop_reasons: dict[str, int] = {}
        for s in self.states:
            key = s.stop_reason or "none"
            stop_reasons[key] = stop_reasons.get(key, 0) + 1
        metric_names = sorted({k for s in valid for k in s.metrics})
        metrics = {
            k: sum(s.metrics[k] for s in valid if k in s.metrics) / sum(1 for s in valid if k in s.metrics)
            for k in metric_names
        }
        total = len(self.states)
        counts = [_token_counts(s) for s in self.states]
        prompt_tokens = [c[0] for c in counts]
        completion_tokens = [c[1] for c in counts]
        return {
            "num_rollouts": total,
            "num_examples": len(by_example),
            "rollouts_per_example": self.rollouts_per_example,
            "num_errored": sum(1 for s in self.states if s.errored),
            "reward_mean": mean,
            "reward_stderr": stderr,
            "pass_threshold": pass_threshold,
            "pass_at_k": {
                "k": self.rollouts_per_example,
                "value": sum(passed) / len(passed) if passed else None,
            },
            "pass_all_k": sum(all_passed) / len(all_passed) if all_passed else None,
            "stop_reasons": stop_reasons,
            "metrics": metrics,
            "prompt_tokens_mean": sum(prompt_tokens) / total if total else None,
            "completion_tokens_mean": sum(completion_tokens) / total if total else None,
        }


def _token_counts(state: State) -> tuple[int, int]:
    """(prompt, completion) tokens summed over model calls, as an API bills them.

    Token ids when the client returned them, else the ``usage`` the endpoint reported.
    """
    if any(t.prompt_ids or t.completion_ids for t in state.turns):
        return sum(len(t.prompt_ids) for t in state.turns), sum(len(t.completion_ids) for t in state.turns)
    usage = state.extras.get("usage") or {}
    return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))


class Environment:
    """Datasets, a rubric, a parser and sampling defaults; ``rollout`` is implemented by subclasses."""

    # why saved traces of this environment cannot be scored again (``bridges.rescore``), or None when
    # its rubric needs only what a trace keeps (prompt, completion, answer, info, task)
    rescore_refusal: str | None = None
    # how many consecutive dataset rows belong together (a multi-agent task's seat rows): the bundled
    # trainer's and Tinker's data order shuffles such blocks whole, so their rollouts run in one batch
    rows_together: int = 1
    # tokens a rollout's prompt carries beyond the rendered dataset prompt, which a backend that sizes
    # its prompt budget up front (verl) must leave room for: a harness program's own system prompt and
    # tool schemas (verifiers v1 program harnesses)
    prompt_overhead_tokens: int = 0

    def __init__(
        self,
        dataset: DatasetLike | None = None,
        eval_dataset: DatasetLike | None = None,
        *,
        system_prompt: str | None = None,
        few_shot: Messages | None = None,
        parser: Parser | None = None,
        rubric: Rubric | None = None,
        sampling_args: dict[str, Any] | None = None,
        max_concurrent: int = 64,
        rollout_timeout: float | None = None,
        model_timeout: float = 600.0,
        hook_timeout: float | None = 120.0,
        max_retries: int = 2,
        retry_base_delay: float = 0.5,
        retry_max_delay: float = 8.0,
        env_id: str | None = None,
        env_args: dict[str, Any] | None = None,
    ) -> None:
        self._dataset_source = dataset
        self._eval_dataset_source = eval_dataset
        self._dataset: Dataset | None = None
        self._eval_dataset: Dataset | None = None
        self._lock = threading.Lock()
        self.system_prompt = system_prompt
        self.few_shot = list(few_shot or [])
        self.parser = parser if parser is not None else (rubric.parser if rubric is not None else Parser())
        self.rubric = rubric if rubric is not None else Rubric(parser=self.parser)
        self.sampling_args = dict(sampling_args or {})
        self.max_concurrent = max_concurrent  # builds the semaphore (property below)
        self.rollout_timeout = rollout_timeout
        self.model_timeout = model_timeout
        self.hook_timeout = hook_timeout  # bounds each setup_state / env_response / stop condition call
        self.max_retries = max_retries
        self.retry_base_delay = retry_base_delay
        self.retry_max_delay = retry_max_delay
        self.env_id = env_id
        self.env_args = dict(env_args or {})

    @property
    def max_concurrent(self) -> int:
        """Rollouts in flight at once (``run_group``/``generate``); setting it applies to rollouts
        started afterwards (the trainers set it from ``trainer.max_concurrent``)."""
        return self._semaphore.value

    @max_concurrent.setter
    def max_concurrent(self, value: int) -> None:
        if value < 1:
            raise ConfigError(f"max_concurrent must be at least 1, got {value}.")
        self._semaphore = LoopSemaphore(value)

    # --- datasets -----------------------------------------------------------------------------
    def format_dataset(self, dataset: Dataset) -> Dataset:
        """Add ``prompt`` (from ``question``), the system prompt, ``example_id`` and ``answer``."""
        columns = set(dataset.column_names)
        if len(dataset) == 0:  # nothing to format; the CLIs refuse an empty split in one sentence
            return dataset
        if "prompt" not in columns and "question" not in columns:
            raise ConfigError(f"a dataset needs a 'prompt' or a 'question' column; it has {sorted(columns)}.")
        if "example_id" not in columns:
            dataset = dataset.add_column("example_id", list(range(len(dataset))))
        if "answer" not in columns:
            dataset = dataset.add_column("answer", [""] * len(dataset))
        if "prompt" in columns and self.few_shot:
            logger.warning(
                "few_shot is ignored for a dataset that has a 'prompt' column (it applies to 'question')."
            )
        if "prompt" not in columns or self.system_prompt:
            system_prompt, few_shot = self.system_prompt, self.few_shot
            from datasets.utils.logging import (
                disable_progress_bar,
                enable_progress_bar,
                is_progress_bar_enabled,
            )

            was_enabled = is_progress_bar_enabled()
            disable_progress_bar()  # a "Map: 100%" bar on every environment build is noise
            try:
                dataset = dataset.map(lambda row: {"prompt": build_prompt(row, system_prompt, few_shot)})
            finally:
                if was_enabled:
                    enable_progress_bar()
        return dataset

    def _build(self, source: DatasetLike) -> Dataset:
        dataset = source() if callable(source) and not hasattr(source, "column_names") else source
        if not hasattr(dataset, "column_names"):
            raise ConfigError(
                f"a dataset must be a datasets.Dataset or a callable returning one, got {type(dataset).__name__}."
            )
        return self.format_dataset(dataset)

    @property
    def dataset(self) -> Dataset | None:
        if self._dataset is None and self._dataset_source is not None:
            with self._lock:
                if self._dataset is None:
                    self._dataset = self._build(self._dataset_source)
        return self._dataset

    @property
    def eval_dataset(self) -> Dataset | None:
        if self._eval_dataset is None and self._eval_dataset_source is not None:
            with self._lock:
                if self._eval_dataset is None:
                    self._eval_dataset = self._build(self._eval_dataset_source)
        return self._eval_dataset

    @staticmethod
    def _select(dataset: Dataset, n: int, seed: int | None) -> Dataset:
        if seed is not None:
            dataset = dataset.shuffle(seed=seed)
        if n is not None and n >= 0:
            dataset = dataset.select(range(min(n, len(dataset))))
        return dataset

    def get_dataset(self, n: int = -1, seed: int | None = None) -> Dataset:
        """The training dataset (first ``n`` rows after an optional seeded shuffle)."""
        if self.dataset is None:
            raise ConfigError("this environment has no training dataset; pass dataset= when building it.")
        return self._select(self.dataset, n, seed)

    def get_eval_dataset(self, n: int = -1, seed: int | None = None) -> Dataset:
        """The evaluation dataset, falling back to the training dataset when there is none."""
        dataset = self.eval_dataset if self.eval_dataset is not None else self.dataset
        if dataset is None:
            raise ConfigError(
                "this environment has no dataset; pass eval_dataset= or dataset= when building it."
            )
        return self._select(dataset, n, seed)

    # --- one rollout --------------------------------------------------------------------------
    def init_state(self, row: dict[str, Any], example_id: int | None = None) -> State:
        """A fresh state from a dataset row (formatted or raw)."""
        row = dict(row)
        if example_id is None:
            example_id = row.get("example_id")
        return State(
            example_id=int(example_id or 0),
            task=str(row.get("task") or "default"),
            prompt=build_prompt(row, self.system_prompt, self.few_shot),
            answer="" if row.get("answer") is None else str(row["answer"]),
            info=copy.deepcopy(parse_info(row.get("info"))),  # rollouts of a group must not share it
            row={k: v for k, v in row.items() if k not in CORE_COLUMNS},
        )

    def mark_timed_out(self, state: State) -> None:
        """The rollout ran past ``rollout_timeout``: masked, with the bound in its one sentence."""
        state.stop_reason = StopReason.TIMEOUT.value
        state.error = (
            f"TimeoutError: the rollout did not finish within rollout_timeout={self.rollout_timeout} s."
        )

    def merged_sampling_args(self, sampling_args: dict[str, Any] | None) -> dict[str, Any]:
        """The environment's defaults overridden by the call's; ``n`` other than 1 is refused."""
        args = {**self.sampling_args, **(sampling_args or {})}
        if args.get("n", 1) != 1:
            raise ConfigError(
                f"sampling_args n={args['n']} is not supported: a rollout samples one reply per turn; "
                "ask for several rollouts with rollouts_per_example or run_group(group_size=...)."
            )
        return args

    async def rollout(
        self, row: dict[str, Any], client: Any, model: str, sampling_args: dict[str, Any] | None = None
    ) -> State:
        """One episode of ``row``: a fresh state, filled by ``run_episode`` under the merged sampling
        arguments, its turns counted and its wall time kept. Every environment shares this frame; what
        an episode is lives in ``run_episode``."""
        started = time.perf_counter()
        state = self.init_state(row)
        await self.run_episode(row, state, client, model, self.merged_sampling_args(sampling_args))
        state.metrics["num_turns"] = float(len(state.turns))
        state.timing.total_s = time.perf_counter() - started
        return state

    async def run_episode(
        self, row: dict[str, Any], state: State, client: Any, model: str, args: dict[str, Any]
    ) -> None:
        """Hook: play one episode into ``state`` (turns, completion, stop reason, reward where the
        episode itself scores). A failure ends it with a stop reason and ``state.error``, never an
        exception."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement run_episode(); subclass MultiTurnEnv."
        )

    async def score_rollout(self, state: State) -> None:
        await self.rubric.score_rollout(state)

    async def score_group(self, states: list[State]) -> None:
        """Hook: score a group in place (the rubric by default)."""
        await self.rubric.score_group(states)

    async def score(self, states: list[State]) -> None:
        """Score a group through ``score_group``, then mask any reward that is not a finite number.

        The rubric already refuses NaN, inf and non-numbers; this catches scoring code outside it (an
        overridden ``score_group``, an adapter) before a NaN reaches a group baseline and the weights.
        """
        await self.score_group(states)
        for state in states:
            if state.reward is not None and as_finite_reward(state.reward) is None:
                state.error = state.error or (
                    f"the environment scored this rollout {state.reward!r:.40}, which is not a finite number."
                )
                state.stop_reason = StopReason.REWARD_ERROR.value
                state.reward = None

    # --- groups and many groups ---------------------------------------------------------------
    async def _bounded_rollout(
        self, row: dict[str, Any], client: Any, model: str, sampling_args: dict[str, Any] | None, sem: Any
    ) -> State:
        async with sem:
            return await self.rollout(row, client, model, sampling_args)

    async def run_group(
        self,
        row: dict[str, Any],
        client: Any,
        model: str,
        group_size: int,
        sampling_args: dict[str, Any] | None = None,
        *,
        semaphore: LoopSemaphore | None = None,
    ) -> list[State]:
        """``group_size`` rollouts of one row (under the environment's concurrency bound), scored as one group.

        A ``seed`` in ``sampling_args`` seeds the group: member ``i`` samples with ``seed + i``, so the
        members differ from each other while the whole group stays reproducible.
        """
        if group_size < 1:
            raise ConfigError(f"group_size (rollouts per example) must be at least 1, got {group_size}.")
        sem = semaphore or self._semaphore
        seed = (sampling_args or {}).get("seed")
        member_args = [
            {**sampling_args, "seed": seed + i} if isinstance(seed, int) and sampling_args else sampling_args
            for i in range(group_size)
        ]
        states = list(
            await asyncio.gather(
                *(self._bounded_rollout(row, client, model, args, sem) for args in member_args)
            )
        )
        await self.score(states)
        return states

    async def generate(
        self,
        rows: Dataset | Iterable[dict[str, Any]],
        client: Any,
        model: str,
        *,
        rollouts_per_example: int = 1,
        sampling_args: dict[str, Any] | None = None,
        max_concurrent: int | None = None,
        progress: bool = True,
        on_group: OnGroup | None = None,
    ) -> GenerateResult:
        """Run ``rollouts_per_example`` rollouts of every row; ``on_group`` sees each group as it finishes.

        A group that fails unexpectedly cancels the rest and re-raises, but every group finished before
        has already been handed to ``on_group``, so a caller persisting there loses nothing.
        """
        merged_args = self.merged_sampling_args(sampling_args)  # bad arguments fail before any work
        row_list = [dict(r) for r in rows]
        for i, row in enumerate(row_list):
            row.setdefault("example_id", i)
            self.init_state(row)  # a malformed row fails here, before any work is started
        sem = LoopSemaphore(max_concurrent) if max_concurrent is not None else self._semaphore
        bar = _progress_bar(
            len(row_list) * rollouts_per_example, progress, self.env_id or type(self).__name__
        )
        results: list[list[State] | None] = [None] * len(row_list)

        async def one(i: int, row: dict[str, Any]) -> None:
            args = group_sampling_args(sampling_args, row["example_id"], rollouts_per_example)
            states = await self.run_group(row, client, model, rollouts_per_example, args, semaphore=sem)
            results[i] = states
            if on_group is not None:
                await maybe_await(on_group(states))
            if bar is not None:
                bar.update(len(states))
                valid = [s.reward for s in states if s.reward is not None]
                if valid:
                    bar.set_postfix(reward=f"{sum(valid) / len(valid):.3f}", refresh=False)

        tasks = [asyncio.ensure_future(one(i, row)) for i, row in enumerate(row_list)]
        with relaxed_gc(rollouts=min(len(tasks) * rollouts_per_example, sem.value)):  # live rollouts: see bridges/runtime/gc_policy.py
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                if bar is not None:
                    bar.close()
        states = [s for group in results if group is not None for s in group]
        return GenerateResult(
            states=states,
            rollouts_per_example=rollouts_per_example,
            model=model,
            env_id=self.env_id,
            sampling_args=merged_args,
        )

    async def evaluate(
        self,
        client: Any,
        model: str,
        *,
        num_examples: int = -1,
        rollouts_per_example: int = 1,
        sampling_args: dict[str, Any] | None = None,
        max_concurrent: int | None = None,
        progress: bool = True,
        skip_example_ids: Sequence[int] = (),
        on_group: OnGroup | None = None,
    ) -> GenerateResult:
        """Evaluate on the first ``num_examples`` eval rows, skipping ids already done (resume)."""
        dataset = self.get_eval_dataset(n=num_examples)
        skip = set(skip_example_ids)
        rows = [row for row in dataset if row["example_id"] not in skip]
        return await self.generate(
            rows,
            client,
            model,
            rollouts_per_example=rollouts_per_example,
            sampling_args=sampling_args,
            max_concurrent=max_concurrent,
            progress=progress,
            on_group=on_group,
        )

    def generate_sync(self, *args: Any, **kwargs: Any) -> GenerateResult:
        return run_sync(self.generate(*args, **kwargs))

    def evaluate_sync(self, *args: Any, **kwargs: Any) -> GenerateResult:
        return run_sync(self.evaluate(*args, **kwargs))


def _progress_bar(total: int, enabled: bool, desc: str) -> Any:
    if not enabled or total == 0:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="rollout")
