"""Choosing the next token for every row of a batch at once, each row under its own parameters.

Why the logprob is ``log_softmax(logits / temperature)`` at the sampled id (raw logits when the
temperature is 0): that is the distribution the token was drawn from, and the one the trainer
recomputes from the same logits when it forms the importance ratio ``pi_new / pi_old``. top-k/top-p
only restrict which ids may be drawn; renormalising over the kept ids would report a probability no
trainer recomputes (TRL, verl and vLLM's ``processed_logprobs`` all use the temperature-scaled
full softmax), so it would bias the ratio on every step.

Why Gumbel-max (``argmax(logp + G)``, G a Gumbel draw per vocabulary entry) and not inverse-CDF sampling
(one uniform per row against the cumulative distribution): over a 151,936-word vocabulary each id's
share of the cumulative sum is ~1e-5, the size of the last-bit differences between two batch shapes or
attention paths, so inverse-CDF would pick a neighbouring id on a sizeable share of tokens whenever the
logits differ in their last bits. The argmax changes only on a near-tie of the two best scores.

Why the noise is counter-based (a hash of the row's seed, the token's index and the vocabulary entry)
and not a ``torch.Generator`` per row: a seeded request draws the same tokens whatever else shares its
batch (as with a generator per row), but the step launches the same few kernels for 1 or 256 rows,
keeps no state the host must advance, and can run inside a captured CUDA graph (``static_decode.py``),
where the counter is a device tensor advanced in place. Rows without a seed take one from torch's
global RNG when the batch starts, so ``torch.manual_seed`` still makes a whole run repeat.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bridges.envs.types import SamplingParams

_MASK64 = (1 << 63) - 1
_WORD = (1 << 64) - 1
_SEED_SPAN = (1 << 63) - 1  # row seeds are non-negative int64


def signed64(value: int) -> int:
    """``value`` modulo 2**64 as the int64 torch stores (its bits read as two's complement)."""
    value &= _WORD
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = signed64(0x9E3779B97F4A7C15)  # the counter advances by this per token (splitmix64's increment)
_MIX1 = signed64(0xBF58476D1CE4E5B9)
_MIX2 = signed64(0x94D049BB133111EB)


def step_counter(step: int) -> int:
    """The counter of a row's ``step``-th sampled token (0 = the first); the next step's is this plus
    ``COUNTER_STRIDE``, so a device tensor can advance it in place (int64 addition wraps)."""
    return signed64((step + 1) * 0x9E3779B97F4A7C15)


COUNTER_STRIDE = _GOLDEN
GREEDY_BELOW = 1e-5  # a temperature under this samples greedily (vLLM's _SAMPLING_EPS)


def _logical_shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x >> bits`` on the 64 bits as unsigned (torch shifts int64 arithmetically)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's output function (int64 multiplication wraps, as the hash needs)."""
    x = x ^ _logical_shift(x, 30)
    x = x * _MIX1
    x = x ^ _logical_shift(x, 27)
    x = x * _MIX2
    return x ^ _logical_shift(x, 31)


def mix64(value: int) -> int:
    """splitmix64's output function on a Python int (a row's seed is mixed once, on the host)."""
    x = value & _WORD
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _WORD
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _WORD
    return x ^ (x >> 31)


def uniforms(mixed_seeds_B: torch.Tensor, counter: int | torch.Tensor, vocab: int) -> torch.Tensor:
    """A float32 in (0, 1) per row and vocabulary entry: each row's key is the mix of its mixed seed
    (``mix64(seed)``, as int64) + ``counter``, each entry's number the mix of ``key ^ entry x golden``, top
    23 bits, centred in its interval (exact in float32). Integer ops only, no host state, the same numbers
    on any device. Why the seed is mixed first: the counter advances by the golden increment each token
    and ``row_seed`` spaces a request's samples by multiples of it, so unmixed, sample i+1's stream would
    be sample i's one token later."""
    key_B = _mix(mixed_seeds_B + counter)
    entries_V = torch.arange(vocab, dtype=torch.long, device=mixed_seeds_B.device) * _GOLDEN
    x = _mix(key_B.unsqueeze(1) ^ entries_V.unsqueeze(0))
    return (_logical_shift(x, 41) * 2 + 1).to(torch.float32) * (1.0 / (1 << 24))


def uniform_reference(seed: int, step: int, entry: int) -> float:
    """``uniforms`` for one row and entry in plain Python integers (the tests hold the tensor version to it)."""

    key = mix64(mix64(seed) + step_counter(step))
    x = mix64(key ^ ((entry * 0x9E3779B97F4A7C15) & _WORD))
    return ((x >> 41) * 2 + 1) / (1 << 24)


def row_seed(seed: int, index: int) -> int:
    """The seed of sample ``index`` of a request seeded with ``seed`` (distinct per sample, identical
    across runs: Python's int hashing is not randomised, but this avoids relying on it)."""
    return (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64


def drawn_seeds(seeds: Sequence[int | None]) -> list[int]:
    """Each row's seed, a row without one taking a number from torch's global RNG (one draw per batch)."""
    missing = sum(s is None for s in seeds)
    drawn = iter(torch.randint(0, _SEED_SPAN, (missing,), dtype=torch.long, device="cpu").tolist() if missing else [])
    return [next(drawn) if s is None else s for s in seeds]


class BatchSampler:
    """Per-batch sampling state: one tensor per parameter over the rows, plus host flags saying which
    filters run at all (they decide the ops launched, so they are fixed for a batch and key a captured
    graph). Built once per batch; ``keep(indices)`` drops finished rows when the decode loop compacts."""

    def __init__(
        self,
        params: Sequence[SamplingParams],
        seeds: Sequence[int | None],
        vocab_size: int,
        device: torch.device,
    ) -> None:
        # below GREEDY_BELOW a temperature is greedy, as vLLM takes it: its inverse would overflow float32
        temps = [float(p.temperature) if p.temperature >= GREEDY_BELOW else 0.0 for p in params]
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        self.vocab_size = vocab_size
        self.greedy = torch.tensor([t == 0 for t in temps], dtype=torch.bool, device=device)
        self.inv_temp = torch.tensor([1.0 / t if t else 1.0 for t in temps], dtype=torch.float32,
                                     device=device).unsqueeze(1)
        self.top_k = torch.tensor(top_k, dtype=torch.long, device=device).unsqueeze(1)
        self.top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device).unsqueeze(1)
        mixed = [signed64(mix64(seed)) for seed in drawn_seeds(seeds)]
        self.seeds = torch.tensor(mixed, dtype=torch.long, device=device)  # mixed once here (see uniforms)
        self._set_flags(temps, top_k, [p.top_p for p in params])

    def _set_flags(self, temps: list[float], top_k: list[int], top_p: list[float]) -> None:
        self._temps, self._top_k_list, self._top_p_list = temps, top_k, top_p
        self.all_greedy = all(t == 0 for t in temps)
        self.any_greedy = any(t == 0 for t in temps)
        self.use_top_k = any(k < self.vocab_size for k in top_k)
        self.use_top_p = any(p < 1.0 for p in top_p)

    @property
    def kind(self) -> tuple[bool, bool, bool, bool]:
        """Which ops ``sample`` launches: a captured graph is valid only for the same kind."""
        return self.all_greedy, self.any_greedy, self.use_top_k, self.use_top_p

    def tensors(self) -> dict[str, torch.Tensor]:
        """The per-row tensors by name (the static decoder copies them into its own buffers)."""
        return {"greedy": self.greedy, "inv_temp": self.inv_temp, "top_k": self.top_k, "top_p": self.top_p,
                "seeds": self.seeds}

    def bind(self, tensors: dict[str, torch.Tensor]) -> BatchSampler:
        """A sampler of the same kind over other tensors of the same meaning (a decoder's buffers, or
        views of their first rows)."""
        bound = object.__new__(BatchSampler)
        bound.vocab_size = self.vocab_size
        for name, tensor in tensors.items():
            setattr(bound, name, tensor)
        bound._temps, bound._top_k_list, bound._top_p_list = self._temps, self._top_k_list, self._top_p_list
        bound.all_greedy, bound.any_greedy = self.all_greedy, self.any_greedy
        bound.use_top_k, bound.use_top_p = self.use_top_k, self.use_top_p
        return bound

    def keep(self, indices: torch.Tensor, index_list: list[int]) -> None:
        """Keep only these rows (a tensor and the same indices as a list)."""
        for name, tensor in self.tensors().items():
            setattr(self, name, tensor[indices])
        self._set_flags([self._temps[i] for i in index_list], [self._top_k_list[i] for i in index_list],
                        [self._top_p_list[i] for i in index_list])

    def sample(
        self, logits: torch.Tensor, counter: int | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``logits`` [rows, vocab] (float32) and the step's ``counter`` (``step_counter``) -> (token ids
        [rows], their logprobs [rows], the temperature-scaled log-distribution [rows, vocab] they were
        drawn from). No host synchronisation: every branch is decided by the host flags."""
        logp = torch.log_softmax(logits * self.inv_temp, dim=-1)
        if self.all_greedy:
            tokens = logits.argmax(dim=-1)
        else:
            tokens = self._draw(self._filter(logp), counter)
            if self.any_greedy:
                tokens = torch.where(self.greedy, logits.argmax(dim=-1), tokens)
        return tokens, logp.gather(1, tokens.unsqueeze(1)).squeeze(1), logp

    def _draw(self, logp: torch.Tensor, counter: int | torch.Tensor) -> torch.Tensor:
        """Gumbel-max: the id with the largest ``logp + G``, ``G = -log(-log U)`` from ``uniforms``."""
        gumbel = uniforms(self.seeds, counter, logp.shape[-1]).log_().neg_().log_().neg_()
        return (logp + gumbel).argmax(dim=-1)

    @staticmethod
    def top(logp: torch.Tensor, k: int) -> tuple[list[list[int]], list[list[float]]]:
        """The ``k`` most likely ids of each row and their logprobs, under the same distribution the
        sampled id's logprob comes from (so the sampled id, when among them, shows the same number)."""
        values, ids = logp.topk(k, dim=-1)
        return ids.tolist(), values.tolist()

    def _filter(self, logp: torch.Tensor) -> torch.Tensor:
        """``logp`` with ids outside each row's top-k / top-p set at -inf (top-p over the top-k
        renormalised distribution, the order vLLM applies them in)."""
        if not (self.use_top_k or self.use_top_p):
            return logp
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        ranks = torch.arange(logp.shape[-1], device=logp.device).unsqueeze(0)
        remove = ranks >= self.top_k
        if self.use_top_p:
            kept = sorted_logp.masked_fill(remove, float("-inf"))
            probs = torch.softmax(kept, dim=-1)
            mass_before = probs.cumsum(dim=-1) - probs
            remove |= mass_before > self.top_p  # the first id always stays: mass_before is 0 there
        mask = torch.zeros_like(remove).scatter_(1, order, remove)
        return logp.masked_fill(mask, float("-inf"))
