"""Choosing the next token for every row of a batch at once, each row under its own parameters.

Why the logprob is ``log_softmax(logits / temperature)`` at the sampled id (raw logits when the
temperature is 0): that is the distribution the token was drawn from, and the one the trainer
recomputes from the same logits when it forms the importance ratio ``pi_new / pi_old``. top-k/top-p
only restrict which ids may be drawn; renormalising over the kept ids would report a probability no
trainer recomputes (TRL, verl and vLLM's ``processed_logprobs`` all use the temperature-scaled
full softmax), so it would bias the ratio on every step.

Why Gumbel-max (``argmax(logp - log E)`` with ``E ~ Exp(1)``) instead of ``torch.multinomial``: the
noise for a seeded row can come from that row's own ``torch.Generator`` while the argmax stays one
batched op, so a seeded request draws the same tokens whatever else shares its batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bridges.envs.types import SamplingParams

_MASK64 = (1 << 63) - 1


def row_seed(seed: int, index: int) -> int:
    """A generator seed for sample ``index`` of a request seeded with ``seed`` (distinct per sample,
    identical across runs: Python's int hashing is not randomised, but this avoids relying on it)."""
    return (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64


class BatchSampler:
    """Per-batch sampling state (temperatures, top-k/p, per-row generators), built once per batch.

    ``keep(indices)`` drops finished rows when the decode loop compacts its batch.
    """

    def __init__(
        self,
        params: Sequence[SamplingParams],
        seeds: Sequence[int | None],
        vocab_size: int,
        device: torch.device,
    ) -> None:
        temps = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
        self.greedy = temps == 0
        self.all_greedy = bool(self.greedy.all())
        self.any_greedy = bool(self.greedy.any())
        self.inv_temp = (1.0 / torch.where(self.greedy, torch.ones_like(temps), temps)).unsqueeze(1)
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        self.top_k = torch.tensor(top_k, dtype=torch.long, device=device).unsqueeze(1)
        self.use_top_k = any(k < vocab_size for k in top_k)
        self.top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device).unsqueeze(1)
        self.use_top_p = any(p.top_p < 1.0 for p in params)
        self.generators: list[torch.Generator | None] = []
        for s in seeds:
            if s is None:
                self.generators.append(None)
            else:
                gen = torch.Generator(device=device)
                gen.manual_seed(s)
                self.generators.append(gen)
        self._index_lists()

    def _index_lists(self) -> None:
        self._seeded = [i for i, g in enumerate(self.generators) if g is not None]
        self._any_unseeded = len(self._seeded) < len(self.generators)

    def keep(self, indices: torch.Tensor, index_list: list[int]) -> None:
        """Keep only these rows (a tensor and the same indices as a list)."""
        self.greedy = self.greedy[indices]
        self.all_greedy = bool(self.greedy.all())
        self.any_greedy = bool(self.greedy.any())
        self.inv_temp = self.inv_temp[indices]
        self.top_k = self.top_k[indices]
        self.top_p = self.top_p[indices]
        self.generators = [self.generators[i] for i in index_list]
        self._index_lists()

    def sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``logits`` [rows, vocab] (float32) -> (token ids [rows], their logprobs [rows], the
        temperature-scaled log-distribution [rows, vocab] they were drawn from)."""
        logp = torch.log_softmax(logits * self.inv_temp, dim=-1)
        if self.all_greedy:
            tokens = logits.argmax(dim=-1)
        else:
            tokens = (self._filter(logp) - self._log_exponential_noise(logp)).argmax(dim=-1)
            if self.any_greedy:
                tokens = torch.where(self.greedy, logits.argmax(dim=-1), tokens)
        return tokens, logp.gather(1, tokens.unsqueeze(1)).squeeze(1), logp

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

    def _log_exponential_noise(self, like: torch.Tensor) -> torch.Tensor:
        noise = torch.empty_like(like)
        if self._any_unseeded:
            noise.exponential_()  # unseeded rows follow torch's global RNG (torch.manual_seed applies)
        for i in self._seeded:
            noise[i].exponential_(generator=self.generators[i])
        return noise.clamp_(min=1e-20).log_()
