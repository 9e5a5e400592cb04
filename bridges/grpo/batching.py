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


def collate(samples: list[TrainingSample], pad_token_id: int, device: torch.device | str = "cpu") -> Batch:
    """Right-pad samples into one batch on ``device`` (padding is masked out of attention and loss)."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples.")
    length = max(len(s.token_ids) for s in samples)
    if length < 2:
        raise ValueError("every training sample needs at least two tokens (a prompt and one sampled id).")
    # padded Python lists and one tensor per field: a tensor per sample and field cost ~10% of a step
    ids, attention, loss_mask, sampler_logps = [], [], [], []
    for sample in samples:
        pad = length - len(sample.token_ids)
        ids.append([*sample.token_ids, *([pad_token_id] * pad)])
        attention.append([1] * len(sample.token_ids) + [0] * pad)
        loss_mask.append([*sample.loss_mask[1:], *([0] * pad)])
        sampler_logps.append([*sample.logprobs[1:], *([0.0] * pad)])
    return Batch(
        input_ids_B_L=torch.tensor(ids, dtype=torch.long, device=device),
        attention_mask_B_L=torch.tensor(attention, dtype=torch.long, device=device),
        loss_mask_B_T=torch.tensor(loss_mask, dtype=torch.float32, device=device),
        sampler_logps_B_T=torch.tensor(sampler_logps, dtype=torch.float32, device=device),
        advantages_B=torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
    )


def padding_sample(pad_token_id: int) -> TrainingSample:
    """Two padding tokens, one scored with advantage 0: the micro-batch a process runs when it has fewer
    than the others. With several processes every forward and backward is a collective over the same
    parameters, so it runs the whole graph (head included) and contributes a zero gradient."""
    return TrainingSample(token_ids=[pad_token_id] * 2, loss_mask=[0, 1], logprobs=[0.0, 0.0], advantage=0.0)


def pack_micro_batches(samples: list[TrainingSample], budget: int) -> list[list[TrainingSample]]:
    """The step's samples in micro-batches of at most ``budget`` tokens each (a longer sample alone), each
    to run as one packed row (``token_logprobs(packed=True)``): longest first, each into the first
    micro-batch with room (first-fit decreasing), so few micro-batches and little room left over. The
    loss is a sum over samples, so how they are grouped does not change the step."""
    bins: list[list[TrainingSample]] = []
    room: list[int] = []
    for sample in sorted(samples, key=lambda s: len(s.token_ids), reverse=True):
        size = len(sample.token_ids)
        for i, left in enumerate(room):
            if size <= left:
                bins[i].append(sample)
                room[i] -= size
                break
        else:
            bins.append([sample])
            room.append(budget - size)
    return bins
