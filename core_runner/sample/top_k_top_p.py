"""Top-k / top-p / min-p as one threshold per row (sort-based torch reference).

The three cuts keep the tokens whose scaled logit x = logit * (1 / T) is at least a
row threshold, so they are computed as that threshold and applied while sampling
(``x >= threshold``), with no masked copy of the logits. The Triton twin
``top_k_top_p_triton.py`` samples under the same threshold without sorting the vocabulary.

Definitions, in order (each cut sees what the previous ones kept):
- min_p: t_min = max(x) + log(min_p), i.e. p_i >= min_p * p_max.
- top_k: v_k = the k-th largest x (with multiplicity); no cut when k <= 0 or when
  fewer than k finite tokens are left.
- top_p: over the tokens with x >= b = max(t_min, v_k), v_p = the largest x such that
  the probability mass of {x' >= x} reaches p (renormalised over those tokens): the
  smallest prefix of the sorted row whose mass reaches p.

Ties: a token equal to the threshold is always kept, so every token tied with the
k-th (or the last top-p) token stays in and a cut can keep more than k tokens. Both
implementations follow this rule; it makes the kept set a function of the values only,
never of the order in which a sort or a kernel met equal values.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from core_runner.sample.gumbel import GREEDY_EPS
from core_runner.sample.stage import Stage, Step
from core_runner.step_data.scheduler_output import NewRequest


def top_k_top_p_threshold_ref(
    logits: torch.Tensor, inv_temp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
    log_min_p: torch.Tensor,
) -> torch.Tensor:
    """[n, V] logits -> [n] float32 thresholds on x = logits * inv_temp.

    Rows with ``inv_temp == 0`` (greedy) or no active cut get -inf. ``log_min_p`` is
    log(min_p), -inf when min_p is 0; ``top_k <= 0`` and ``top_p >= 1`` disable those.
    """
    n, vocab = logits.shape
    neg_inf = torch.full((n,), float("-inf"), device=logits.device)
    if n == 0:
        return neg_inf
    x = logits.float() * inv_temp[:, None].float()
    s = x.sort(dim=-1, descending=True).values
    m = s[:, 0]
    n_finite = (s > float("-inf")).sum(dim=-1)
    live = (inv_temp > 0) & (n_finite > 0)
    b = torch.where(log_min_p.float() > float("-inf"), m + log_min_p.float(), neg_inf)
    k = top_k.long()
    k_on = (k > 0) & (k < n_finite)
    v_k = s.gather(1, (k - 1).clamp(0, vocab - 1)[:, None])[:, 0]
    b = torch.maximum(b, torch.where(k_on, v_k, neg_inf))
    p = top_p.float()
    e = torch.where(s >= b[:, None], torch.exp(s - m[:, None]), torch.zeros_like(s))
    cum = e.cumsum(dim=-1)
    target = p * cum[:, -1]
    # the first rank whose cumulative mass reaches p; its value is the threshold
    first = (cum < target[:, None]).sum(dim=-1).clamp(max=vocab - 1)
    v_p = s.gather(1, first[:, None])[:, 0]
    thr = torch.where(p < 1.0, torch.maximum(b, v_p), b)
    return torch.where(live, thr, neg_inf)


def apply_threshold(logits: torch.Tensor, inv_temp: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Logits with the tokens below their row's threshold set to -inf (for references)."""
    x = logits.float() * inv_temp[:, None].float()
    return logits.float().masked_fill(x < threshold[:, None], float("-inf"))


def apply_top_k_top_p_ref(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top-k and top-p nucleus (temperature 1)."""
    n = logits.shape[0]
    ones = torch.ones(n, device=logits.device)
    thr = top_k_top_p_threshold_ref(logits, ones, top_k, top_p, torch.full_like(ones, float("-inf")))
    return apply_threshold(logits, ones, thr)


@dataclass(slots=True)
class Cuts:
    """One step's cut settings, in batch order."""

    top_k: torch.Tensor  # [n] int32, <= 0 off
    top_p: torch.Tensor  # [n] float32, 1 off
    log_min_p: torch.Tensor  # [n] float32, -inf off


class CutStage(Stage):
    """top-k, top-p and min-p of each row; ``users`` are the sampled rows that cut."""

    def __init__(self, num_rows: int, device: torch.device) -> None:
        super().__init__(num_rows, device, {"top_k": torch.int32, "top_p": torch.float32, "min_p": torch.float32})
        self.top_k_cpu = [-1] * num_rows
        self.top_p_cpu = [1.0] * num_rows

    def add_request(self, row: int, req: NewRequest) -> None:
        sp = req.sampling_params
        k, p, min_p = (sp.top_k, float(sp.top_p), float(sp.min_p)) if sp is not None else (-1, 1.0, 0.0)
        self.write(row, top_k=k, top_p=p, min_p=min_p)
        self.top_k_cpu[row], self.top_p_cpu[row] = k, p
        self.users.discard(row)
        if sp is not None and sp.temperature >= GREEDY_EPS and (k > 0 or p < 1.0 or min_p > 0.0):
            self.users.add(row)

    def remove_request(self, row: int) -> None:
        super().remove_request(row)
        self.top_k_cpu[row], self.top_p_cpu[row] = -1, 1.0

    def prepare(self, step: Step) -> Cuts | None:
        """None when no row of the batch cuts (a greedy row's settings do not count)."""
        if not self.in_batch(step):
            return None
        return Cuts(self.gather("top_k", step), self.gather("top_p", step), self.gather("min_p", step).log())
