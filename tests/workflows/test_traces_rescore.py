"""Traces of real rollouts, written with provenance and re-scored offline by ``bridges.rescore``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bridges.envs.registry import load_environment
from bridges.rescore import main as rescore_main
from bridges.runs.config import run_cli
from bridges.runtime.errors import ConfigError
from bridges.workflows.rollouts import run_group
from bridges.workflows.traces import TraceWriter, read_traces

PROVENANCE = {"backend": "test", "engine": "hf", "model": "tiny", "env_id": "repeat_letter", "seed": 0}


@pytest.fixture
async def traces(tiny_path: Path, tmp_path: Path) -> Path:
    from bridges.adapters.hf import HFEngine
    from bridges.client import EngineClient

    env = load_environment("repeat_letter")
    client = EngineClient(HFEngine.from_pretrained(str(tiny_path)))
    path = tmp_path / "traces.jsonl.gz"
    with TraceWriter(path, PROVENANCE) as writer:
        for step, row in enumerate(env.get_dataset().select(range(3)), 1):
            group = await run_group(env, dict(row), client, 4, {"seed": step}, model="tiny")
            assert writer.write_group(group, step=step) == 4
    return path


def test_every_episode_is_traced_with_provenance_and_tokens(traces: Path):
    records = list(read_traces(traces))
    assert len(records) == 12
    for record in records:
        assert record["provenance"]["backend"] == "test" and record["provenance"]["weight_version"] == 0
        assert record["provenance"]["step"] in (1, 2, 3)
        turn = record["turns"][0]
        assert turn["prompt_ids"] and len(turn["completion_ids"]) == len(turn["logprobs"]) <= 6
        assert isinstance(record["advantage"], float)
    # advantages are (r - mean) / (std + eps) within each group: they sum to ~0 per step
    for step in (1, 2, 3):
        group = [r["advantage"] for r in records if r["provenance"]["step"] == step]
        assert abs(sum(group)) < 1e-6


def test_rescore_applies_the_current_rubric_and_keeps_the_old_reward(traces: Path, capsys):
    out = traces.with_name("rescored.jsonl")
    assert rescore_main([f"traces={traces}", "env=repeat_letter", "env_args.length=2", f"output={out}"]) == 0
    printed = capsys.readouterr().out
    assert "rescored 12 episodes" in printed
    before = list(read_traces(traces))
    after = list(read_traces(out))
    assert len(after) == 12
    for old, new in zip(before, after, strict=True):
        text = "".join(m["content"] or "" for m in old["completion"])
        assert new["reward_before"] == old["reward"]
        assert new["reward"] == pytest.approx(sum(ch == old["answer"] for ch in text[:2]) / 2)
        assert new["provenance"] == old["provenance"] and new["turns"] == old["turns"]


def plain_copy(traces: Path) -> Path:
    """The same records as a plain ``traces.jsonl`` (what runs wrote before traces were compressed)."""
    plain = traces.with_name("traces.jsonl")
    plain.write_bytes(gzip.decompress(traces.read_bytes()))
    return plain


def test_a_cut_last_line_is_skipped_and_a_corrupt_middle_line_is_one_sentence(traces: Path, capsys):
    plain = plain_copy(traces)
    lines = plain.read_text().splitlines(keepends=True)
    plain.write_text("".join(lines[:-1]) + lines[-1][:30])
    assert len(list(read_traces(plain))) == 11  # a crash mid-write loses only the line being written
    plain.write_text(lines[0] + "{not json\n" + "".join(lines[1:]))
    with pytest.raises(SystemExit) as info:
        run_cli(rescore_main, [f"traces={plain}", "env=repeat_letter"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {plain}:2 is not valid JSON; the trace file is corrupted."


def test_a_cut_member_is_skipped_and_the_next_writer_drops_it(traces: Path):
    data = traces.read_bytes()  # three steps: three members of four episodes
    traces.write_bytes(data[:-9])  # killed mid-write of the third
    assert len(list(read_traces(traces))) == 8
    with TraceWriter(traces, PROVENANCE) as writer:  # reopened: the cut member goes before anything is appended
        writer._append('{"provenance": {"step": 4}}\n')
    assert [r["provenance"]["step"] for r in read_traces(traces)] == [1] * 4 + [2] * 4 + [4]
    damaged = bytearray(traces.read_bytes())
    damaged[len(damaged) // 2 : len(damaged) // 2 + 8] = b"\xff" * 8  # damage inside, not a cut end
    traces.write_bytes(bytes(damaged))
    with pytest.raises(ConfigError, match="is not a readable gzip file past byte .*; the trace file is corrupted"):
        list(read_traces(traces))


def test_missing_arguments_and_files_are_one_sentence(tmp_path: Path, capsys):
    for argv, message in [
        (["env=repeat_letter"], "both traces=<file> and env=<id> are required"),
        ([f"traces={tmp_path / 'nope.jsonl'}", "env=repeat_letter"], "does not exist"),
    ]:
        with pytest.raises(SystemExit):
            run_cli(rescore_main, argv)
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


def test_traces_are_gzipped_json_lines_that_datasets_and_gzip_read(traces: Path):
    from datasets import load_dataset

    first = json.loads(gzip.decompress(traces.read_bytes()).splitlines()[0])  # the members are one gzip file
    assert set(first) >= {"prompt", "completion", "answer", "reward", "stop_reason", "error", "provenance"}
    loaded = load_dataset("json", data_files=str(traces), split="train")
    assert len(loaded) == 12 and loaded[0]["provenance"]["step"] == 1


def test_a_writer_reopening_a_cut_file_drops_the_cut_line_instead_of_gluing_onto_it(traces: Path):
    plain = plain_copy(traces)
    lines = plain.read_text().splitlines(keepends=True)
    plain.write_text("".join(lines[:-1]) + lines[-1][:30])  # killed mid-write
    TraceWriter(plain, PROVENANCE).close()
    assert plain.read_text() == "".join(lines[:-1])
    assert len(list(read_traces(plain))) == 11
