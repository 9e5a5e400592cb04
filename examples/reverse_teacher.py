"""A scripted teacher for ``reverse_text``: a stronger policy than the tiny model, written as an engine.

    cd examples && python -m bridges.eval env=reverse_text engine=reverse_teacher:ReverseTextTeacher model=tiny split=train

It reads the text to reverse from the prompt (the last user turn of the tiny model's ChatML template)
and samples ``<answer>reversed</answer>`` plus the end-of-turn token, in the student's own
vocabulary: its rollouts carry real token ids, so ``bridges.export`` turns them into supervised data
for the student exactly as it would a trained model's rollouts. Any ``Engine`` with
``from_pretrained(model)`` plugs into ``engine=module:Class`` the same way.
"""

from __future__ import annotations

from typing import Any

from bridges.envs.types import Sample, SamplingParams

USER = "<|im_start|>user\n"
END = "<|im_end|>"


class ReverseTextTeacher:
    name = "reverse-teacher"
    weight_version = 0
    max_model_len = None

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained(cls, model: str, **options: Any) -> ReverseTextTeacher:
        from transformers import AutoTokenizer

        from bridges.models.tiny import resolve_model_path

        return cls(AutoTokenizer.from_pretrained(resolve_model_path(model)))

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        text = prompt.rsplit(USER, 1)[-1].split(END, 1)[0]
        ids = self.tokenizer.encode(f"<answer>{text[::-1]}</answer>", add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        finish = "stop" if len(ids) <= params.max_tokens else "length"
        ids = ids[: params.max_tokens]
        return [Sample(list(ids), [0.0] * len(ids), finish) for _ in range(n)]

    async def aclose(self) -> None:
        return None
