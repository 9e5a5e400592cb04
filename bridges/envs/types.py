"""The typed records every layer shares: messages, sampling parameters, engine samples, rollout state.

They live in one small module with no heavy imports so that environments, the client layer,
workflows and every backend adapter agree on one vocabulary without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

Message = dict[str, Any]
"""An OpenAI-style chat message (``role``, ``content``, optional ``tool_calls``/``tool_call_id``)."""
Messages = list[Message]

FinishReason = Literal["stop", "length", "abort"]

MAX_TOP_LOGPROBS = 20
"""OpenAI's limit on ``top_logprobs``; every engine that returns alternatives honours up to this many."""


class StopReason(StrEnum):
    """Why a rollout ended. A custom ``@stop`` condition uses its own name instead of one of these."""

    COMPLETED = "completed"  # the environment decided the episode is over (answered, no tool call, ...)
    MAX_TURNS = "max_turns"
    PROMPT_TOO_LONG = "prompt_too_long"
    TIMEOUT = "timeout"
    ENV_ERROR = "env_error"
    ENGINE_ERROR = "engine_error"
    REWARD_ERROR = "reward_error"


ERROR_STOP_REASONS: frozenset[str] = frozenset(
    {
        StopReason.PROMPT_TOO_LONG.value,
        StopReason.TIMEOUT.value,
        StopReason.ENV_ERROR.value,
        StopReason.ENGINE_ERROR.value,
        StopReason.REWARD_ERROR.value,
    }
)
"""Stop reasons that make a rollout unusable for training: it is kept, but masked."""


def is_errored(error: str | None, stop_reason: str | None) -> bool:
    """A rollout that failed (an error, or a stop reason that means one): kept in its group, masked."""
    return error is not None or stop_reason in ERROR_STOP_REASONS


def is_trainable(error: str | None, stop_reason: str | None, reward: float | None, has_tokens: bool) -> bool:
    """The one definition of a valid rollout, used by every backend: not errored, scored, and carrying the
    sampled token ids (a remote endpoint's rollout has none: it can be evaluated, not trained on)."""
    return not is_errored(error, stop_reason) and reward is not None and has_tokens


@dataclass(slots=True)
class SamplingParams:
    """Engine-level sampling parameters (token level; the client maps OpenAI arguments onto these)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    top_logprobs: int = 0  # alternatives per position to return (0: only the sampled id's logprob)

    def stops_and_seed(self) -> dict[str, Any]:
        """``stop``, ``stop_token_ids`` and ``seed``, only those that are set: the fields vLLM-style
        request formats (vLLM, its OpenAI server, verl's servers) share by name."""
        fields: dict[str, Any] = {}
        if self.stop:
            fields["stop"] = list(self.stop)
        if self.stop_token_ids:
            fields["stop_token_ids"] = list(self.stop_token_ids)
        if self.seed is not None:
            fields["seed"] = self.seed
        return fields


@dataclass(slots=True)
class Sample:
    """One sampled continuation, exactly as the engine produced it.

    ``token_ids`` include the end-of-turn/EOS token when the engine sampled one, because the policy
    must learn to stop; ``logprobs`` has one entry per id, under the temperature-scaled distribution
    the token was drawn from.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    weight_version: int = 0
    stop_str: str | None = None  # the stop string that ended the sample, when one did
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per position, best first, when asked for


@runtime_checkable
class Engine(Protocol):
    """The token-level seam every backend implements: prompt ids in, sampled ids + logprobs out.

    Everything a caller may use is declared here, so no caller probes an engine with ``getattr``.
    """

    @property
    def tokenizer(self) -> Any:
        """A transformers PreTrainedTokenizerBase with the policy's chat template."""
        ...

    @property
    def name(self) -> str:
        """Reported as the response's owner and in trace provenance."""
        ...

    @property
    def weight_version(self) -> int:
        """Increments with every weight update; stamped on each Sample."""
        ...

    @property
    def max_model_len(self) -> int | None:
        """The context window (prompt + completion); None when unknown."""
        ...

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]: ...

    async def aclose(self) -> None:
        """Release what the engine holds (worker tasks, HTTP clients); generate fails afterwards."""
        ...


@runtime_checkable
class TrainableEngine(Engine, Protocol):
    """An engine whose weights the trainer updates in place (the hf and vLLM engines)."""

    async def aupdate_weights(
        self, state_dict: dict[str, Any], policy: Any = None, version: int | None = None
    ) -> Any:
        """Load the trainable tensors (``policy``: the live model, for engines that share its storage);
        ``weight_version`` becomes ``version`` when given (a trainer numbering its pushes), else
        increments."""
        ...


class Turn(BaseModel):
    """One model call inside a rollout, with the tokens that make it trainable.

    ``prompt_ids``/``completion_ids``/``logprobs`` are empty when the client returned no token ids
    (a remote OpenAI endpoint): such a rollout can be evaluated but not trained on.
    """

    model_config = ConfigDict(extra="forbid")

    prompt_ids: list[int] = Field(default_factory=list)
    completion_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    finish_reason: str | None = None
    weight_version: int | None = None
    message: Message = Field(default_factory=dict)  # the assistant message this turn produced


class Timing(BaseModel):
    generation_s: float = 0.0
    scoring_s: float = 0.0
    total_s: float = 0.0


_STATE_FIELDS: frozenset[str] = frozenset()  # filled after the class is defined


class State(BaseModel):
    """Everything one rollout produced.

    Typed fields for what every layer reads; ``extras`` for an environment's own bookkeeping.
    Item access (``state["secret"]``) reaches typed fields and ``extras`` alike, so environments
    written in the verifiers style, which treat state as a dict, keep working.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, validate_assignment=False)

    example_id: int = 0
    task: str = "default"
    prompt: Messages = Field(default_factory=list)
    completion: Messages = Field(default_factory=list)
    answer: str = ""
    info: dict[str, Any] = Field(default_factory=dict)
    row: dict[str, Any] = Field(default_factory=dict)  # extra dataset columns, injectable into reward funcs
    turns: list[Turn] = Field(default_factory=list)
    reward: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    stop_reason: str | None = None
    error: str | None = None
    timing: Timing = Field(default_factory=Timing)
    drift_tokens: int | None = None
    drifted_turns: int | None = None
    extras: dict[str, Any] = Field(default_factory=dict)
    # the state object of the framework an adapter ran this rollout with (a verifiers State): kept for
    # scoring with that framework's rubric, never serialised
    _native: Any = PrivateAttr(default=None)

    @property
    def errored(self) -> bool:
        """True when the rollout failed; it must not be trained on (it stays in its group, masked)."""
        return is_errored(self.error, self.stop_reason)

    @property
    def trainable(self) -> bool:
        """``is_trainable`` for this rollout: what every backend checks before training on it."""
        return is_trainable(
            self.error, self.stop_reason, self.reward, any(t.completion_ids for t in self.turns)
        )

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def messages(self) -> Messages:
        """The whole conversation: prompt followed by completion."""
        return [*self.prompt, *self.completion]

    # dict-style access, for verifiers-style environments and reward functions
    def __getitem__(self, key: str) -> Any:
        if key in _STATE_FIELDS:
            return getattr(self, key)
        try:
            return self.extras[key]
        except KeyError:
            raise KeyError(key) from None

    def __setitem__(self, key: str, value: Any) -> None:
        if key in _STATE_FIELDS:
            setattr(self, key, value)
        else:
            self.extras[key] = value

    def __contains__(self, key: object) -> bool:
        return key in _STATE_FIELDS or key in self.extras

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]


_STATE_FIELDS = frozenset(State.model_fields)
