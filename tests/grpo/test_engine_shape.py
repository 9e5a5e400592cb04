"""Whole-step batching (``bridges/grpo/engine_shape.py``): the trainer's engine decodes a step's rollouts and
those generated ahead of it as one batch, bounded by an estimate of their KV cache and logits; the paged
engine's cache on a GPU is sized from the same shape."""

from __future__ import annotations

from types import SimpleNamespace

from bridges.grpo.engine_shape import BatchShape, batch_shape, engine_rows, kv_bytes_per_token, row_bytes
from bridges.runs.config import parse_config
from bridges.runs.train_config import TrainConfig

QWEN_05B = SimpleNamespace(num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, hidden_size=896,
                           vocab_size=151936)


def config(*args: str) -> TrainConfig:
    return parse_config(TrainConfig, ["progress=false", *args])


def test_a_step_and_the_batches_ahead_are_one_batch_up_to_the_rollouts_in_flight():
    from bridges.envs.registry import load_environment
    from bridges.models.tiny import build_tiny_tokenizer

    env, tokenizer = load_environment("repeat_letter"), build_tiny_tokenizer()
    shape = batch_shape(config("trainer.max_concurrent=1000"), env, tokenizer, processes=1)
    assert shape.rows == 16 * 16 * 2  # batch x group x (num_batches_ahead + 1)
    assert batch_shape(config(), env, tokenizer, 1).rows == 256  # capped by trainer.max_concurrent
    assert batch_shape(config("trainer.num_batches_ahead=0", "trainer.batch_size=5"), env, tokenizer, 2).rows == 48
    rendered = [len(tokenizer.apply_chat_template(env.get_dataset()[i]["prompt"], add_generation_prompt=True,
                                                   return_dict=False))
                for i in range(64)]
    assert shape.prompt_tokens == max(rendered)
    assert batch_shape(config("sampling.max_tokens=7"), env, tokenizer, 1).completion_tokens == 7


def test_rows_are_bounded_by_their_cache_and_logits_never_below_a_group():
    assert kv_bytes_per_token(QWEN_05B, 2) == 2 * 24 * 2 * 64 * 2  # 12 KiB a token in bf16
    shape = BatchShape(rows=512, prompt_tokens=200, completion_tokens=312)
    one_row = row_bytes(QWEN_05B, 2, 512)
    assert one_row == 12288 * 512 + 4 * 4 * 151936
    assert engine_rows(shape, QWEN_05B, 2, 10**12, group_size=16) == 512  # room for the whole step
    assert engine_rows(shape, QWEN_05B, 2, 100 * one_row, group_size=16) == 100
    assert engine_rows(shape, QWEN_05B, 2, one_row, group_size=16) == 16  # one group, whatever the budget
    assert engine_rows(BatchShape(4, 10, 10), QWEN_05B, 2, 0, group_size=2) == 4


def test_the_trainers_engine_takes_the_whole_step(tmp_path):
    import torch

    from bridges.grpo.policy import make_engine
    from bridges.models.hardware import placement
    from bridges.models.tiny import build_tiny_tokenizer

    where = placement("cpu", "fp32")
    shape = BatchShape(rows=300, prompt_tokens=40, completion_tokens=24)
    engine = make_engine(config(f"output_dir={tmp_path}", "engine=hf"), where, build_tiny_tokenizer(), shape)
    assert (engine.max_batch_size, engine.static_cache, engine.cuda_graphs) == (300, False, False)
    paged = make_engine(config(f"output_dir={tmp_path}", "engine=paged"), where, build_tiny_tokenizer(), shape)
    assert paged.max_batch_size == 300 and paged.cache_tokens is None  # the CPU keeps its fixed cache
    assert torch.device("cpu") == engine.device
    engine.close()
    paged.close()
