"""Bad configuration is found before anything heavy loads: exit 2, one sentence on stderr, no model loaded.

``{tmp}``, ``{file}``, ``{malformed}``, ``{listed}`` and ``{fullrun}`` in an argument stand for paths
the fixture makes: the test folder, a plain file, a malformed YAML file, a YAML file holding a list,
and an output folder holding a full fine-tuning run with an intact checkpoint.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bridges.runs.config import run_cli

HUB_ID = "Qwen/Qwen2.5-0.5B-Instruct"  # not cached here; the Hub is made unreachable (hub_unreachable)
MISNAMED_REWARD = """
import bridges as br
from bridges.environments import repeat_letter


def correct(response, answer):  # a rollout offers 'completion', not 'response'
    return float(response == answer)


def load_environment(**kwargs):
    env = repeat_letter.load_environment(**kwargs)
    env.rubric = br.Rubric(funcs=[correct])
    return env
"""
NO_EVAL_SPLIT = """
from datasets import Dataset
import bridges as br


def load_environment():  # one split: nothing held out
    rows = [{"question": "Say a.", "answer": "a"}] * 4
    return br.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=br.Rubric(funcs=[lambda completion: 1.0]))
"""

TRAIN = [  # (argv, a piece of the sentence)
    (["trainer.group_size=0"], "trainer.group_size must be at least 2, got 0."),
    (["trainer.num_batches_ahead=-1"], "trainer.num_batches_ahead must be at least 0, got -1."),
    (["trainer.grad_accum_steps=0"], "trainer.grad_accum_steps must be at least 1, got 0."),
    (["trainer.loss=bogus"], "trainer.loss must be one of grpo, dr_grpo; got 'bogus'."),
    (["trainer.learning_rate=nan"], "trainer.learning_rate must be a finite number, got nan."),
    (["trainer.learning_rate=-inf"], "trainer.learning_rate must be a finite number, got -inf."),
    (["trainer.learning_rate=0"], "trainer.learning_rate must be greater than 0.0, got 0.0."),
    (["config={malformed}"], "is not valid YAML at line 3, column 1"),
    (["config={listed}"], "must hold a mapping of keys to values (key: value lines), not a list."),
    (["config={tmp}/missing.yaml"], "missing.yaml' does not exist."),
    (["config={tmp}"], "cannot be read"),
    (["env_args.bogus=1"], "environment 'repeat_letter' does not accept these env_args"),
    (["env_args.num_train=0"], "environment 'repeat_letter' has an empty train dataset"),
    (["env_args.length=oops"], "environment 'repeat_letter' could not be built"),
    (["output_dir={file}"], "cannot be a folder; choose another output_dir."),
    (["output_dir={file}/runs"], "is a file); choose another output_dir."),
    (["output_dir=/proc/bridges-runs"], "is not writable"),
    (["model=/no/such/model"], "model '/no/such/model' does not exist"),
    (["model=./nope"], "model './nope' does not exist"),
    (["model={file}"], "is not a model folder (it has no config.json)."),
    (["resume=true", "trainer.lora_rank=4", "output_dir={fullrun}", "run_name=run"], "holds full weights"),
    (["output_dir={fullrun}", "run_name=run"], "already holds a run; pass resume=true to continue it"),
    (["resume=true", "overwrite=true"], "resume=true and overwrite=true contradict each other"),
    (["run_name=../../escape"], "run_name '../../escape' must be one folder name"),
    (["trainer.max_steps=-1"], "trainer.max_steps must be at least 1, got -1."),
    (["trainer.batch_size=0"], "trainer.batch_size must be at least 1, got 0."),
    (["sampling.temperature=-1"], "sampling.temperature must be greater than 0.0, got -1.0."),
    (["sampling.top_p=1.5"], "sampling.top_p must be at most 1.0, got 1.5."),
    (["sampling.max_tokens=0"], "sampling.max_tokens must be at least 1, got 0."),
    (["save_every=-3"], "save_every must be at least 0, got -3."),
    (["trainer.max_concurrent=0"], "trainer.max_concurrent must be at least 1, got 0."),
    (["engine=bogus"], "engine must be one of auto, hf, paged, vllm; got 'bogus'."),
    # what a real run used to die on after a dry run passed: the same sentence in both modes now
    *[([*extra, f"model={HUB_ID}"], f"model '{HUB_ID}' is not in the Hugging Face cache and the Hub cannot be reached")
      for extra in ([], ["backend=verl"], ["backend=trl"], ["trainer.lora_rank=4"])],
    (["env=misnamed_reward"], "reward function 'correct' asks for 'response', which no rollout provides"),
    (["report_to=bogus"], "report_to must be one of none, wandb; got 'bogus'."),
    (["eval_every=-1"], "eval_every must be at least 0, got -1."),
    *[([*extra, "env=no_eval_split", "eval_every=5"], "environment 'no_eval_split' has no eval split")
      for extra in ([], ["backend=trl"], ["backend=verl"])],
    (["eval_every=5", "env_args.num_eval=0"], "environment 'repeat_letter' has an empty eval dataset"),
    (["dry_run=true", "env=repeat_leter"], "no environment 'repeat_leter' (did you mean 'repeat_letter'?)"),
    (
        ["dry_run=true", "backend=trl", "trl.learning_rat=1"],
        "'trl.learning_rat' is not a key of GRPOConfig (did you mean 'trl.learning_rate'?)",
    ),
    (["dry_run=true", "backend=trl", "engine=vllm"], "engine=vllm with backend=trl runs vLLM in this process"),
    (
        ["backend=tinker", "tinker.base_url=local", "tinker.max_steps_off_policy=1"],
        "unknown config key 'tinker.max_steps_off_policy'",
    ),
    (
        ["backend=tinker", "tinker.base_url=local", "trainer.beta=0.1"],
        "backend=tinker does not use trainer.beta (set to 0.1)",
    ),
    (["backend=trl", "trainer.max_concurrent=8"], "backend=trl does not use trainer.max_concurrent (set to 8)"),
    (["backend=verl", "trainer.rollout_process=true"], "backend=verl does not use trainer.rollout_process"),
    (["backend=tinker", "tinker.base_url=local", "tinker.loss_fn=dro"], "tinker.loss_fn must be one of"),
    (["backend=tinker", "tinker.base_url=local", "tinker.loss_fn=ppo", "trainer.ratio_cap=2.0"],
     "trainer.ratio_cap=2.0 has no place in Tinker's ppo loss"),
    (["backend=tinker", "tinker.base_url=local", "trainer.epsilon=0.1"],
     "trainer.epsilon=0.1 has no place in Tinker's importance_sampling loss, which does not clip the ratio"),
    (["backend=tinker", "tinker.base_url=local", "tinker.loss_fn=cispo", "trainer.epsilon_high=0.3"],
     "trainer.epsilon_high=0.3 has no place in Tinker's cispo loss"),
    (["backend=verl", "dry_run=true", "engine=vllm"], "engine=vllm needs a GPU and none is visible"),
    (["backend=verl", "dry_run=true", "trainer.ledger_breaks=every"],
     "backend=verl trains one token sequence a rollout, so trainer.ledger_breaks=every"),
    (["backend=trl", "env=repeat_letter_turns", "trl.repetition_penalty=1.2"],
     "backend=trl samples repeat_letter_turns's turns through EngineClient, which has no repetition_penalty=1.2"),
    (["backend=trl", "trainer.num_batches_ahead=1"],
     "backend=trl generates each batch with the weights that train on it, so trainer.num_batches_ahead=1"),
    (["backend=verl", "dry_run=true", "trainer.num_batches_ahead=2"],
     "backend=verl generates each batch with the weights that train on it, so trainer.num_batches_ahead=2"),
    (["backend=trl", "trainer.ledger_breaks=every"],
     "backend=trl trains one token sequence a rollout, so trainer.ledger_breaks=every"),
    (["trainer.ledger_breaks=some"], "trainer.ledger_breaks must be one of"),
    (
        [
            "backend=verl",
            "dry_run=true",
            "trainer.batch_size=3",
            "verl.actor_rollout_ref.rollout.agent.num_workers=2",
        ],
        "is not a multiple of verl's 2 agent-loop workers",
    ),
]

EVAL = [
    (["sampling.max_tokens=-5"], "sampling.max_tokens must be at least 1, got -5."),
    (["sampling.temperature=-1"], "sampling.temperature must be at least 0.0, got -1.0."),
    (["sampling.temperature=nan"], "sampling.temperature must be a finite number, got nan."),
    (["max_concurrent=0"], "max_concurrent must be at least 1, got 0."),
    (["rollouts_per_example=0"], "rollouts_per_example must be at least 1, got 0."),
    (["num_examples=-3"], "num_examples must be at least -1, got -3."),
    (["output={file}"], "cannot be a folder; choose another output."),
    (["env_args.bogus=1"], "environment 'repeat_letter' does not accept these env_args"),
    (["env_args.num_eval=0"], "environment 'repeat_letter' has an empty eval dataset"),
    (["env=reverse_txt"], "no environment 'reverse_txt' (did you mean 'reverse_text'?)"),
    (["model=/no/such/model"], "model '/no/such/model' does not exist"),
    (["engine=bogus"], "engine must be hf, openai or module:Class (your own engine), got 'bogus'."),
    (
        ["engine=nosuchmodule:Engine"],
        "engine 'nosuchmodule:Engine': module 'nosuchmodule' cannot be imported",
    ),
    (
        ["engine=json:JSONDecoder"],
        "engine 'json:JSONDecoder' names no class with from_pretrained(model, **options) in 'json'.",
    ),
    (["config={malformed}"], "is not valid YAML"),
]


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    from bridges.grpo.checkpoint import _PREFIX
    from bridges.runtime.state_files import write_manifest

    file = tmp_path / "a-file"
    file.write_text("not a folder")
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("trainer:\n  max_steps: [1, 2\n")
    listed = tmp_path / "listed.yaml"
    listed.write_text("- trainer.max_steps=3\n- env=x\n")
    checkpoint = tmp_path / "fullrun" / "run" / "checkpoints" / f"{_PREFIX}000002"
    (checkpoint / "model").mkdir(parents=True)
    (checkpoint / "model" / "model.safetensors").write_bytes(b"weights")
    write_manifest(checkpoint)
    (tmp_path / "fullrun" / "run" / "metrics.jsonl").write_text("")
    (tmp_path / "misnamed_reward.py").write_text(MISNAMED_REWARD)  # found in the working folder
    (tmp_path / "no_eval_split.py").write_text(NO_EVAL_SPLIT)
    monkeypatch.chdir(tmp_path)
    return {"tmp": str(tmp_path), "file": str(file), "malformed": str(malformed), "listed": str(listed),
            "fullrun": str(tmp_path / "fullrun")}


@pytest.fixture(autouse=True)
def hub_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub at a closed local port: the "cannot be reached" sentence whatever this machine's network."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to load (or build) a model fails the test."""
    import transformers

    import bridges.models.tiny

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a model was loaded before the configuration was validated")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(bridges.models.tiny, "tiny_model_path", refuse)


def run(
    module: str, argv: list[str], paths: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    import importlib

    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as info:
        run_cli(main, [arg.format(**paths) for arg in argv])
    return int(info.value.code), capsys.readouterr().err.strip()


CASES = [("bridges.train", *case) for case in TRAIN] + [("bridges.eval", *case) for case in EVAL]
WRITES = {"bridges.train": "runs", "bridges.eval": "outputs"}  # what a started run would have created


@pytest.mark.parametrize(("module", "argv", "piece"), CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_bad_config_is_refused_before_anything_loads(
    module: str, argv: list[str], piece: str, paths: dict[str, str], no_model_loads: None,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
):
    code, err = run(module, argv, paths, capsys)
    assert code == 2 and err.startswith("error: ") and piece in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not Path(WRITES[module]).exists()  # nothing was started or written (tests start in an empty folder)


def test_dry_run_validates_exactly_like_a_real_run(paths: dict[str, str], capsys: pytest.CaptureFixture[str]):
    """Every TRAIN case that fails without dry_run fails the same way with it."""
    import bridges.train

    for argv, piece in TRAIN:
        if "dry_run=true" in argv or "overwrite=true" in argv:
            continue
        code, err = run("bridges.train", [*argv, "dry_run=true"], paths, capsys)
        assert code == 2 and piece in err, (argv, err)
    assert bridges.train.main(["dry_run=true", f"output_dir={paths['tmp']}/ok"]) == 0


@pytest.mark.parametrize(
    ("argv", "piece"),
    [
        (["trainer.lora_rank=4", "trainer.lora_target_modules=[nonexistent]"], "names nonexistent, which model"),
        (["trainer.lora_rank=4", "trainer.lora_target_modules=[]"], "trainer.lora_target_modules is empty"),
        (["backend=trl", "dry_run=true", "trainer.lora_rank=4", "trainer.lora_target_modules=[q_proj,zz]"],
         "names zz, which model 'tiny' does not have; its projection modules are"),
        (["env=../../etc"], "no environment '../../etc'"),
    ],
)
def test_lora_targets_and_path_like_env_ids_are_refused_before_weights_load(
    argv: list[str], piece: str, paths: dict[str, str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, tiny_path: Path,
):
    import transformers

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("weights were loaded before the configuration was validated")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    code, err = run("bridges.train", argv, paths, capsys)
    assert code == 2 and piece in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_missing_backend_sdk_is_one_sentence_in_both_modes(
    dry_run: bool, paths: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, "tinker", None)  # import tinker raises ImportError
    monkeypatch.setenv("TINKER_API_KEY", "unused")
    code, err = run("bridges.train", ["backend=tinker", f"dry_run={str(dry_run).lower()}"], paths, capsys)
    assert code == 2 and err == (
        "error: 'tinker' is needed for backend=tinker but is not installed; install it with "
        "pip install 'rl-bridges[tinker]'."
    ), err


def test_the_console_script_finds_an_environment_in_the_working_folder_as_python_m_does(tmp_path: Path):
    """``bridges-train env=my_env`` and ``python -m bridges.train env=my_env`` resolve ``./my_env.py`` alike."""
    (tmp_path / "my_env.py").write_text(
        "from bridges.environments import repeat_letter\n\n"
        "def load_environment(**kwargs):\n    return repeat_letter.load_environment(**kwargs)\n"
    )
    script = Path(sys.executable).parent / "bridges-train"
    args = ["env=my_env", "dry_run=true", "trainer.max_steps=1"]
    outs = []
    for command in ([str(script), *args], [sys.executable, "-m", "bridges.train", *args]):
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-1500:]
        outs.append(done.stdout)
    assert "env: my_env" in outs[0] and outs[0] == outs[1]


@pytest.mark.parametrize("backend", ["grpo", "trl", "verl", "tinker"])
def test_one_synchronous_rule_runs_on_every_backend(backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``trainer.num_batches_ahead=0`` and ``trainer.ledger_breaks=first`` mean the same on all four, so a
    comparison sets them everywhere; unset, each backend keeps its own (1 or 0 batches ahead)."""
    import bridges.train
    from bridges.runs.config import parse_config
    from bridges.runs.train_config import TrainConfig, batches_ahead

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    extra = ["tinker.base_url=local"] if backend == "tinker" else []
    argv = [f"backend={backend}", "trainer.num_batches_ahead=0", "trainer.ledger_breaks=first", *extra]
    assert bridges.train.main([*argv, "dry_run=true", f"output_dir={tmp_path}"]) == 0
    if backend in ("grpo", "tinker"):  # the backends that generate ahead: one batch unless told
        assert batches_ahead(parse_config(TrainConfig, [f"backend={backend}"])) == 1
    else:  # the synchronous ones refuse a batch ahead rather than ignore it
        from bridges.runtime.errors import ConfigError

        ahead = [a.replace("=0", "=1") for a in argv]
        with pytest.raises(ConfigError, match="generates each batch with the weights that train on it"):
            bridges.train.main([*ahead, "dry_run=true", f"output_dir={tmp_path}"])
