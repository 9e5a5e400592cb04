"""One multi-agent episode trains every trainable seat: the rollouts of one task's seats share it.

A dataset row of a multi-agent env is one task × one trainable seat (``v1_environment``), so that a
group — the baseline GRPO compares a sample against — is task × seat on every backend. Played one
episode per row, each hand would train one seat and throw the other seats' traces away: half the
compute for two seats. Here a rollout of (task, seat) first looks for an episode of the same task,
model and sampling arguments that another seat's rollout started and whose ``seat`` trace nobody has
claimed; it takes that trace, or starts an episode that the other seats may claim in turn. Both seats
of a self-play hand so become samples, each in its own seat's group, from one episode. A seat that
runs several times in one episode (verifiers' ``best-of-n``: one seat, ``n`` attempts) offers each of
its traces to a rollout of that seat: how many an episode holds is learnt from the last finished one
(``slots``, one per seat until then), and a rollout whose slot the episode did not fill plays its own.

Which rollouts meet depends on scheduling, never on correctness: a rollout that finds no partner plays
its own episode, exactly as before. Backends that run a batch's rollouts together meet (the bundled
trainer and Tinker keep a task's seat rows adjacent in their data order, ``Environment.rows_together``;
TRL where its sampler puts them in one batch). verl gives each trajectory a client of its own (a
sticky session on one rollout server), and rollouts of different clients never meet, so there each
plays its own. A finished episode stays claimable for ``CLAIM_WINDOW_S``, for a partner that starts
a little late. The bundled trainer's and Tinker's sampling arguments carry the batch's seed, so a
later batch never takes an earlier batch's trace there; TRL's carry none, so a trace finished less
than that before its next batch starts may go to it, one weight update old: hence a short window.

An episode is shielded from any one waiter: a rollout that times out leaves it to the others, and it is
cancelled only when no rollout waits for it any more.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

CLAIM_WINDOW_S = 5.0  # how long a finished episode's unclaimed seat traces may still be taken

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Match:
    """What rollouts must share to share an episode: the task, the client (its weights), the model
    name and the sampling arguments."""

    task: int
    client: Any
    model: str
    args: dict[str, Any]

    @property
    def key(self) -> str:
        return json.dumps([self.task, id(self.client), self.model, self.args], sort_keys=True, default=str)


@dataclasses.dataclass(eq=False)
class _Episode(Generic[T]):
    task: asyncio.Future[T]
    offered: dict[str, int]  # seat -> how many of its traces rollouts may take (``slots`` at the start)
    match: Match  # holds the client while claimable, so no later client can reuse its id in the key
    taken: dict[str, int] = dataclasses.field(default_factory=dict)  # seat -> its traces taken so far
    waiters: int = 0

    def open_to(self, seat: str) -> bool:
        return self.taken.get(seat, 0) < self.offered.get(seat, 0)

    def fully_taken(self) -> bool:
        return all(self.taken.get(seat, 0) >= count for seat, count in self.offered.items())

    def take(self, seat: str) -> int:
        """Claim the next trace of ``seat``: its index among that seat's traces."""
        index = self.taken.get(seat, 0)
        self.taken[seat] = index + 1
        return index


class SharedEpisodes(Generic[T]):
    """Episodes of one event loop, each trace of each trainable seat taken by at most one rollout."""

    def __init__(self) -> None:
        self._open: dict[str, list[_Episode[T]]] = {}

    async def play(
        self, match: Match, seat: str, slots: dict[str, int], start: Callable[[], Awaitable[T]]
    ) -> tuple[T, int, bool]:
        """The episode this rollout of ``seat`` takes its trace from, the index of that trace among the
        seat's traces, and whether another rollout played the episode. ``slots`` is how many traces each
        trainable seat is expected to leave in one episode."""
        key = match.key
        claimed = self._claim(key, seat)
        if claimed is not None:
            (episode, index), shared = claimed, True
        else:
            (episode, index), shared = self._start(key, match, seat, slots, start), False
        episode.waiters += 1
        try:
            return await asyncio.shield(episode.task), index, shared
        finally:
            episode.waiters -= 1
            if episode.waiters == 0 and not episode.task.done():  # everyone who wanted it gave up
                episode.task.cancel()
                self._close(key, episode)

    def _start(
        self, key: str, match: Match, seat: str, slots: dict[str, int], start: Callable[[], Awaitable[T]]
    ) -> tuple[_Episode[T], int]:
        """A new episode, its first trace of ``seat`` taken; offered to others only if it has more."""
        episode = _Episode(asyncio.ensure_future(start()), dict(slots), match)
        index = episode.take(seat)
        if not episode.fully_taken():
            self._open.setdefault(key, []).append(episode)
            episode.task.add_done_callback(lambda _: self._close_later(key, episode))
        return episode, index

    def _claim(self, key: str, seat: str) -> tuple[_Episode[T], int] | None:
        for episode in self._open.get(key, []):
            if episode.open_to(seat) and not episode.task.cancelled():
                index = episode.take(seat)
                if episode.fully_taken():
                    self._close(key, episode)
                return episode, index
        return None

    def _close_later(self, key: str, episode: _Episode[T]) -> None:
        if not episode.task.cancelled():
            episode.task.exception()  # read here, so a failure no waiter is left to see is not reported
        asyncio.get_running_loop().call_later(CLAIM_WINDOW_S, self._close, key, episode)

    def _close(self, key: str, episode: _Episode[T]) -> None:
        episodes = self._open.get(key, [])
        if episode in episodes:
            episodes.remove(episode)
        if not episodes:
            self._open.pop(key, None)
