"""``python -m bridges.export model=<run>``: a run's trained model as one folder ``from_pretrained`` loads.

Real runs of the bundled trainer (full weights and LoRA), then the export: the exported weights are the
checkpoint's trained values, a merged adapter computes what base + adapter compute, and every refusal
is one sentence with exit 2 that leaves no folder behind. (verl's export runs in its end-to-end test.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from bridges.runs.config import run_cli
from bridges.runtime.state_files import load_tensors

TRAIN = ["trainer.max_steps=2", "save_every=1", "progress=false",
         "trainer.learning_rate=1e-2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bridges.train import main

    root = tmp_path_factory.mktemp("runs")
    assert main([*TRAIN, f"output_dir={root}", "run_name=full"]) == 0
    assert main([*TRAIN, f"output_dir={root}", "run_name=lora", "trainer.lora_rank=4"]) == 0
    return root


def export(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from bridges.export import main

    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, args)
    out, err = capsys.readouterr()
    return exit_info.value.code, out + err


def test_full_weights_are_the_newest_checkpoints_trained_values(runs: Path, tmp_path: Path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    code, out = export([f"model={runs / 'full'}", f"output={tmp_path / 'm'}"], capsys)
    assert code == 0 and "saved full weights from" in out and "step_000002" in out
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32)
    trained = load_tensors(runs / "full" / "checkpoints" / "step_000002" / "trainable.safetensors")
    params = dict(model.named_parameters())
    assert trained and all(torch.equal(params[name], value) for name, value in trained.items())
    assert AutoTokenizer.from_pretrained(tmp_path / "m").chat_template  # the run's template travels with it
    # one named checkpoint exports that one, not the newest
    code, out = export([f"model={runs / 'full' / 'checkpoints' / 'step_000001'}", f"output={tmp_path / 'one'}"], capsys)
    first = load_tensors(runs / "full" / "checkpoints" / "step_000001" / "trainable.safetensors")
    loaded = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "one", dtype=torch.float32).named_parameters())
    assert code == 0 and "step_000001" in out and all(torch.equal(loaded[n], v) for n, v in first.items())
    assert not all(torch.equal(first[n], trained[n]) for n in first)  # the two steps did train


def test_a_lora_adapter_is_merged_into_its_base_unless_asked_to_keep_it(runs: Path, tmp_path: Path, capsys):
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    adapter = runs / "lora" / "checkpoints" / "step_000002" / "model"
    code, out = export([f"model={runs / 'lora'}", f"output={tmp_path / 'merged'}"], capsys)
    assert code == 0 and "merged into its base model" in out
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    reference = AutoPeftModelForCausalLM.from_pretrained(str(adapter), dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 14, 2, 7]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, reference(ids).logits, atol=1e-5, rtol=1e-5)
        base = reference.get_base_model()
        with reference.disable_adapter():
            assert not torch.allclose(base(ids).logits, merged(ids).logits, atol=1e-6)  # the adapter trained
    code, out = export([f"model={runs / 'lora'}", f"output={tmp_path / 'adapter'}", "merge_lora=false"], capsys)
    assert code == 0 and (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "adapter" / "adapter_model.safetensors").read_bytes() == (
        adapter / "adapter_model.safetensors"
    ).read_bytes()


def test_a_damaged_newest_checkpoint_is_skipped_with_a_note_and_refused_when_named(
    runs: Path, tmp_path: Path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(runs / "full", run)
    (run / "checkpoints" / "step_000002" / "state.json").write_text("{}")
    code, out = export([f"model={run}", f"output={tmp_path / 'm'}"], capsys)
    assert code == 0 and "skipped: checkpoint step_000002 is damaged" in out and "step_000001/model" in out
    code, out = export([f"model={run / 'checkpoints' / 'step_000002'}", f"output={tmp_path / 'n'}"], capsys)
    assert code == 2 and "is damaged" in out and not (tmp_path / "n").exists()


def test_hugging_face_trainer_folders_give_their_highest_numbered_checkpoint(tmp_path: Path, tiny_path: Path, capsys):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "trl-run"
    for step, scale in ((3, 1.0), (12, 2.0)):  # 12 after 3 by number, before it by name
        model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
        with torch.no_grad():
            model.lm_head.weight.mul_(scale)
        model.save_pretrained(run / f"checkpoint-{step}")
    code, out = export([f"model={run}", f"output={tmp_path / 'm'}"], capsys)
    assert code == 0 and "checkpoint-12" in out
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    torch.testing.assert_close(exported.lm_head.weight, base.lm_head.weight * 2.0)


def test_refusals_are_one_sentence_and_leave_no_folder(runs: Path, tmp_path: Path, capsys, monkeypatch):
    import huggingface_hub.constants

    out_dir = tmp_path / "out"
    cases = [
        ([f"model={runs / 'full'}", f"rollouts={runs / 'full'}", f"output={out_dir}"], "not both"),
        ([f"model={runs / 'full'}", f"output={out_dir}", "top_k=2"], "takes no filters"),
        ([f"model={runs / 'full'}"], "give output=<folder>"),
        ([f"model={tmp_path / 'nowhere'}", f"output={out_dir}"], "is not a folder"),
        ([f"model={tmp_path}", f"output={out_dir}"], "found no trained model under"),
        ([f"model={runs / 'full'}", f"output={runs / 'lora'}"], "already exists; pass overwrite=true"),
        ([f"model={runs / 'full'}", f"output={runs / 'full'}", "overwrite=true"], "holds the model being exported"),
    ]
    for args, sentence in cases:
        code, out = export(args, capsys)
        assert code == 2 and sentence in out and len(out.strip().splitlines()) == 1, (args, out)
        assert not out_dir.exists() and not (tmp_path / "out.tmp").exists()
    assert (runs / "full" / "checkpoints").is_dir()  # overwrite=true on the run itself deleted nothing
    # the Hub unreachable: the local copy is kept and the sentence says so
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    code, out = export([f"model={runs / 'full'}", f"output={out_dir}", "push_to_hub=someone/model"], capsys)
    assert code == 2 and "saved locally, but pushing to someone/model failed" in out
    assert (out_dir / "config.json").is_file()
