"""``python -m bridges.check``: the right verdict on every family fixture, on tiny, and on broken templates."""

from __future__ import annotations

import json
import shutil

import pytest

from bridges.check import main
from bridges.models.tiny import TINY_CHAT_TEMPLATE, build_tiny_tokenizer
from bridges.runs.config import run_cli


def run(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, args)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


@pytest.mark.parametrize(
    ("model", "code", "verdict"),
    [
        ("tiny", 0, "safe: prefix-preserving"),
        ("tiny-qwen2.5", 0, "safe: prefix-preserving"),
        ("tiny-llama3", 0, "safe: prefix-preserving"),
        ("tiny-deepseek-v3", 0, "safe: prefix-preserving"),
        (
            "tiny-qwen3",
            1,
            "drift by design: the template rewrites history (adding message 3 (user) reprints '<think>",
        ),
        (
            "tiny-mistral",
            1,
            "drift by design: the template rewrites history (adding message 3 (user) reprints 'AVAILABLE_TOOLS]",
        ),
    ],
)
def test_verdict_per_family(family_paths, capsys, model, code, verdict):
    status, out, _ = run([f"model={model}", "json=true"], capsys)
    report = json.loads(out)
    assert status == code and report["verdict"].startswith(verdict)
    assert report["ledger_extends"] is True and report["tool_round_trip"] is True
    assert report["forced_opener_matches"] is True
    assert report["engine_must_emit"] == [{"tiny-llama3": "<|eot_id|>", "tiny-mistral": "</s>",
                                           "tiny-deepseek-v3": "<｜end▁of▁sentence｜>"}.get(model, "<|im_end|>")]
    assert report["ledger_appends"] == (["\n"] if model in ("tiny", "tiny-qwen2.5", "tiny-qwen3") else [])
    assert report["family"] == {"tiny": "hermes", "tiny-qwen2.5": "hermes"}.get(
        model, model[5:].replace("-", "_")
    )


def _model_with_template(tmp_path, tiny_path, template):
    folder = tmp_path / "model"
    shutil.copytree(tiny_path, folder)
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_a_template_that_reprints_everything_is_unsafe(tmp_path, tiny_path, capsys):
    counting = "{{- 'Messages so far: ' + (messages | length | string) + '\\n' }}" + TINY_CHAT_TEMPLATE
    status, out, _ = run([f"model={_model_with_template(tmp_path, tiny_path, counting)}"], capsys)
    assert status == 1
    assert "verdict: unsafe: the ledger cannot extend some turns (message 2: the reply is not printed" in out


def test_tool_calls_the_parser_cannot_read(tmp_path, tiny_path, capsys):
    xml_calls = TINY_CHAT_TEMPLATE.replace('<tool_call>\\n{"name": "', "<function=")
    assert xml_calls != TINY_CHAT_TEMPLATE
    status, out, _ = run([f"model={_model_with_template(tmp_path, tiny_path, xml_calls)}"], capsys)
    assert status == 1 and "verdict: tool calls will not parse: the hermes parser read" in out


def test_report_file_and_bad_arguments(tmp_path, capsys):
    target = tmp_path / "report.json"
    status, out, _ = run(["model=tiny", f"report={target}"], capsys)
    assert status == 0 and "verdict: safe" in out
    assert json.loads(target.read_text())["safe"] is True
    assert run(["model=../../etc"], capsys)[:1] == (2,)
    status, _, err = run(["model=tiny", "report=/no/such/folder/r.json"], capsys)
    assert status == 2 and err == "error: report='/no/such/folder/r.json': its folder does not exist.\n"
    status, _, err = run([f"model={tmp_path}"], capsys)  # a folder that is not a model
    assert status == 2 and err.startswith("error: model ")
