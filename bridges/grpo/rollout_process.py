"""Rollouts in a separate process, so generation really overlaps training on a CPU.

In one process, generation of step k+1 and training on step k take turns on the GIL: a small model
is Python-bound, and the two threads mostly wait for each other. ``ProcessRollouts`` moves the
whole rollout side (environment, ``EngineClient``, ``HFEngine``) into a spawned child process with
its own interpreter; the trainer keeps the policy and the optimizer.

Weights travel through shared memory: at start the child copies the policy's full state from
shared tensors; after each optimizer step the trainer copies the trainable tensors into the shared
ones (under a lock) and sends a "weights" message, which the child applies between batches, so a
batch never sees half-updated weights. Requests are answered in order; the child runs one batch
at a time. The child's failures come back as one sentence and end the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from typing import Any

import torch

from bridges.runtime.errors import EngineError


def _worker_main(conn: Any, config: Any, where: Any, shared: dict[str, torch.Tensor], lock: Any) -> None:
    """The child: build the environment and the engine, then answer requests until told to stop."""
    try:
        torch.set_num_threads(1)
        from bridges.adapters.hf import HFEngine
        from bridges.client import EngineClient
        from bridges.envs.registry import load_environment
        from bridges.grpo.policy import load_policy
        from bridges.workflows.rollouts import run_groups

        t = config.trainer
        env = load_environment(config.env, **config.env_args)
        env.max_concurrent = t.max_concurrent
        model, tokenizer = load_policy(config, where, for_sampling=True)
        with lock:
            model.load_state_dict(shared, strict=False)
        engine = HFEngine(model, tokenizer, device=where.device, max_batch_size=max(64, t.group_size))
        client = EngineClient(engine, model_name=config.model)
        trainable = list(shared)  # the parent shares exactly the trained tensors
        params = dict(model.named_parameters())
        loop = asyncio.new_event_loop()
        conn.send(("ready", engine.name))
    except BaseException as exc:  # reported to the trainer, which ends the run with it
        conn.send(("error", f"the rollout process could not start: {type(exc).__name__}: {exc}"))
        return
    while True:
        message = conn.recv()
        kind = message[0]
        if kind == "stop":
            break
        try:
            if kind == "weights":
                with lock, torch.no_grad():
                    for name in trainable:
                        if name in shared and name in params:
                            params[name].copy_(shared[name])
                engine.mark_weights_updated()
                continue
            _, rows, args = message
            groups = loop.run_until_complete(
                run_groups(env, rows, client, t.group_size, args, model=config.model, advantage=t.loss)
            )
            conn.send(("groups", groups))
        except BaseException as exc:
            conn.send(("error", f"the rollout process failed: {type(exc).__name__}: {exc}"))
    loop.close()


class ProcessRollouts:
    """``start(rows, args)`` returns a future of that batch's groups, generated in the child process."""

    name = "hf (rollout process)"

    def __init__(self, config: Any, where: Any) -> None:
        import torch.multiprocessing as mp

        from bridges.grpo.policy import load_policy, trainable_names

        context = mp.get_context("spawn")
        # the trained tensors live in shared memory; the child loads the rest from the checkpoint itself
        policy, _ = load_policy(config, where)
        self._shared = {
            name: p.detach().to("cpu").clone().share_memory_() for name, p in policy.named_parameters()
            if name in trainable_names(policy)
        }
        del policy
        self._lock = context.Lock()
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_worker_main, args=(child, config, where, self._shared, self._lock), daemon=True
        )
        self._process.start()
        child.close()
        self.weight_version = 0
        self._waiting: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = deque()
        self._waiting_lock = threading.Lock()
        ready = self._conn.recv()
        if ready[0] != "ready":
            self._process.join(timeout=10)
            raise EngineError(ready[1])
        self._reader = threading.Thread(target=self._read, name="bridges-rollout-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        """Resolve the oldest waiting future with each answer (the child answers in order)."""
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                message = ("error", "the rollout process exited unexpectedly.")
            with self._waiting_lock:
                if not self._waiting:
                    return
                loop, future = self._waiting.popleft()
            loop.call_soon_threadsafe(_resolve, future, message)
            if message[0] == "error" and not self._process.is_alive():
                return

    def start(self, rows: list[dict[str, Any]], args: dict[str, Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._waiting_lock:
            self._waiting.append((loop, future))
        self._conn.send(("generate", rows, args))
        return future

    async def update_weights(self, state: dict[str, torch.Tensor], policy: torch.nn.Module) -> None:
        """Copy the trained tensors into shared memory; the child applies them before its next batch."""
        with self._lock, torch.no_grad():
            for name, tensor in state.items():
                self._shared[name].copy_(tensor)
        self._conn.send(("weights",))
        self.weight_version += 1

    async def offload(self) -> bool:
        """Nothing to free: this engine's memory is not the trainer's."""
        return False

    async def aclose(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self._conn.send(("stop",))
        await asyncio.to_thread(self._process.join, 30)
        if self._process.is_alive():
            self._process.kill()


def _resolve(future: asyncio.Future[Any], message: tuple[Any, ...]) -> None:
    if future.done():
        return
    if message[0] == "groups":
        future.set_result(message[1])
    else:
        future.set_exception(EngineError(message[1]))
