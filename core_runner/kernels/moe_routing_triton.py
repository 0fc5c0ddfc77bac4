"""Expert routing in one launch (Triton twin of ``layers.moe_routing``: ``softmax_topk``,
``grouped_topk_v2``, ``grouped_topk_v3``): router logits [T, E] -> (weights [T, top_k]
float32, ids [T, top_k] int32), where the torch code takes ~5 kernels (softmax top-k) to
~15 (V3's grouped choice) per MoE layer and step.

One program per token row holds the row's E scores (fp32). Scores: a softmax (MODE 0 and
1) or a sigmoid plus the correction bias for the choice (MODE 2). Groups (GROUPS > 0): each
expert's group is e // (E / GROUPS); a group's score is its best expert's (V2) or the sum
of its two best biased scores (V3); the TOPK_GROUP best groups are kept, the others' experts
scored 0 (V2, as ``masked_fill(0.0)``) or -inf (V3). Then TOP_K rounds of argmax (ties to
the lower expert id) take the experts in descending order, as ``torch.topk`` returns them;
the weight of each is its score (V2, softmax) or its unbiased sigmoid (V3), renormalised to
sum 1 when asked, times the scaling factor. The grid is the row count, a host int: safe
inside CUDA graphs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_NEG = tl.constexpr(float("-inf"))


@triton.jit
def _group_kept(choice, grp, NG: tl.constexpr, TOPK_GROUP: tl.constexpr, TOP2: tl.constexpr,
                BLOCK_E: tl.constexpr):
    """Bool [BLOCK_E]: the experts of the TOPK_GROUP best groups (group score: best score,
    or with TOP2 the sum of the two best)."""
    e = tl.arange(0, BLOCK_E)
    g = tl.arange(0, NG)
    member = grp[None, :] == g[:, None]  # [NG, BLOCK_E]
    vals = tl.where(member, choice[None, :], _NEG)
    best = tl.max(vals, axis=1)
    score = best
    if TOP2:
        first = tl.min(tl.where(vals == best[:, None], e[None, :], BLOCK_E), axis=1)
        second = tl.max(tl.where(e[None, :] == first[:, None], _NEG, vals), axis=1)
        score = best + second
    keep = tl.zeros([NG], dtype=tl.int1)
    for _ in tl.static_range(TOPK_GROUP):
        top = tl.max(score, axis=0)
        j = tl.min(tl.where(score == top, g, NG), axis=0)
        keep = keep | (g == j)
        score = tl.where(g == j, _NEG, score)
    return tl.max(tl.where(member & keep[:, None], 1, 0), axis=0) > 0


@triton.jit
def _route_kernel(
    logits_ptr, bias_ptr, w_ptr, ids_ptr, s_l, num_experts, per_group, scaling,
    MODE: tl.constexpr, TOP_K: tl.constexpr, GROUPS: tl.constexpr, TOPK_GROUP: tl.constexpr,
    RENORM: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_E: tl.constexpr, NG: tl.constexpr,
    TOP_K_PAD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    ok = e < num_experts
    x = tl.load(logits_ptr + row * s_l + e, mask=ok, other=_NEG).to(tl.float32)
    if MODE == 2:  # V3: sigmoid scores, the choice biased
        score = tl.where(ok, 1.0 / (1.0 + tl.exp(-x)), 0.0)
        choice = score
        if HAS_BIAS:
            choice = score + tl.load(bias_ptr + e, mask=ok, other=0.0).to(tl.float32)
        choice = tl.where(ok, choice, _NEG)
    else:  # softmax over the experts
        p = tl.exp(x - tl.max(x, axis=0))
        score = p / tl.sum(p, axis=0)
        choice = tl.where(ok, score, _NEG)
    if GROUPS > 0:
        grp = tl.where(ok, e // per_group, NG)
        kept = _group_kept(choice, grp, NG, TOPK_GROUP, MODE == 2, BLOCK_E)
        if MODE == 2:
            choice = tl.where(kept, choice, _NEG)
        else:  # V2's masked_fill(0.0): a left-out expert scores 0 (and can still fill top_k)
            choice = tl.where(ok, tl.where(kept, choice, 0.0), _NEG)
            score = tl.where(kept, score, 0.0)
    k = tl.arange(0, TOP_K_PAD)
    weights = tl.zeros([TOP_K_PAD], dtype=tl.float32)
    ids = tl.zeros([TOP_K_PAD], dtype=tl.int32)
    for i in tl.static_range(TOP_K):
        top = tl.max(choice, axis=0)
        j = tl.min(tl.where(choice == top, e, BLOCK_E), axis=0)
        w = tl.sum(tl.where(e == j, score, 0.0), axis=0)
        weights = tl.where(k == i, w, weights)
        ids = tl.where(k == i, j, ids)
        choice = tl.where(e == j, _NEG, choice)
    if RENORM:
        if MODE == 2:
            weights = weights / (tl.sum(weights, axis=0) + 1e-20)
        else:
            weights = weights / tl.sum(weights, axis=0)
    tl.store(w_ptr + row * TOP_K + k, weights * scaling, mask=k < TOP_K)
    tl.store(ids_ptr + row * TOP_K + k, ids, mask=k < TOP_K)


def route_triton(router_logits: torch.Tensor, top_k: int, *, mode: str, renormalize: bool = False,
                 n_group: int | None = None, topk_group: int | None = None, correction_bias: torch.Tensor | None = None,
                 routed_scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """mode "softmax" (``softmax_topk``), "v2" (``grouped_topk_v2``: groups when n_group is
    given, i.e. group_limited_greedy) or "v3" (``grouped_topk_v3``). Returns (weights [T,
    top_k] float32, ids [T, top_k] int32)."""
    num_tokens, num_experts = router_logits.shape
    if top_k > num_experts:
        raise ValueError(f"top_k={top_k} exceeds the {num_experts} experts")
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=router_logits.device)
    if num_tokens == 0:
        return weights, ids
    logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
    groups = n_group or 0
    _route_kernel[(num_tokens,)](
        logits, correction_bias if correction_bias is not None else logits, weights, ids, logits.stride(0),
        num_experts, num_experts // groups if groups else 1, float(routed_scaling_factor),
        MODE={"softmax": 0, "v2": 1, "v3": 2}[mode], TOP_K=top_k, GROUPS=groups, TOPK_GROUP=topk_group or 0,
        RENORM=renormalize, HAS_BIAS=correction_bias is not None, BLOCK_E=triton.next_power_of_2(num_experts),
        NG=triton.next_power_of_2(max(groups, 1)), TOP_K_PAD=triton.next_power_of_2(top_k),
    )
    return weights, ids
