"""The sampling pipeline, one stage after the other:

  1. logit bias and min_tokens masking   (sparse edit, ``logit_bias.py``)
  2. repetition / frequency / presence   (sparse edit, ``penalties.py``)
  3. temperature                          (x = logit * 1/T, fused into 4 and 5)
  4. min-p, top-k, top-p                  (one threshold per row, ``kernels/top_k_top_p*``)
  5. Gumbel-Max                           (argmax(x + Gumbel noise) over x >= threshold)
     (Triton: 4 + 5 are fused, ``kernels/cut_sample_triton.py``: it draws over the
     whole row first and, since the draw stands whenever it lies inside the cut, only
     works out the threshold for the rows whose draw falls outside it; batches whose
     cuts are all top-p alone run it with each row over several programs,
     ``kernels/cut_sample_split_triton.py``, see CUT_SHAPE)
  then raw logprobs of the sampled tokens (``logprobs.py``).

argmax(logits / T + Gumbel noise) is an exact draw from softmax(logits / T); the
softmax is never formed. Noise is keyed by (request seed, token position), so a seeded
request samples the same tokens whatever batch or row it runs in. Rows at temperature 0
take the plain argmax (after bias and penalties). Each stage is skipped when no row of
the batch uses it, decided from host mirrors (``SamplingMetadata``), never by reading
the device. The input logits are never written: stages 1-2 edit a copy, made only when
one of them runs, so raw logprobs and recorded logits stay the model's.

The torch path (CPU) and the Triton path (GPU) draw the same random numbers and apply
the same cuts, so they sample the same tokens from the same logits (up to float
rounding of sums and logs: a token can differ only when a top-p boundary or two noisy
values tie to ~1e-6).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from core_runner.kernels.top_k_top_p import top_k_top_p_threshold_ref
from core_runner.sample import rng
from core_runner.sample.logit_bias import apply_logit_edits
from core_runner.sample.logprobs import LogprobTensors, compute_logprobs
from core_runner.sample.metadata import SamplingMetadata
from core_runner.sample.penalties import apply_penalties


# Launch shapes of the Triton samplers: each row over `split` programs of `num_warps`
# warps reading tiles of `block` columns (fastest measured on the H200 at [1024 x 151,936]
# fp32, benchmarks/RESULTS.md; the launchers clamp split to the row's tiles). CUT_SHAPE
# serves batches whose cutting rows all use top-p alone; others take the kernel's defaults.
# CUT_SHAPE (session 6): nucleus first with lane lists of depth 3 (``lane_lists_triton``):
# read 1 keeps each lane's top entries, and the decide launch draws most rows among the
# exact nucleus with no second read (H200, top-p 0.9: 0.519 ms against 0.646 for the
# former draw-first shape; RESULTS.md session 6).
# Session 7: read 1 of the lists on raw logits with 16-byte loads and no tile maxima (read 2,
# for the few rows the lists miss, reads every tile, prefetched); with ``all_top_p`` the
# decide runs at the end of read 1 (one launch fewer).
# search_block 256 (was 64): the pivot search of rows whose nucleus the lists and read 2 do
# not hold (flat rows) reads 4x wider tiles: N(0, 2^2) logits 18.99 -> 9.85 ms, N(0, 3^2)
# 3.53 -> 1.98 ms on the H200 (session 7).
# round_maxnreg 128 (session 9): read 2 and the histogram rounds at 128 registers (4 programs
# per SM, not 2): flat rows N(0, s^2) for s = 1, 2, 3: 24.4 -> 16.5, 14.6 -> 11.3, 5.5 -> 3.9 ms.
# decide_warps 2, decide_width 1024 (session 11): the decide in a launch of its own again, 2 warps a row, on
# the entries above T moved into 1,024 slots first (the next part's loaded while one is moved), with
# programmatic dependent launches (PDL_LAUNCH in cut_sample_split_triton) and the host's launches replayed
# from a launch plan: H200 graph 0.2175 ms against 0.2264 for the decide fused into read 1; the bench's
# top-p case 0.218 ms = 1.47 reads (benchmarks/RESULTS.md, session 11).
CUT_SHAPE = dict(split=8, block=512, num_warps=2, nucleus_first=True, cap=4096, lists=3, list_slots=256,
                 tile_max=False, search_block=256, round_maxnreg=128, decide_warps=2, decide_width=1024)
GUMBEL_SHAPE = dict(split=16, block=256, num_warps=1)


def cut_shape(meta: SamplingMetadata) -> dict:
    """The split cut kernel's arguments for a top-p-only batch: CUT_SHAPE, and with nucleus
    first whether every row is top-p alone (the other rows' read 1 is then left out)."""
    return dict(CUT_SHAPE, all_top_p=meta.all_top_p) if CUT_SHAPE.get("nucleus_first") else dict(CUT_SHAPE)


@dataclass(slots=True)
class SamplerOutput:
    sampled: torch.Tensor  # [num_reqs] int64
    logprobs: LogprobTensors | None = None
    logprob_rows: list[tuple[int, int]] = field(default_factory=list)  # (batch position, k)


def inverse_temperature(temperature: torch.Tensor) -> torch.Tensor:
    """1 / T, and 0 for greedy rows (T == 0): the form every stage takes."""
    t = temperature.float()
    return torch.where(t > 0, 1.0 / t, torch.zeros_like(t))


def gumbel_sample_ref(
    logits: torch.Tensor, inv_temp: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
    threshold: torch.Tensor | None = None,
) -> torch.Tensor:
    """Torch twin of ``kernels.gumbel_sample.gumbel_sample_triton`` (same noise, same cut)."""
    logits = logits.float()
    x = logits * inv_temp[:, None].float()
    if threshold is not None:
        x = x.masked_fill(x < threshold[:, None], float("-inf"))
    noisy = x + rng.gumbel(seeds, positions, logits.shape[-1])
    return torch.where(inv_temp > 0, noisy.argmax(dim=-1), logits.argmax(dim=-1))


class Sampler:
    def __init__(self, use_triton: bool = False) -> None:
        self.use_triton = use_triton

    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        raw = logits.float()
        work = raw
        if meta.edits is not None or meta.penalties is not None:
            if raw is logits or meta.logprob_rows:  # raw stays the model's; .float() of bf16 is a copy already
                work = raw.clone()
            if meta.edits is not None:
                apply_logit_edits(work, *meta.edits)
            if meta.penalties is not None:
                apply_penalties(work, meta.penalties)
        if not meta.any_random:
            sampled = work.argmax(dim=-1)
        elif meta.top_k is not None:
            sampled = self._cut_sample(work, meta)
        else:
            sampled = self._gumbel(work, meta, None)
        out = SamplerOutput(sampled, logprob_rows=meta.logprob_rows)
        if meta.logprob_rows:
            out.logprobs = self._logprobs(raw, sampled, meta)
        return out

    def _logprobs(self, raw: torch.Tensor, sampled: torch.Tensor, meta: SamplingMetadata) -> LogprobTensors:
        """Raw logprobs of the rows that asked, in ``logprob_rows`` order. A minority of the
        batch is gathered first (an r x V copy); otherwise every row is computed (no copy)
        and the small results are gathered."""
        idx, k = meta.logprob_idx, meta.num_logprobs
        if len(meta.logprob_rows) == raw.shape[0]:
            return compute_logprobs(raw, sampled, k, self.use_triton)
        if 2 * len(meta.logprob_rows) <= raw.shape[0]:
            return compute_logprobs(raw.index_select(0, idx), sampled.index_select(0, idx), k, self.use_triton)
        lp = compute_logprobs(raw, sampled, k, self.use_triton)
        return LogprobTensors(*(getattr(lp, f).index_select(0, idx) for f in LogprobTensors.__slots__))

    def _cut_sample(self, work: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Stages 4 + 5. Triton: one fused kernel that draws first and finds a threshold
        only for the rows whose draw falls outside their cut (``cut_sample_triton``)."""
        if self.use_triton:
            from core_runner.kernels.cut_sample_triton import sample_with_cuts_triton

            # rows with top-k or min-p finish on one program per row in the split kernels: a
            # batch holding any runs the one-program kernel (faster there on the H200)
            shape = cut_shape(meta) if meta.top_p_only else {}
            return sample_with_cuts_triton(work, meta.inv_temp, meta.seeds, meta.positions, meta.top_k,
                                           meta.top_p, meta.log_min_p, **shape)
        threshold = top_k_top_p_threshold_ref(work, meta.inv_temp, meta.top_k, meta.top_p, meta.log_min_p)
        return gumbel_sample_ref(work, meta.inv_temp, meta.seeds, meta.positions, threshold)

    def _gumbel(self, work: torch.Tensor, meta: SamplingMetadata, threshold: torch.Tensor | None) -> torch.Tensor:
        args = (work, meta.inv_temp, meta.seeds, meta.positions, threshold)
        if self.use_triton:
            from core_runner.kernels.gumbel_sample import gumbel_sample_triton

            return gumbel_sample_triton(*args, **GUMBEL_SHAPE)
        return gumbel_sample_ref(*args)
