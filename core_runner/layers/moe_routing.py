"""Expert routing: router logits [T, E] -> (weights [T, top_k] float32, ids [T, top_k] int32).

Every function works in float32 whatever the model dtype, is free of host reads (so it
is safe inside a CUDA graph) and returns ids as int32 for the fused MoE kernels. On CUDA
under the Triton kernel mode each runs as one kernel (``kernels/moe_routing_triton.py``),
this torch code being its reference. The order of the top_k columns carries no meaning:
the MoE layer sums over them.

- ``softmax_topk``: Mixtral / Qwen-MoE style; optionally renormalises the kept weights.
- ``grouped_topk_v2``: DeepSeek-V2 ("greedy" or "group_limited_greedy": keep the
  ``topk_group`` groups with the best single expert score), weights scaled by
  ``routed_scaling_factor``.
- ``grouped_topk_v3``: DeepSeek-V3: sigmoid scores; the choice uses scores plus
  ``e_score_correction_bias`` and keeps the ``topk_group`` groups with the largest sum
  of their two best biased scores; the weights are the unbiased scores of the chosen
  experts, optionally renormalised, then scaled by ``routed_scaling_factor``.
"""
from __future__ import annotations

import torch

from core_runner.forward_context import use_triton_kernels


def _on_triton(router_logits: torch.Tensor) -> bool:
    """The one-launch kernel (``kernels/moe_routing_triton.py``) on CUDA under the Triton
    kernel mode; the torch code below (its reference) everywhere else, the interpreter
    included: a program per token row is slow there and the code is the same."""
    return router_logits.is_cuda and use_triton_kernels(router_logits)


def _route_triton(router_logits: torch.Tensor, top_k: int, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    from core_runner.kernels.moe_routing_triton import route_triton

    return route_triton(router_logits, top_k, **kw)


def _out(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return weights.float(), ids.to(torch.int32)


def softmax_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the experts, keep the top_k: (weights [T, top_k] float32, ids int32);
    ``renormalize`` rescales the kept weights to sum to 1 (Mixtral, Qwen-MoE)."""
    if _on_triton(router_logits):
        return _route_triton(router_logits, top_k, mode="softmax", renormalize=renormalize)
    probs = router_logits.float().softmax(dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return _out(weights, ids)


def _group_mask(choice: torch.Tensor, group_scores: torch.Tensor, topk_group: int) -> torch.Tensor:
    """Bool mask [T, E]: experts whose group is among the ``topk_group`` best groups."""
    num_tokens, num_groups = group_scores.shape
    best = group_scores.topk(topk_group, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    per_group = choice.shape[-1] // num_groups
    return keep.unsqueeze(-1).expand(num_tokens, num_groups, per_group).reshape(num_tokens, -1)


def check_expert_groups(num_experts: int, n_group: int | None, topk_group: int | None) -> tuple[int, int]:
    """(n_group, topk_group) when they describe a grouping of ``num_experts``; a ValueError
    naming the field otherwise (a model calls it at construction, so a config that cannot
    route is refused before any request runs)."""
    if not n_group or not topk_group:
        raise ValueError(f"grouped routing needs n_group and topk_group (got {n_group}, {topk_group})")
    if num_experts % n_group:
        raise ValueError(f"n_routed_experts={num_experts} is not a multiple of n_group={n_group}")
    if not 0 < topk_group <= n_group:
        raise ValueError(f"topk_group={topk_group} must be in 1..n_group={n_group}")
    return n_group, topk_group


def grouped_topk_v2(
    router_logits: torch.Tensor, top_k: int, topk_method: str, n_group: int | None = None,
    topk_group: int | None = None, routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2 routing: softmax scores; "greedy" keeps the top_k experts,
    "group_limited_greedy" first masks all but the ``topk_group`` groups (of ``n_group``)
    with the best single score. Returns (weights x routed_scaling_factor [T, top_k] float32,
    ids int32)."""
    if topk_method not in ("greedy", "group_limited_greedy"):
        raise ValueError(f"topk_method={topk_method!r} is not supported: expected 'greedy' or 'group_limited_greedy'")
    limited = topk_method == "group_limited_greedy"
    if limited:
        n_group, topk_group = check_expert_groups(router_logits.shape[-1], n_group, topk_group)
    if _on_triton(router_logits):
        return _route_triton(router_logits, top_k, mode="v2", n_group=n_group if limited else None,
                             topk_group=topk_group, routed_scaling_factor=routed_scaling_factor)
    scores = router_logits.float().softmax(dim=-1)
    if limited:
        group_scores = scores.view(scores.shape[0], n_group, -1).amax(dim=-1)
        scores = scores.masked_fill(~_group_mask(scores, group_scores, topk_group), 0.0)
    weights, ids = scores.topk(top_k, dim=-1)
    return _out(weights * routed_scaling_factor, ids)


def grouped_topk_v3(
    router_logits: torch.Tensor, correction_bias: torch.Tensor | None, top_k: int, n_group: int,
    topk_group: int, renormalize: bool, routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing: sigmoid scores; experts are chosen by score + correction_bias
    within the ``topk_group`` groups whose two best biased scores sum highest; their
    weights are the unbiased scores, renormalised if asked, times routed_scaling_factor.
    Returns (weights [T, top_k] float32, ids int32)."""
    n_group, topk_group = check_expert_groups(router_logits.shape[-1], n_group, topk_group)
    if router_logits.shape[-1] // n_group < 2:
        raise ValueError("DeepSeek-V3 group routing ranks groups by their top-2 sum: needs >= 2 experts per group")
    if _on_triton(router_logits):
        return _route_triton(router_logits, top_k, mode="v3", renormalize=renormalize, n_group=n_group,
                             topk_group=topk_group, correction_bias=correction_bias,
                             routed_scaling_factor=routed_scaling_factor)
    scores = router_logits.float().sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias.float()
    grouped = choice.view(choice.shape[0], n_group, -1)
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    choice = choice.masked_fill(~_group_mask(choice, group_scores, topk_group), float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return _out(weights * routed_scaling_factor, ids)
