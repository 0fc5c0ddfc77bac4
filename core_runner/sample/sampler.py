"""Gumbel-Max sampling.

argmax(logits / T + Gumbel noise) is an exact draw from softmax(logits / T); the
softmax is never formed. Noise is keyed by (request seed, token position), so a
seeded request samples the same tokens whatever batch or row it runs in. Rows at
temperature 0 take the plain argmax. Stages no row of the batch uses are skipped,
decided from host mirrors of the per-row settings (no device read).
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


def gumbel_sample_ref(
    logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    logits = logits.float()
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    noisy = logits / t[:, None] + rng.gumbel(seeds, positions, logits.shape[-1])
    return torch.where(temperature > 0, noisy.argmax(dim=-1), logits.argmax(dim=-1))


class Sampler:
    def __init__(self, use_triton: bool = False) -> None:
        self.use_triton = use_triton

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
        if not any_random:
            return SamplerOutput(logits.argmax(dim=-1))
        if any_top_k_top_p:
            logits = apply_top_k_top_p_ref(logits.float(), top_k, top_p)
        if self.use_triton:
            from core_runner.kernels.gumbel_sample import gumbel_sample_triton

            return SamplerOutput(gumbel_sample_triton(logits, temperature, seeds, positions))
        return SamplerOutput(gumbel_sample_ref(logits, temperature, seeds, positions))
