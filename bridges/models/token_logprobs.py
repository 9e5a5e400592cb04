"""Log-probabilities of chosen token ids under a causal LM, without all B×L×V logits at once.

The plain computation — ``model(ids).logits``, ``log_softmax``, ``gather`` — holds B×L×V float32
logits, and autograd keeps another copy for the backward: at Qwen's 151,936-token vocabulary a batch
of 16×16 sequences of 512 tokens is ~80 GB. Here the model runs once for its final hidden states (its
own forward, asked for no logits, with a hook on the decoder), and the vocabulary projection,
log-softmax and gather run over the wanted positions only, ``chunk_tokens`` at a time, each chunk
under activation checkpointing: one chunk's logits exist at a time, in the forward and again when the
backward recomputes them. Positions nobody asked for (the prompt, padding) are never projected.

For the usual plain linear head, ``HeadLogprobs`` computes the backward itself: the logits' gradient
is made in place of the recomputed logits and the head's gradient is added into one buffer, so the
backward holds one chunk too. A wrapped head (LoRA on it) goes through checkpointed chunks.

Running the model's own forward (rather than its decoder and head separately) keeps wrappers that
act in ``forward`` working: FSDP2 gathers the root's parameters there, peft routes through it.
``chunked_matches_plain`` compares both ways once on a short input; a model whose forward does more
after the projection than this split knows (logit soft-capping or scaling) falls back to the plain
computation. Equal to it within 1e-6 in fp32 (``tests/grpo/test_token_logprobs.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def default_chunk_tokens(device: torch.device) -> int:
    """Loss positions per chunk when the setting leaves it to the device: on CUDA 1,024 (at Qwen's vocabulary
    ~0.6 GB of fp32 logits, and four times fewer head launches than 256), on a CPU 256."""
    return 1024 if device.type == "cuda" else 256


def token_logprobs(
    model: Any,
    input_ids_B_L: torch.Tensor,
    attention_mask_B_L: torch.Tensor,
    targets_B_L: torch.Tensor,
    wanted_B_L: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 256,
    chunked: bool = True,
    fp32_grad: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
    packed: bool = False,
) -> torch.Tensor:
    """``out[b, t] = log p(targets[b, t] | ids[b, :t + 1])`` (logits / temperature) where ``wanted[b, t]``,
    0 elsewhere; float32, shape (B, L). ``chunked=False``: the plain full-logits computation.
    ``fp32_grad(weight)``: an fp32 buffer the head's gradient is added into instead of ``weight.grad``
    (a half weight's master gradient, ``grpo.precision.MasterWeights.fp32_grad``). ``packed``: the model
    runs the rows' real tokens without padding (``packed_inputs``: one row under varlen attention, else
    rows as long as the longest sequence); the result is the same."""
    scale = 1.0 / temperature if temperature > 0 and temperature != 1.0 else 1.0
    wanted = wanted_B_L.bool()
    out_B_L = torch.zeros(input_ids_B_L.shape, dtype=torch.float32, device=input_ids_B_L.device)
    real_B_L = attention_mask_B_L.bool()
    order_N = None
    if packed:
        row_tokens = None if varlen_attention(model) else int(real_B_L.sum(-1).max())
        inputs, order_N = packed_inputs(input_ids_B_L, real_B_L, row_tokens)
    else:
        inputs = padded_inputs(input_ids_B_L, attention_mask_B_L)
    if not chunked:
        logits = model(**inputs).logits.float() * scale
        logits_B_L_V = logits.new_zeros(*input_ids_B_L.shape, logits.shape[-1]).masked_scatter(
            real_B_L[..., None], logits.flatten(0, 1)[order_N]) if order_N is not None else logits
        picked = logits_B_L_V.gather(-1, targets_B_L.unsqueeze(-1)).squeeze(-1) - logits_B_L_V.logsumexp(-1)
        return torch.where(wanted, picked, out_B_L)
    hidden = final_hidden_states(model, inputs)
    # order_N lists the packed places of the real tokens in row-major order, as boolean indexing reads (B, L)
    hidden_N_H = hidden.flatten(0, 1)[order_N][wanted[real_B_L]] if order_N is not None else hidden[wanted]
    targets_N = targets_B_L[wanted]
    head = model.get_output_embeddings()
    if type(head) is torch.nn.Linear and head.bias is None:  # the usual head: its gradient written in place
        sink = fp32_grad(head.weight) if fp32_grad is not None and head.weight.requires_grad else None
        picked_N = HeadLogprobs.apply(hidden_N_H, head.weight, targets_N, scale, chunk_tokens, sink)
    else:  # a wrapped head (a LoRA adapter on it): each chunk through the module, recomputed in the backward
        pieces = [
            checkpoint(_chunk_logprobs, head, hidden_N_H[i : i + chunk_tokens], targets_N[i : i + chunk_tokens],
                       scale, use_reentrant=False)
            for i in range(0, hidden_N_H.shape[0], chunk_tokens)
        ]
        picked_N = torch.cat(pieces) if pieces else hidden_N_H.new_zeros(0, dtype=torch.float32)
    return out_B_L.masked_scatter(wanted, picked_N)


def padded_inputs(input_ids_B_L: torch.Tensor, attention_mask_B_L: torch.Tensor) -> dict[str, Any]:
    position_ids_B_L = (attention_mask_B_L.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids_B_L, "attention_mask": attention_mask_B_L,
            "position_ids": position_ids_B_L, "use_cache": False}


def varlen_attention(model: Any) -> bool:
    """Whether the model's attention runs packed sequences with varlen kernels (flash-attention), so one
    row of N tokens costs what its sequences cost apart. Others (sdpa, eager) apply a block-diagonal
    N x N mask: attention and the mask grow with N squared, whatever the sequences' own lengths."""
    return str(getattr(model.config, "_attn_implementation", "")).startswith("flash")


def packed_inputs(
    input_ids_B_L: torch.Tensor, real_B_L: torch.Tensor, row_tokens: int | None = None
) -> tuple[dict[str, Any], torch.Tensor]:
    """The rows' real tokens without padding, positions restarting at each sequence's start, and no
    attention mask: transformers reads the sequences' bounds from the positions (flash-attention's varlen
    kernels on CUDA, a block-diagonal mask under sdpa and eager), so no token attends across two sequences.
    Each row's real tokens must be one run (right or left padding).

    ``row_tokens`` None: ONE row of every real token (for varlen kernels). Else rows of at most that many
    tokens, the sequences placed longest first into the first row with room, each row's tail padded (its
    own short sequence, never scored): with ``row_tokens`` the longest sequence, a block-diagonal mask
    costs at most what padding would (rows x longest^2 <= sequences x longest^2) and the linear layers
    see no more tokens. Also returns each real token's index in the flattened rows, in (B, L) row-major order."""
    lengths = [int(n) for n in real_B_L.sum(-1).tolist()]
    device = input_ids_B_L.device
    if row_tokens is None:
        positions = torch.cat([torch.arange(n, device=device) for n in lengths if n])
        order = torch.arange(positions.numel(), device=device)
        return {"input_ids": input_ids_B_L[real_B_L][None], "position_ids": positions[None], "use_cache": False}, order
    rows, starts = _first_fit(lengths, row_tokens)
    ids_R_K = input_ids_B_L.new_zeros(len(rows), row_tokens)
    positions_R_K = torch.zeros_like(ids_R_K)
    tokens = input_ids_B_L[real_B_L].split([n for n in lengths if n])
    for sequence, (row, start) in zip(tokens, (starts[b] for b, n in enumerate(lengths) if n), strict=True):
        ids_R_K[row, start : start + len(sequence)] = sequence
        positions_R_K[row, start : start + len(sequence)] = torch.arange(len(sequence), device=device)
    for row, used in enumerate(rows):  # the tail: a padding run of its own, positions 0, 1, ...
        positions_R_K[row, used:] = torch.arange(row_tokens - used, device=device)
    order = torch.cat([torch.arange(n, device=device) + starts[b][0] * row_tokens + starts[b][1]
                       for b, n in enumerate(lengths) if n])
    return {"input_ids": ids_R_K, "position_ids": positions_R_K, "use_cache": False}, order


def _first_fit(lengths: list[int], capacity: int) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """Sequences longest first into the first row with room: each row's used tokens, and each sequence's
    (row, start)."""
    used: list[int] = []
    starts: dict[int, tuple[int, int]] = {}
    for b in sorted((b for b, n in enumerate(lengths) if n), key=lambda b: -lengths[b]):
        row = next((r for r, u in enumerate(used) if u + lengths[b] <= capacity), len(used))
        if row == len(used):
            used.append(0)
        starts[b] = (row, used[row])
        used[row] += lengths[b]
    return used, starts


class HeadLogprobs(torch.autograd.Function):
    """``log_softmax(hidden @ weight.T * scale)`` at the targets, ``chunk`` rows at a time, for a plain
    linear head. The forward keeps each row's log-sum-exp and no logits; the backward recomputes one
    chunk's logits, turns them into their own gradient in place (``g * (onehot - softmax)``): one chunk
    of logits is the most that ever exists.

    The head's gradient is added into ``weight.grad`` in place (the weight is a leaf parameter) rather
    than returned: returned, autograd would sum it with a tied input embedding's gradient out of place,
    three vocabulary-sized tensors at once (at Qwen's vocabulary and width, 1.5 GB in fp32).

    The chunks' contributions are summed in fp32 whatever the weight's dtype: into ``sink`` (a half
    weight's fp32 master gradient) when given, else, for a half weight, into an fp32 buffer added to
    ``weight.grad`` once at the end (FSDP's gathered half weight: a vocabulary-sized fp32 buffer for
    the backward's duration). Each chunk's product runs in the weight's dtype, so the half-precision matmul
    kernels stay in use: on CUDA the kernel writes fp32 itself (``fp32_product``, ``out_dtype``: the
    logits are never rounded to half, the head's gradient is one fp32-accumulating matmul per chunk);
    elsewhere the product is cast, and the gradient added a vocabulary slice at a time, so no
    vocabulary-sized half temporary exists."""

    @staticmethod
    def forward(ctx: Any, hidden_N_H: torch.Tensor, weight_V_H: torch.Tensor, targets_N: torch.Tensor,
                scale: float, chunk: int, sink: torch.Tensor | None = None) -> torch.Tensor:
        picked_N = torch.empty(hidden_N_H.shape[0], dtype=torch.float32, device=hidden_N_H.device)
        lse_N = torch.empty_like(picked_N)
        for i in range(0, hidden_N_H.shape[0], chunk):
            logits_C_V = fp32_product(hidden_N_H[i : i + chunk], weight_V_H.T).mul_(scale)
            lse_N[i : i + chunk] = logits_C_V.logsumexp(-1)
            picked_N[i : i + chunk] = logits_C_V.gather(-1, targets_N[i : i + chunk, None]).squeeze(-1)
        ctx.save_for_backward(hidden_N_H, targets_N, lse_N)
        ctx.weight, ctx.scale, ctx.chunk, ctx.sink = weight_V_H, scale, chunk, sink  # the parameter itself, for its .grad
        return picked_N - lse_N

    @staticmethod
    def backward(ctx: Any, grad_N: torch.Tensor) -> tuple[Any, ...]:
        hidden_N_H, targets_N, lse_N = ctx.saved_tensors
        weight_V_H = ctx.weight
        grad_hidden = torch.empty_like(hidden_N_H) if ctx.needs_input_grad[0] else None
        grad_weight = _head_grad_buffer(weight_V_H, ctx.sink) if ctx.needs_input_grad[1] else None
        for i in range(0, hidden_N_H.shape[0], ctx.chunk):
            rows, g_C = slice(i, i + ctx.chunk), grad_N[i : i + ctx.chunk, None]
            logits_C_V = fp32_product(hidden_N_H[rows], weight_V_H.T).mul_(ctx.scale)
            grad_C_V = logits_C_V.sub_(lse_N[rows, None]).exp_().mul_(-g_C)  # -g * softmax, in place
            grad_C_V = grad_C_V.scatter_add_(-1, targets_N[rows, None], g_C).mul_(ctx.scale).to(hidden_N_H.dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = grad_C_V @ weight_V_H
            if grad_weight is not None:
                _add_head_grad(grad_weight, grad_C_V, hidden_N_H[rows])
        if grad_weight is not None and ctx.sink is None and grad_weight.dtype != weight_V_H.dtype:
            # the fp32 sum rounded once into a half weight's gradient
            if weight_V_H.grad is None:
                weight_V_H.grad = grad_weight.to(weight_V_H.dtype)
            else:
                weight_V_H.grad.add_(grad_weight)
        return grad_hidden, None, None, None, None, None  # the weight's gradient is already written


VOCAB_SLICE = 8192  # vocabulary rows per half-precision product added into an fp32 head gradient


def _head_grad_buffer(weight_V_H: torch.Tensor, sink: torch.Tensor | None) -> torch.Tensor:
    """Where the chunks' head gradients are summed: the fp32 sink, the weight's own fp32 gradient, or
    (a half weight) an fp32 buffer that ``weight.grad`` receives at the end."""
    if sink is not None:
        return sink
    if weight_V_H.dtype != torch.float32:
        return torch.zeros_like(weight_V_H, dtype=torch.float32)
    if weight_V_H.grad is None:
        weight_V_H.grad = torch.zeros_like(weight_V_H)
    return weight_V_H.grad


def fp32_accumulation(device: torch.device) -> bool:
    """Whether half-precision products can be written in fp32 by the matmul itself (``out_dtype``: CUDA
    kernels in torch 2.8+; one kernel that accumulates in fp32 and never rounds the result to half)."""
    return device.type == "cuda" and hasattr(torch.ops.aten.mm, "dtype")


def fp32_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` as fp32: written in fp32 by the kernel where it can (half inputs on CUDA), else the
    product in the inputs' dtype, cast (the CPU path, and fp32 inputs, unchanged)."""
    if a.dtype != torch.float32 and fp32_accumulation(a.device):
        return torch.mm(a, b, out_dtype=torch.float32)
    return (a @ b).float()


def _add_head_grad(grad_V_H: torch.Tensor, grad_C_V: torch.Tensor, hidden_C_H: torch.Tensor) -> None:
    """``grad_V_H += grad_C_V.T @ hidden_C_H``: in place when the dtypes agree; an fp32 sum of half
    products in one kernel where the matmul writes fp32 (CUDA); else one vocabulary slice at a time."""
    if grad_V_H.dtype == grad_C_V.dtype:
        grad_V_H.addmm_(grad_C_V.T, hidden_C_H)
        return
    if fp32_accumulation(grad_V_H.device):
        torch.addmm(grad_V_H, grad_C_V.T, hidden_C_H, out_dtype=torch.float32, out=grad_V_H)
        return
    for v in range(0, grad_V_H.shape[0], VOCAB_SLICE):
        grad_V_H[v : v + VOCAB_SLICE].add_(grad_C_V[:, v : v + VOCAB_SLICE].T @ hidden_C_H)


def _chunk_logprobs(head: Any, hidden_C_H: torch.Tensor, targets_C: torch.Tensor, scale: float) -> torch.Tensor:
    logits_C_V = head(hidden_C_H).float() * scale
    return logits_C_V.gather(-1, targets_C.unsqueeze(-1)).squeeze(-1) - logits_C_V.logsumexp(-1)


def final_hidden_states(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """The decoder's last hidden states (after its final norm) from one ordinary forward of ``model``
    that computes the logits of no position at all."""
    captured: list[torch.Tensor] = []
    hook = model.get_decoder().register_forward_hook(
        lambda module, args, output: captured.append(output.last_hidden_state)
    )
    try:
        no_position = torch.zeros(0, dtype=torch.long, device=inputs["input_ids"].device)
        model(**inputs, logits_to_keep=no_position)
    finally:
        hook.remove()
    return captured[-1]


def chunked_matches_plain(model: Any, vocab_size: int, *, tolerance: float = 1e-3) -> bool:
    """Whether the chunked path gives the plain path's logprobs on this model (one short forward each,
    without gradients): false for a forward that cannot skip its logits or transforms them."""
    device = next(model.parameters()).device
    generator = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab_size, (1, 8), generator=generator, device="cpu").to(device)
    ones = torch.ones_like(ids)
    targets = torch.roll(ids, -1, dims=1)
    with torch.no_grad():
        plain = token_logprobs(model, ids, ones, targets, ones, chunked=False)
        try:
            chunked = token_logprobs(model, ids, ones, targets, ones, chunk_tokens=3)
        except (AttributeError, TypeError, IndexError):
            return False
    return bool(torch.allclose(plain, chunked, atol=tolerance, rtol=0.0))
