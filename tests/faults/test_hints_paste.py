"""Every "set KEY=VALUE" a refusal prints works when pasted into a shell command (issue 41, item 2).

The hints are collected from the source itself (every string literal with "set", "use", "pass", "with"
or "add" before a ``key=value``), so a new refusal is checked without anyone listing it here. Each is
split as a shell splits it and read by the real command-line parser of the command it belongs to; the
value the parser keeps must be the one the hint means. Before, ``env_args.agent.harness.id=null`` was
read as YAML's null and refused again with the same sentence."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridges.jobs.evaluate import EvalConfig
from bridges.runs.config import parse_config
from bridges.runs.train_config import TrainConfig
from bridges.server.run import ServeConfig

ROOT = Path(__file__).resolve().parents[2]
HINT = re.compile(r"\b(?:set|use|pass|with|add)\s+`?([a-z_][\w.+{}-]*=[^\s,;)`'\"]+)")
# hints that name a Python argument, not a command-line setting: what the user passes in code
PYTHON_API = {"dataset=", "eval_dataset=", "max_model_len=", "vllm_enable_sleep_mode=False", "api_key_var=<NAME>"}


def _texts(node: ast.AST) -> list[str]:
    """String literals, an f-string's placeholders written ``{x}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "{x}" for v in node.values)]
    return []


def collected_hints() -> list[str]:
    found = set()
    for folder in ("bridges", "adapters", "workflows", "environments"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                for text in _texts(node):
                    found.update(match.rstrip(".") for match in HINT.findall(text))
    return sorted(found)


def _command(key: str) -> type | None:
    head = key.split(".", 1)[0]
    for schema in (TrainConfig, EvalConfig, ServeConfig):
        if head in schema.__dataclass_fields__:
            return schema
    return None


def _value_at(config: Any, key: str) -> Any:
    value = config
    for part in key.split("."):
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


HINTS = collected_hints()


def test_the_refusals_hints_are_collected():
    assert "env_args.{x}.harness.id=null" in HINTS and "trainer.weight_channel=http" in HINTS
    assert len(HINTS) >= 15, HINTS


@pytest.mark.parametrize("hint", HINTS)
def test_a_hint_pasted_into_a_shell_means_what_it_says(hint: str):
    if hint in PYTHON_API or "<" in hint or hint.split("=", 1)[1].startswith("{"):
        pytest.skip("a Python argument, or a value the sentence fills in (<secret>, the strategy it names)")
    argv = shlex.split(hint.replace("{x}", "agent"))  # as the shell hands it to the command
    key, raw = argv[0].split("=", 1)
    schema = _command(key)
    assert schema is not None, f"'{hint}' names no setting of bridges.train, bridges.eval or bridges.serve"
    config = parse_config(schema, argv)
    kept = _value_at(config, key)
    if key.endswith("harness.id") and raw == "null":  # YAML's null: the adapter reads it as the harness
        from bridges.adapters.verifiers.v1_load import _null_harness_named

        kept = _null_harness_named({"agent": {"harness": {"id": kept}}})["agent"]["harness"]["id"]
        assert kept == "null"
        return
    meant = yaml.safe_load(raw)
    assert kept == meant or str(kept) == raw, (hint, kept)


def test_the_null_harness_hint_works_end_to_end(monkeypatch: pytest.MonkeyPatch):
    """The refusal's own hint, through the parser, loads the environment it refused."""
    pytest.importorskip("verifiers")
    from bridges.envs.registry import load_environment
    from bridges.runtime.errors import ConfigError

    monkeypatch.syspath_prepend(str(ROOT / "tests" / "fixtures"))
    with pytest.raises(ConfigError) as refused:
        load_environment("vf_v1_fixture_taskset", agent={"harness": {"id": "codex"}})  # needs a container
    hint = re.search(r"set (\S+)\.$", str(refused.value)).group(1)  # type: ignore[union-attr]
    config = parse_config(TrainConfig, ["env=vf_v1_fixture_taskset", *shlex.split(hint)])
    env = load_environment(config.env, **config.env_args)
    assert type(env).__name__ == "V1Environment"
