"""From ``env=<id>`` to a verifiers v1 ``Env`` that rl-bridges can run, or one sentence why not.

The id is resolved as verifiers resolves it (``verifiers.v1.tasksets.<m>``, else module ``<m>``; one
exported ``Taskset``, optionally an ``Env`` and a ``Harness``). ``env_args`` is the run's ``EnvConfig``
in verifiers' own shape — ``{taskset: {...}, agent: {harness: {...}, runtime: {...}}, timeout: ...}`` —
validated by the environment's own pydantic models. The environment's defaults stand, except what
this process runs itself: an agent whose harness is verifiers' ``null`` runs in-process (``v1_seat``),
so it needs no runtime. An agent on a program harness that needs no container (``bash``, verifiers'
default) runs its program on verifiers' ``subprocess`` runtime (``v1_programs``); one that needs a
container is refused naming the setting that changes it. The interception is verifiers' single
``server`` shape unless ``env_args.interception`` names another: these harnesses all run on this host,
where one server multiplexes every rollout (verifiers' default pool grows servers to spread remote
tunnels), and a single server's model calls are answered in-process (``v1_relay``).
"""

from __future__ import annotations

import copy
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

from bridges.adapters.verifiers.support import require_verifiers, version_tuple
from bridges.adapters.verifiers.v1_programs import PROGRAM_PROMPT_TOKENS, check_program, runtime_for
from bridges.runtime.asyncutils import run_sync
from bridges.runtime.errors import ConfigError


def load_v1_environment(module: ModuleType, **env_args: Any) -> Any:
    """A ``V1Environment`` for the taskset ``module`` exports, with ``env_args`` as its ``EnvConfig``."""
    taskset_id = module.__name__.rsplit(".", 1)[-1]
    vf = require_verifiers()
    if version_tuple(str(vf.__version__)) < (0, 3):
        raise ConfigError(
            f"'{taskset_id}' is a verifiers v1 taskset, and verifiers {vf.__version__} has no v1 API: "
            "pip install 'verifiers>=0.3,<0.5'."
        )
    from bridges.adapters.verifiers.v1_environment import V1Environment
    from bridges.adapters.verifiers.v1_seat import register

    register()
    make_visible(module)
    data = _null_harness_named(copy.deepcopy(env_args))
    data["taskset"] = {**dict(data.get("taskset") or {}), "id": taskset_id}
    data.setdefault("interception", {"type": "server"})  # one server, its upstream in-process (v1_relay)
    config = _resolve(taskset_id, data)
    programs = [_seat(taskset_id, name, spec, data) for name, spec in _agents(config).items()]
    config = _resolve(taskset_id, data)
    env = _construct(taskset_id, config)
    _refuse_unsupported(taskset_id, env)
    seats = _trainable_seats(env, config)
    if not seats:
        raise ConfigError(
            f"the verifiers v1 environment '{taskset_id}' stands every agent down in setup() "
            "(trainable = False): none of its traces would train."
        )
    v1_env = V1Environment(env, seats=seats, taskset_id=taskset_id, env_args=env_args)
    v1_env.prompt_overhead_tokens = PROGRAM_PROMPT_TOKENS if any(programs) else 0
    return v1_env


def _null_harness_named(data: dict[str, Any]) -> dict[str, Any]:
    """``<seat>.harness.id`` given as null means verifiers' ``null`` harness. The command line reads
    ``env_args.agent.harness.id=null`` (the refusal's own hint) as YAML's null; verifiers' CLI reads
    the same word as the harness's name, so a user typing it means the harness, and gets it."""
    for seat in data.values():
        harness = seat.get("harness") if isinstance(seat, dict) else None
        if isinstance(harness, dict) and "id" in harness and harness["id"] is None:
            harness["id"] = "null"
    return data


def make_visible(module: ModuleType) -> str:
    """The id verifiers knows ``module`` by. verifiers imports a taskset by its last name only: one
    inside a package (a bundled one) is made visible where verifiers looks, as its own tasksets are."""
    taskset_id = module.__name__.rsplit(".", 1)[-1]
    if module.__name__ != taskset_id:
        for kind in ("tasksets", "harnesses", "envs"):  # it may export its own harness and Env too
            sys.modules.setdefault(f"verifiers.v1.{kind}.{taskset_id}", module)
    return taskset_id


def _resolve(taskset_id: str, data: dict[str, Any]) -> Any:
    from pydantic import ValidationError
    from verifiers.v1.utils.loaders import resolve_env_config

    try:
        return resolve_env_config(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "env_args"
        raise ConfigError(
            f"env_args.{where} of the verifiers v1 taskset '{taskset_id}': {first['msg']}."
        ) from None
    except (ImportError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"the verifiers v1 taskset '{taskset_id}' did not load: {_sentence(exc)}") from None


def _agents(config: Any) -> dict[str, Any]:
    """The env's agent seats: its ``AgentConfig`` fields, by name (how verifiers declares roles)."""
    from verifiers.v1.configs.agent import AgentConfig

    return {
        name: value
        for name in type(config).model_fields
        if isinstance(value := getattr(config, name), AgentConfig)
    }


def _seat(taskset_id: str, name: str, spec: Any, data: dict[str, Any]) -> bool:
    """Point an agent on the null harness at the in-process seat, one on a program harness that needs
    no container at the subprocess runtime (True: a program runs it); refuse any other harness."""
    from verifiers.v1.configs.env import default_agent_harness
    from verifiers.v1.harnesses.null import NullHarness
    from verifiers.v1.utils.loaders import harness_class

    from bridges.adapters.verifiers.v1_seat import SEAT_ID

    harness = spec.harness if spec.harness is not None else default_agent_harness(taskset_id)
    harness_id = harness.id
    program = None if harness_id == SEAT_ID else harness_class(harness_id)
    if program is None or program is NullHarness:
        seat = dict(data.get(name) or {})
        seat["harness"] = {"id": SEAT_ID}
        seat["runtime"] = {"type": "subprocess"}  # the seat runs nothing in it: no sandbox is provisioned
        data[name] = seat
        return False
    if not program.NEEDS_CONTAINER:  # a program on verifiers' subprocess runtime
        data[name] = runtime_for(dict(data.get(name) or {}))
        if data[name]["runtime"].get("type") == "subprocess":
            check_program(taskset_id, name, program, harness)
        return True
    raise ConfigError(
        f"agent '{name}' of the verifiers v1 taskset '{taskset_id}' runs on the '{harness_id}' harness, a "
        f"program that needs a container runtime, which this run does not provide; run it on verifiers' "
        f"null (chat) harness: set env_args.{name}.harness.id=null."
    )


def _construct(taskset_id: str, config: Any) -> Any:
    from verifiers.v1.utils.loaders import load_environment

    try:
        return load_environment(config)
    except Exception as exc:  # the taskset's own code, run at load
        raise ConfigError(f"the verifiers v1 taskset '{taskset_id}' did not load: {_sentence(exc)}") from None


def _trainable_seats(env: Any, config: Any) -> list[str]:
    """The agents whose traces train, in declaration order: every declared agent, less those the env's
    ``setup()`` stands down (``agents.user.trainable = False`` is verifiers' one way to say a seat is
    not the policy: a modeled user, a judge). ``setup()`` is asked once here with stand-in agents, so
    no rollout is spent on a seat that never trains; where it needs more than the stand-ins give, every
    seat is kept and an episode that stands one down masks that rollout with the reason."""
    import verifiers.v1 as vf

    declared = list(_agents(config))
    agents = vf.Agents(config, lambda name, _spec: SimpleNamespace(name=name, trainable=True))
    try:
        run_sync(env.setup(agents))
    except Exception:  # the env's own hook, asked outside an episode: its episodes will say
        return declared
    return [name for name in declared if getattr(agents, name).trainable]


def _refuse_unsupported(taskset_id: str, env: Any) -> None:
    """Tool servers run where verifiers starts them; one that needs a sandbox or a container the run
    does not provide is refused before any rollout (the default, ``subprocess``, runs here)."""
    from verifiers.v1.runtimes import runtime_is_local

    task_type = type(env.taskset).task_type()
    servers = [*env.taskset.toolsets(env.taskset.config), *task_type.toolsets(env.taskset.config.task)]
    for server in servers:
        runtime = server.config.runtime
        if not runtime_is_local(runtime):
            raise ConfigError(
                f"the toolset '{server.server_name}' of the verifiers v1 taskset '{taskset_id}' runs in a "
                f"'{runtime.type}' runtime this run does not provide; give it runtime.type=subprocess."
            )


def _sentence(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"
