"""``ServerRollouts``: the GRPO trainer's rollouts on ``bridges.serve`` servers (``trainer.inference=server``).

The third implementation of ``Rollouts`` (beside in-process and the rollout child process), so the
trainer's loop does not change. What it adds:
- Placement: a group's rollouts all go to one server (its prompt prefix stays in that server's
  cache), groups spread round-robin over the servers that are in (``server_pool``).
- Weights: after each optimizer step the main process pushes the policy to every server in, with the
  trainer's version; every process then waits for the others (``barrier``), so no batch starts
  before the servers hold the version it is counted under.
- Staleness, by version: a batch records the trainer's version when it starts; a rollout with a turn
  sampled under an older one (a server that missed a push) is masked with that reason. With the
  pipeline of ``num_batches_ahead`` batches this keeps every trained sample within
  ``num_batches_ahead`` versions of the step that trains on it.
- Faults: a group whose server stopped answering is run again on another server that is in; the
  server is out until it answers and matches again (``ServerPool.refresh`` before each batch, which
  brings it to the current weights). With no server in for ``server_timeout`` seconds the run stops
  with one sentence rather than masking every rollout and learning nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import torch

from bridges.envs.base import group_sampling_args
from bridges.envs.types import State, StopReason
from bridges.grpo.server_pool import Server, ServerPool
from bridges.models.hardware import bound
from bridges.runtime.errors import EngineError
from bridges.runtime.gc_policy import relaxed_gc
from bridges.workflows.advantages import AdvantageMethod, build_group
from bridges.workflows.types import Group


class ServerRollouts:
    name = "server"

    def __init__(
        self, pool: ServerPool, env: Any, group_size: int, advantage: AdvantageMethod, *,
        gather_all: Callable[[torch.nn.Module], dict[str, torch.Tensor]], barrier: Callable[[], None],
        wait_s: float, on_close: Callable[[], None] | None = None, device: torch.device | None = None,
    ) -> None:
        self.pool, self.env, self.group_size, self.advantage = pool, env, group_size, advantage
        self.device = device  # the policy's: the gathers and barriers run in threads bound to it
        self._gather_all, self._barrier, self._wait_s, self._on_close = gather_all, barrier, wait_s, on_close
        self._turn = itertools.count()  # rotates which server a batch's first group goes to
        self._pushed = False  # this process's first push carries the whole model

    @property
    def weight_version(self) -> int:
        return self.pool.version

    def start(self, rows: list[dict[str, Any]], args: dict[str, Any]) -> asyncio.Future[list[Group]]:
        return asyncio.ensure_future(self._batch(rows, args, floor=self.pool.version))

    async def _batch(self, rows: list[dict[str, Any]], args: dict[str, Any], floor: int) -> list[Group]:
        await self._wait_for_a_server()
        first = next(self._turn) * len(rows)
        with relaxed_gc(rollouts=min(len(rows) * self.group_size, self.env.max_concurrent)):
            return list(await asyncio.gather(*(
                self._group(first + j, row, group_sampling_args(args, row.get("example_id", j), self.group_size), floor)
                for j, row in enumerate(rows)
            )))

    async def _wait_for_a_server(self) -> None:
        deadline = time.monotonic() + self._wait_s
        await self.pool.refresh()
        while not self.pool.in_servers():
            if time.monotonic() > deadline:
                raise EngineError(
                    f"no inference server answered for {self._wait_s:.0f} s (server_timeout): {self.pool.reasons()}"
                )
            await asyncio.sleep(1.0)
            await self.pool.refresh()

    async def _group(self, index: int, row: dict[str, Any], args: dict[str, Any] | None, floor: int) -> Group:
        """One group on one server; again on another when its server stopped answering."""
        tried: set[int] = set()
        while True:
            candidates = [s for s in self.pool.in_servers() if id(s) not in tried]
            if not candidates:
                states = [self._unserved(row) for _ in range(self.group_size)]
                break
            server = candidates[index % len(candidates)]
            states = list(await self.env.run_group(row, server.client, server.model, self.group_size, args))
            if not await self._lost(server, states):
                break
            tried.add(id(server))
        for state in states:
            _mask_if_stale(state, floor)
        return build_group(states, method=self.advantage)

    async def _lost(self, server: Server, states: list[State]) -> bool:
        """Did ``server`` stop answering during this group? Then it is out, and the group runs elsewhere."""
        if not any(s.stop_reason == StopReason.ENGINE_ERROR.value for s in states):
            return False
        if await self.pool.probe(server) is None:  # it answers: the failure was the call's own
            return False
        self.pool.mark_out(server, "it stopped answering during a rollout")
        return True

    def _unserved(self, row: dict[str, Any]) -> State:
        state = self.env.init_state(row)
        state.stop_reason = StopReason.ENGINE_ERROR.value
        state.error = f"every inference server went out during this group: {self.pool.reasons()}"
        return state

    async def update_weights(self, state: dict[str, torch.Tensor], policy: torch.nn.Module) -> None:
        """The next version to the servers (the first push carries the whole model), then every process
        waits for the push to land."""
        version, whole = self.pool.version + 1, not self._pushed
        self._pushed = True
        if whole:  # every process gathers (a collective under fsdp); only the main one sends
            state = await asyncio.to_thread(bound(self.device, self._gather_all), policy)
        if self.pool.pusher:
            await self.pool.push(state, version, whole)
        await asyncio.to_thread(bound(self.device, self._barrier))  # [distributed] the others see the servers updated
        if not self.pool.pusher:
            await self.pool.follow(version)

    async def offload(self) -> bool:
        """Nothing to free: this engine's memory is not the trainer's."""
        return False

    async def aclose(self) -> None:
        for server in self.pool.servers:
            await server.client.close()
        if self.pool.channel is not None:
            self.pool.channel.close()
        if self._on_close is not None:
            self._on_close()


def _mask_if_stale(state: State, floor: int) -> None:
    versions = [t.weight_version for t in state.turns if t.weight_version is not None]
    if versions and min(versions) < floor and not state.errored:
        state.stop_reason = StopReason.ENGINE_ERROR.value
        state.error = (
            f"a turn was sampled under weight version {min(versions)}, older than the {floor} its batch began "
            "with (its server missed a push): staler than trainer.num_batches_ahead allows."
        )


async def open_server_rollouts(config: Any, env: Any, tokenizer: Any, policy: torch.nn.Module, world: Any,
                               run_dir: Any, start_step: int = 0) -> ServerRollouts:
    """The servers (``trainer.server_urls``, or ``trainer.servers`` started here by the main process),
    checked against the trainer's model and vocabulary. Pushes are numbered by (this trainer's run id,
    step): a resumed run goes on from ``start_step`` under a new id, so servers still holding the
    earlier process's versions take its pushes, and are not trusted until they have."""
    import functools
    import uuid

    from bridges.grpo.local_servers import LocalServers, server_devices
    from bridges.grpo.parallel import barrier, full_state_dict, share
    from bridges.grpo.push_channels import open_channel
    from bridges.grpo.server_pool import Identity
    from bridges.models.tiny import resolve_model_path
    from bridges.models.weight_payload import lora_scalings, model_layout, tokenizer_fingerprint
    from bridges.workflows.advantages import advantage_method

    t, local = config.trainer, None
    urls, keys = list(t.server_urls), {}
    device = next(policy.parameters()).device  # [distributed] every worker thread below runs on it
    try:
        if t.servers:
            if world.is_main:
                local = LocalServers(
                    config.model, server_devices(t.servers, t.server_devices), run_dir / "servers"
                )
                await local.wait_ready()
            found = [local.urls, local.api_key, local.weights_key] if local is not None else None
            urls, api_key, weights_key = await asyncio.to_thread(bound(device, share), found, world)  # [distributed]
            keys = {"api_key": api_key, "weights_key": weights_key}
        identity = Identity(model_layout(resolve_model_path(config.model)), tokenizer_fingerprint(tokenizer))
        pool = ServerPool.connect(urls, identity, world.is_main, t.server_timeout, **keys)
        run_id = uuid.uuid4().hex[:16] if world.is_main else None
        pool.run = await asyncio.to_thread(bound(device, share), run_id, world)  # [distributed] one id for all
        pool.scalings, pool.version = lora_scalings(policy), start_step
        await pool.check_all()
        if world.is_main:  # [distributed] only the main process pushes
            offered = [server.channels for server in pool.servers]
            pool.channel = open_channel(t.weight_channel, offered, device, pool.weights_key)
            print(f"weights reach the {len(urls)} inference servers over {pool.channel.name}", flush=True)
    except BaseException:
        if local is not None:
            local.close()
        raise
    return ServerRollouts(pool, env, t.group_size, advantage_method(t.loss), gather_all=full_state_dict,
                          barrier=functools.partial(barrier, world), wait_s=t.server_timeout, device=device,
                          on_close=local.close if local is not None else None)


def check_server_settings(t: Any) -> None:
    """``trainer.inference`` and the server keys agree with each other and with the rest, or one sentence."""
    from urllib.parse import urlsplit

    from bridges.grpo.local_servers import server_devices
    from bridges.runtime.errors import ConfigError

    if t.inference != "server":
        if t.server_urls or t.servers:
            raise ConfigError(
                "trainer.server_urls and trainer.servers are read only with trainer.inference=server."
            )
        return
    if bool(t.server_urls) == bool(t.servers):
        raise ConfigError("trainer.inference=server needs exactly one of trainer.server_urls=[http://host:port,...] "
                          "(servers you started with weights_key) and trainer.servers=K (started here).")
    if t.rollout_process:
        raise ConfigError("trainer.rollout_process=true and trainer.inference=server do not combine: the servers "
                          "already generate outside the trainer; drop trainer.rollout_process.")
    for url in t.server_urls:
        parts = urlsplit(str(url))
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/"):
            raise ConfigError(
                f"trainer.server_urls: {str(url)[:120]!r} is not http(s)://host:port (no path)."
            )
    server_devices(t.servers, t.server_devices)
