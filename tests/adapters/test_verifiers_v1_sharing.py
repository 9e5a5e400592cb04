"""The rollouts of one task's seats share episodes (``v1_sharing``), and the data order keeps a task's
seat rows adjacent (``Environment.rows_together``) so that they meet."""

from __future__ import annotations

import asyncio
import random

import pytest

from bridges.adapters.verifiers import v1_sharing
from bridges.adapters.verifiers.v1_sharing import Match, SharedEpisodes
from bridges.workflows.batches import rows_at

SEATS = ["player0", "player1"]
SLOTS = dict.fromkeys(SEATS, 1)  # a self-play hand: one trace per seat


class Episodes:
    """Counts the episodes started; each returns its number after ``delay`` (or raises ``error``)."""

    def __init__(self, delay: float = 0.01, error: Exception | None = None) -> None:
        self.started, self.cancelled, self.delay, self.error = 0, 0, delay, error

    async def __call__(self) -> int:
        self.started += 1
        number = self.started
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.error:
            raise self.error
        return number


async def test_a_group_of_each_seat_plays_one_episode_per_pair():
    pool: SharedEpisodes[int] = SharedEpisodes()
    start, key = Episodes(), Match(0, 1, "m", {"seed": 7})
    results = await asyncio.gather(*(pool.play(key, seat, SLOTS, start) for seat in SEATS for _ in range(3)))
    assert start.started == 3  # 6 rollouts, 3 hands
    mine = {seat: [r for (r, _, _), s in zip(results, [s for s in SEATS for _ in range(3)], strict=True) if s == seat]
            for seat in SEATS}
    assert sorted(mine["player0"]) == sorted(mine["player1"]) == [1, 2, 3]  # each hand trains both seats
    assert sorted(shared for _, _, shared in results) == [False] * 3 + [True] * 3
    assert {index for _, index, _ in results} == {0}  # one trace per seat per hand


async def test_a_seat_that_runs_n_times_in_an_episode_gives_each_trace_to_one_rollout():
    """best-of-n: one seat, three traces an episode; seven rollouts take three, three and one."""
    pool: SharedEpisodes[int] = SharedEpisodes()
    start, key = Episodes(), Match(0, 1, "m", {})
    results = await asyncio.gather(*(pool.play(key, "agent", {"agent": 3}, start) for _ in range(7)))
    assert start.started == 3
    taken = sorted((episode, index) for episode, index, _ in results)
    assert taken == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (3, 0)]  # no trace taken twice
    assert [shared for _, index, shared in results] == [index > 0 for _, index, _ in results]


async def test_different_tasks_clients_or_arguments_never_share():
    pool: SharedEpisodes[int] = SharedEpisodes()
    start = Episodes()
    keys = [Match(0, 1, "m", {"seed": 1}), Match(0, 2, "m", {"seed": 1}),
            Match(1, 1, "m", {"seed": 1}), Match(0, 1, "m", {"seed": 2})]
    seats = ["player0", "player1", "player1", "player1"]
    await asyncio.gather(*(pool.play(k, seat, SLOTS, start) for k, seat in zip(keys, seats, strict=True)))
    assert start.started == 4


async def test_a_finished_episode_is_claimable_for_the_window_then_not(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(v1_sharing, "CLAIM_WINDOW_S", 0.05)
    pool: SharedEpisodes[int] = SharedEpisodes()
    start, key = Episodes(), Match(0, 1, "m", {})
    assert await pool.play(key, "player0", SLOTS, start) == (1, 0, False)
    assert await pool.play(key, "player1", SLOTS, start) == (1, 0, True)  # sequential, inside the window
    assert await pool.play(key, "player0", SLOTS, start) == (2, 0, False)
    await asyncio.sleep(0.1)
    assert await pool.play(key, "player1", SLOTS, start) == (3, 0, False)  # past it: its own episode


async def test_a_waiter_that_gives_up_leaves_the_episode_to_its_partner_and_the_last_cancels_it():
    pool: SharedEpisodes[int] = SharedEpisodes()
    start, key = Episodes(delay=0.2), Match(0, 1, "m", {})
    owner = asyncio.ensure_future(pool.play(key, "player0", SLOTS, start))
    await asyncio.sleep(0)
    partner = asyncio.ensure_future(pool.play(key, "player1", SLOTS, start))
    await asyncio.sleep(0.01)
    owner.cancel()  # its rollout timed out
    assert await partner == (1, 0, True) and start.cancelled == 0
    alone = asyncio.ensure_future(pool.play(key, "player0", SLOTS, start))
    await asyncio.sleep(0.01)
    alone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await alone
    await asyncio.sleep(0)
    assert start.cancelled == 1 and pool._open == {}  # nobody waits for it: stopped, not claimable


async def test_a_failed_episode_fails_every_seat_that_took_it():
    pool: SharedEpisodes[int] = SharedEpisodes()
    start, key = Episodes(error=RuntimeError("run() raised")), Match(0, 1, "m", {})
    results = await asyncio.gather(*(pool.play(key, s, SLOTS, start) for s in SEATS), return_exceptions=True)
    assert start.started == 1 and all(isinstance(r, RuntimeError) for r in results)


def test_the_data_order_moves_a_tasks_seat_rows_whole_and_is_unchanged_for_single_rows():
    dataset = [{"task": t, "seat": s} for t in range(6) for s in SEATS]
    rows = rows_at(dataset, 0, 24, seed=3, together=2)
    assert all(
        rows[i]["task"] == rows[i + 1]["task"] and rows[i]["seat"] != rows[i + 1]["seat"]
        for i in range(0, 24, 2)
    )
    assert (
        sorted(r["task"] for r in rows[:12])
        == sorted(r["task"] for r in rows[12:])
        == sorted(2 * list(range(6)))
    )
    order = list(range(12))
    random.Random(3 * 1_000_003).shuffle(order)  # together=1 is the plain row shuffle it always was
    assert rows_at(dataset, 0, 12, seed=3) == [dataset[i] for i in order]
    assert rows_at(dataset[:11], 0, 11, seed=3, together=2) == rows_at(
        dataset[:11], 0, 11, seed=3
    )  # not a multiple
