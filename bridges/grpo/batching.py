"""Training samples -> padded tensors aligned for next-token prediction.

Position ``t`` of every ``*_B_T`` tensor scores token ``t + 1`` of the sequence, so the loss mask
and the sampler's logprobs are shifted by one relative to ``token_ids`` here, once, instead of in
every loss function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bridges.workflows.types import TrainingSample


@dataclass
class Batch:
    input_ids_B_L: torch.Tensor
    attention_mask_B_L: torch.Tensor
    loss_mask_B_T: torch.Tensor  # T = L - 1
    sampler_logps_B_T: torch.Tensor
    advantages_B: torch.Tensor


def collate(samples: list[TrainingSample], pad_token_id: int) -> Batch:
    """Right-pad samples into one batch (padding is masked out of attention and loss)."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples.")
    length = max(len(s.token_ids) for s in samples)
    if length < 2:
        raise ValueError("every training sample needs at least two tokens (a prompt and one sampled id).")
    size = len(samples)
    input_ids_B_L = torch.full((size, length), pad_token_id, dtype=torch.long)
    attention_mask_B_L = torch.zeros((size, length), dtype=torch.long)
    loss_mask_B_T = torch.zeros((size, length - 1), dtype=torch.float32)
    sampler_logps_B_T = torch.zeros((size, length - 1), dtype=torch.float32)
    for i, sample in enumerate(samples):
        n = len(sample.token_ids)
        input_ids_B_L[i, :n] = torch.tensor(sample.token_ids, dtype=torch.long)
        attention_mask_B_L[i, :n] = 1
        loss_mask_B_T[i, : n - 1] = torch.tensor(sample.loss_mask[1:], dtype=torch.float32)
        sampler_logps_B_T[i, : n - 1] = torch.tensor(sample.logprobs[1:], dtype=torch.float32)
    advantages_B = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return Batch(input_ids_B_L, attention_mask_B_L, loss_mask_B_T, sampler_logps_B_T, advantages_B)
