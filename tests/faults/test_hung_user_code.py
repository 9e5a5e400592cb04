"""User code that never returns costs its rollout, never the run: bounded, masked, and the process exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bridges.runtime.usercode import DaemonPool, UserCodeTimeout, call_user

REPO = Path(__file__).resolve().parents[2]


def test_bridges_eval_masks_hung_hooks_and_rewards_writes_everything_and_exits(tmp_path: Path):
    output = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(Path(__file__).parent / "envs")])}
    command = [
        sys.executable, "-m", "bridges.eval", "env=bridges_fault_env",
        "env_args.cases=[ok,env_hangs,stop_hangs,reward_hangs]", "env_args.hook_timeout=1.0",
        "env_args.reward_timeout=1.0", "rollouts_per_example=2", "split=train", "progress=false", f"output={output}",
    ]
    started = time.monotonic()
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    elapsed = time.monotonic() - started
    # everything is written, then the reward that timed out is the one sentence the run ends with (exit 2)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: reward function 'lowercase_share' raised TimeoutError"), done.stderr
    records = [json.loads(x) for x in (output / "results.jsonl").read_text().splitlines()]
    by_case = {}
    for record in records:
        case = record["prompt"][-1]["content"].split("]")[0].removeprefix("[")
        by_case.setdefault(case, []).append(record)
    assert sorted(by_case) == ["env_hangs", "ok", "reward_hangs", "stop_hangs"]
    assert all(len(v) == 2 for v in by_case.values())
    assert all(r["error"] is None and r["reward"] is not None for r in by_case["ok"])
    expected = {
        "env_hangs": (
            "env_error",
            "env_response raised UserCodeTimeout: env_response did not finish within 1.0 s.",
        ),
        "stop_hangs": ("env_error", "stop condition 'stuck' raised UserCodeTimeout"),
        "reward_hangs": ("reward_error", "reward function 'lowercase_share' raised TimeoutError"),
    }
    for case, (reason, error) in expected.items():
        for record in by_case[case]:
            assert record["stop_reason"] == reason and error in record["error"], record["error"]
    assert (output / "dataset").is_dir()
    metadata = json.loads((output / "metadata.json").read_text())
    assert metadata["summary"]["num_errored"] == 6 and "finished" in metadata
    # stuck threads were abandoned, not joined: the process ended soon after its last timeout
    assert elapsed < 90, elapsed


def test_a_process_with_a_hung_sync_tool_still_exits(tmp_path: Path):
    script = textwrap.dedent(
        """
        import asyncio, time
        import bridges as br

        def hang(x: int) -> int:
            '''Never returns.'''
            while True:
                time.sleep(0.05)

        env = br.ToolEnv(tools=[hang], tool_timeout=0.3)
        state = env.init_state({"question": "q"})
        print(asyncio.run(env.call_tool("hang", '{"x": 1}', state)), flush=True)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Error: the tool 'hang' did not finish within 0.3 s."
    assert time.monotonic() - started < 30


async def test_an_abandoned_thread_is_replaced_so_hung_calls_never_starve_the_rest():
    pool = DaemonPool(1, "test-pool")
    release = threading.Event()

    def stuck() -> str:
        release.wait(30)
        return "late"

    with pytest.raises(UserCodeTimeout, match="stuck did not finish within 0.1 s"):
        await call_user(stuck, timeout=0.1, what="stuck", pool=pool)
    # the only thread is stuck; the next call still runs, on a replacement thread
    assert await call_user(lambda: "next", timeout=5, what="next", pool=pool) == "next"
    assert pool.threads_abandoned == 1
    release.set()
    for _ in range(100):
        if pool.threads_abandoned == 0:
            break
        time.sleep(0.01)
    assert pool.threads_abandoned == 0  # the stuck thread left the pool when its call returned


async def test_async_hooks_are_bounded_and_a_timeout_counts_from_when_a_thread_picks_the_call_up():
    import asyncio

    async def never() -> None:
        await asyncio.Event().wait()

    with pytest.raises(UserCodeTimeout, match="never did not finish within 0.05 s"):
        await call_user(never, timeout=0.05, what="never")
    pool = DaemonPool(1, "queue-pool")
    results = await asyncio.gather(
        *(call_user(time.sleep, 0.1, timeout=0.3, what=f"call {i}", pool=pool) for i in range(5))
    )  # 0.5 s of queueing in total, yet none times out
    assert results == [None] * 5


async def test_sync_env_hooks_run_on_the_loop_and_the_watchdog_interrupts_them():
    from datasets import Dataset

    import bridges as br

    class Stubborn(br.MultiTurnEnv):
        def env_response(self, messages, state):  # sync, on the loop thread
            n = 0
            while state.info.get("case") == "busy":  # pure Python busy loop
                n += 1
            while state.info.get("case") == "swallows":
                try:  # noqa: SIM105 - a user's swallow-everything loop, written the usual way
                    time.sleep(0.01)
                except Exception:  # cannot swallow the interruption: it is a BaseException
                    pass
            return [{"role": "user", "content": "again"}]

    class Echo:
        class chat:  # noqa: N801 - the shape of client.chat.completions
            class completions:  # noqa: N801
                @staticmethod
                async def create(**kwargs):
                    return {
                        "choices": [
                            {"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}
                        ]
                    }

    rows = [{"question": "q", "info": {"case": case}} for case in ("busy", "swallows", "ok")]
    env = Stubborn(dataset=Dataset.from_list(rows), max_turns=2, hook_timeout=0.3)
    started = time.monotonic()
    result = await env.generate(rows, Echo(), "m", progress=False)
    assert time.monotonic() - started < 5
    busy, swallows, ok = result.states
    for state in (busy, swallows):
        assert state.stop_reason == "env_error"
        assert state.error == "env_response raised UserCodeTimeout: env_response did not finish within 0.3 s."
    assert ok.error is None and ok.stop_reason == "max_turns" and len(ok.turns) == 2
    time.sleep(0.3)  # nothing fires after the hooks let go: the loop goes on undisturbed
    assert await call_user(lambda: "fine", timeout=1.0, what="after", inline=True) == "fine"


async def test_the_watchdog_fires_once_per_call_and_leaves_nothing_pending():
    from bridges.runtime.usercode import HookInterrupted

    caught = []

    def swallows_everything() -> str:
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:
            try:
                time.sleep(0.01)
            except HookInterrupted:  # a bare-except style hook: it swallows the one interruption
                caught.append(1)
        return "done"

    assert await call_user(swallows_everything, timeout=0.1, what="swallower", inline=True) == "done"
    assert caught == [1]  # fired once, never again into the same call
    time.sleep(0.3)  # and nothing left pending: plain code after it runs undisturbed
    assert sum(range(100_000)) == 4_999_950_000
