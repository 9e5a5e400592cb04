"""A dataset row a rollout cannot start from is refused before any rollout starts, in eval and train
alike: one sentence naming the row and the column, exit 2, no output or run folder written."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridges.runs.config import run_cli

ENV_MODULE = '''
from datasets import Dataset
import bridges as br

GOOD = [{"role": "user", "content": "say a"}]
PROMPTS = {
    "number": [5, 6, 7, 8],
    "mapping": [{"text": "hi"}] * 4,
    "no_role": [GOOD] * 3 + [[{"content": "x"}]],
    "empty": [GOOD] * 2 + [None, GOOD],
}


def load_environment(kind: str = "number"):
    rows = Dataset.from_dict({"prompt": PROMPTS[kind], "answer": ["a"] * 4})
    return br.SingleTurnEnv(dataset=rows, eval_dataset=rows, rubric=br.Rubric(funcs=[lambda completion: 1.0]))
'''

CASES = {  # kind -> (row, what the sentence says about it)
    "number": (0, "it is int 5"),
    "mapping": (0, "it is dict {'text': 'hi'}"),
    "no_role": (3, "message 0 has no 'role'"),
    "empty": (2, "it is empty and the row has no 'question'"),
}


@pytest.fixture
def bad_env(monkeypatch: pytest.MonkeyPatch) -> str:
    Path("bad_rows_env.py").write_text(ENV_MODULE)
    monkeypatch.syspath_prepend(str(Path.cwd()))
    return "bad_rows_env"


@pytest.mark.parametrize("kind", sorted(CASES))
@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_malformed_row_is_one_sentence_before_rollouts(
    command: str, kind: str, bad_env: str, capsys: pytest.CaptureFixture[str]
):
    if command == "eval":
        from bridges.eval import main

        split, written = "eval", "outputs"
    else:
        from bridges.train import main

        split, written = "train", "runs"
    with pytest.raises(SystemExit) as info:
        run_cli(main, [f"env={bad_env}", f"env_args={{kind: {kind}}}", "model=tiny"])
    err = capsys.readouterr().err.strip()
    row, problem = CASES[kind]
    assert info.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: row {row} of the {split} dataset of environment '{bad_env}', column 'prompt': {problem}"), err
    assert not Path(written).exists()


def test_a_prompt_may_be_a_string_or_fall_back_to_the_question():
    from datasets import Dataset

    from bridges.envs.base import check_prompts

    check_prompts(Dataset.from_dict({"prompt": ["say a", "say b"]}), "strings")
    check_prompts(Dataset.from_dict({"prompt": [None, [{"role": "user", "content": "b"}]], "question": ["a", None]}), "x")
