"""LLM-as-judge scoring through any ``openai.AsyncOpenAI`` client.

The judge is the one reward input that lives on somebody else's server, so it gets the full error
policy: a concurrency limit shared by the whole rubric, a timeout per call, retries with backoff for
transient failures, and a ``JudgeError`` for an outage or an unreadable verdict. The error marks the
rollout errored; verifiers turned it into reward 0, which trains the policy on the judge's outage.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Any

from bridges.envs.messages import to_message_dicts
from bridges.envs.parsers import Parser
from bridges.envs.rubric import Rubric
from bridges.envs.types import State
from bridges.runtime.asyncutils import LoopSemaphore, backoff_delay, describe_exception
from bridges.runtime.errors import JudgeError

DEFAULT_JUDGE_PROMPT = """Given a ground-truth answer and a response, decide whether the response is correct.

Question:
```
{question}
```

Ground-truth answer:
```
{answer}
```

Response:
```
{response}
```

Reply with "yes" if the response matches the ground-truth answer, or "no" if it does not. Reply with one word."""

_VERDICT_RE = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)


def _transient_errors() -> tuple[type[BaseException], ...]:
    import openai

    return (
        openai.APIConnectionError,  # includes APITimeoutError
        openai.RateLimitError,
        openai.InternalServerError,
        asyncio.TimeoutError,
    )


async def judge_reward(
    judge: Callable[..., Any], prompt: Any, completion: Any, answer: str, state: State
) -> float:
    """1.0 for a "yes" verdict, 0.0 for "no"; anything else raises ``JudgeError`` (never a silent 0)."""
    verdict = await judge(prompt, completion, answer, state)
    match = _VERDICT_RE.match(verdict or "")
    if match is None:
        raise JudgeError(f"the judge answered {verdict!r:.120}, which is neither yes nor no.")
    return 1.0 if match.group(1).lower() == "yes" else 0.0


class JudgeRubric(Rubric):
    """A rubric whose reward functions can ask for ``judge`` (an async callable returning the verdict text).

    Without ``funcs`` it scores with ``judge_reward``, until the first reward function is added with
    ``add_reward_func`` (verifiers-style code builds the rubric empty and adds its own).
    """

    def __init__(
        self,
        funcs: Sequence[Callable[..., Any]] | None = None,
        weights: Sequence[float] | None = None,
        parser: Parser | None = None,
        *,
        judge_client: Any = None,
        judge_model: str = "gpt-4.1-nano",
        judge_prompt: str = DEFAULT_JUDGE_PROMPT,
        judge_sampling_args: dict[str, Any] | None = None,
        max_concurrent: int = 32,
        timeout: float = 60.0,
        max_retries: int = 2,
        retry_base_delay: float = 0.5,
        retry_max_delay: float = 8.0,
        reward_timeout: float | None = None,
    ) -> None:
        worst_case = timeout * (max_retries + 1) + sum(
            backoff_delay(a, retry_base_delay, retry_max_delay) for a in range(max_retries)
        )
        super().__init__(funcs, weights, parser, timeout=reward_timeout or max(60.0, worst_case + 5.0))
        self.judge_client = judge_client
        self.judge_model = judge_model
        self.judge_prompt = judge_prompt
        self.judge_sampling_args = dict(judge_sampling_args or {})
        self.judge_timeout = timeout
        self.max_retries = max_retries
        self.retry_base_delay = retry_base_delay
        self.retry_max_delay = retry_max_delay
        self._judge_sem = LoopSemaphore(max_concurrent)
        self._default_only = funcs is None
        if self._default_only:
            super().add_reward_func(judge_reward, 1.0)
        for name in ("judge_client", "judge_model", "judge_prompt", "judge_sampling_args"):
            self.class_objects[name] = getattr(self, name)
        self.class_objects["judge"] = self.judge

    def add_reward_func(self, func: Callable[..., Any], weight: float | None = None) -> None:
        if self._default_only:
            self._default_only = False
            self.funcs.clear()
            self.weights.clear()
        super().add_reward_func(func, weight)

    def _client(self) -> Any:
        if self.judge_client is None:
            import openai

            self.judge_client = openai.AsyncOpenAI()
            self.class_objects["judge_client"] = self.judge_client
        return self.judge_client

    def render(self, prompt: Any, completion: Any, answer: str) -> str:
        """The judge's prompt: the last user message, the reference answer and the parsed response."""
        if isinstance(prompt, str):
            question = prompt
        else:
            users = [m for m in to_message_dicts(prompt) if m["role"] == "user"]
            question = (users[-1]["content"] or "") if users else ""
        response = self.parser.parse_answer(completion)
        return self.judge_prompt.format(
            question=question, answer=answer, response="" if response is None else response
        )

    async def judge(self, prompt: Any, completion: Any, answer: str, state: State | None = None) -> str:
        """Ask the judge; the verdict is cached in ``state["judge_response"]`` keyed by the judge prompt."""
        text = self.render(prompt, completion, answer)
        cache: dict[str, str] | None = None
        if state is not None:
            cache = state.setdefault("judge_response", {})
            if text in cache:
                return cache[text]
        verdict = await self._ask(text, state)
        if cache is not None:
            cache[text] = verdict
        return verdict

    async def _ask(self, text: str, state: State | None) -> str:
        transient = _transient_errors()
        client = self._client()
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            if state is not None:
                state["judge_attempts"] = state.get("judge_attempts", 0) + 1
            try:
                async with self._judge_sem:
                    response = await asyncio.wait_for(
                        client.chat.completions.create(
                            model=self.judge_model,
                            messages=[{"role": "user", "content": text}],
                            **self.judge_sampling_args,
                        ),
                        self.judge_timeout,
                    )
            except transient as exc:
                if attempt + 1 >= attempts:
                    what = (
                        f"TimeoutError: no answer within {self.judge_timeout} s"
                        if isinstance(exc, asyncio.TimeoutError)
                        else describe_exception(exc)
                    )
                    raise JudgeError(f"the judge failed after {attempts} attempts ({what}).") from exc
                await asyncio.sleep(backoff_delay(attempt, self.retry_base_delay, self.retry_max_delay))
                continue
            except Exception as exc:
                raise JudgeError(f"the judge call failed ({describe_exception(exc)}).") from exc
            if not response.choices:
                raise JudgeError("the judge returned no choices.")
            return response.choices[0].message.content or ""
        raise AssertionError("unreachable")  # pragma: no cover
