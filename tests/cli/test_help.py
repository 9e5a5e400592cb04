"""Every CLI answers --help / -h / help=<section> with every key, its type, default and description,
generated from its config dataclass (so the text cannot drift from what the parser accepts)."""

from __future__ import annotations

import dataclasses
import importlib
import typing

import pytest

from bridges.runs.config import run_cli

# command -> where its options are declared (the commands are thin: parsing and one call)
CLIS = {
    "bridges.train": "bridges.runs.train_config:TrainConfig", "bridges.eval": "bridges.jobs.evaluate:EvalConfig",
    "bridges.serve": "bridges.server.run:ServeConfig", "bridges.compare": "bridges.jobs.compare:CompareConfig",
    "bridges.rescore": "bridges.jobs.rescore:RescoreConfig", "bridges.check": "bridges.jobs.check:CheckConfig",
    "bridges.adapters.tinker.server": "bridges.adapters.tinker.server:TinkerServerConfig",
    "bridges.export": "bridges.jobs.export:ExportConfig", "bridges.sft": "bridges.jobs.sft:SFTRunConfig",
}


def keys_of(schema: type, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, description) of every field; open dict sections as '<key>.*'."""
    out = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out.extend(keys_of(tp, f"{prefix}{f.name}."))
        elif tp is dict or typing.get_origin(tp) is dict:
            out.append((f"{prefix}{f.name}.*", f.metadata.get("help", "")))
        else:
            out.append((prefix + f.name, f.metadata.get("help", "")))
    return out


@pytest.mark.parametrize("module", sorted(CLIS))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_key_with_a_description(module: str, flag: str, capsys: pytest.CaptureFixture[str]):
    loaded = importlib.import_module(module)
    with pytest.raises(SystemExit) as info:
        run_cli(loaded.main, [flag])
    out = capsys.readouterr().out
    assert info.value.code == 0 and out.startswith("usage: key=value")
    schema_module, _, schema = CLIS[module].partition(":")
    for key, description in keys_of(getattr(importlib.import_module(schema_module), schema)):
        assert description, f"{module}: '{key}' has no description"
        line = next((x for x in out.splitlines() if x.split() and x.split()[0] == key), None)
        assert line is not None and description[:30] in line, (key, out)


def test_help_for_one_section_and_an_unknown_section(capsys: pytest.CaptureFixture[str]):
    from bridges.train import main

    with pytest.raises(SystemExit) as info:
        run_cli(main, ["help=trainer"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "trainer.group_size" in out and "int = 16" in out and "[>= 2]" in out
    assert "sampling.temperature" not in out and "backend " not in out
    with pytest.raises(SystemExit) as info:
        run_cli(main, ["help=nope"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "help=nope: no such section; sections: wandb, sampling, trainer; backends: " in err
