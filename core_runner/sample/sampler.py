"""Gumbel-Max sampling (torch reference).

argmax(logits / T + Gumbel noise) is an exact draw from softmax(logits / T); the
softmax is never formed. Noise is keyed by (request seed, token position), so a
seeded request samples the same tokens whatever batch or row it runs in. Rows at
temperature 0 take the plain argmax.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from core_runner.sample import rng


@dataclass(slots=True)
class SamplerOutput:
    sampled: torch.Tensor  # [num_reqs] int64


def apply_top_k_top_p_ref(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top-k and top-p nucleus (sort-based)."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab)).long()
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    drop = ranks >= k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # keep the smallest prefix whose mass reaches top_p (the first token always stays)
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= (mass_before >= top_p[:, None].to(probs.dtype)) & (top_p[:, None] < 1.0)
    masked_sorted = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, masked_sorted)


class Sampler:
    """Reference sampler; the pipeline skips stages no row in the batch uses."""

    def __call__(
        self,
        logits: torch.Tensor,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        seeds: torch.Tensor,
        positions: torch.Tensor,
        *,
        any_random: bool,
        any_top_k_top_p: bool,
    ) -> SamplerOutput:
        logits = logits.float()
        greedy = logits.argmax(dim=-1)
        if not any_random:
            return SamplerOutput(greedy)
        t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
        scaled = logits / t[:, None]
        if any_top_k_top_p:
            scaled = apply_top_k_top_p_ref(scaled, top_k, top_p)
        noisy = scaled + rng.gumbel(seeds, positions, logits.shape[-1])
        sampled = noisy.argmax(dim=-1)
        return SamplerOutput(torch.where(temperature > 0, sampled, greedy))
