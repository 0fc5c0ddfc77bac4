"""The fused MoE layer: routed experts with stacked weights, usable by any plugin.

Weights are stacked per expert: ``w13.weight`` [E, 2I, H] (gate rows, then up rows) and
``w2.weight`` [E, H, I]. Hugging Face checkpoints store one tensor per expert
(``experts.{e}.gate_proj/up_proj/down_proj.weight``); ``expert_packed_mapping`` gives
the entries a model puts in front of its ``packed_modules_mapping`` so that the loader
routes each of them into its slice with the shard id ``(expert, "gate"|"up"|"down")``.

``forward(hidden [T, H], topk_weights [T, k], topk_ids [T, k]) -> [T, H]`` computes
sum_k w_k * down_e(silu(gate_e(x)) * up_e(x)). Routing (the ids and weights) is the
caller's: see ``core_runner.layers.moe_routing``. The torch reference (a loop over the
experts) runs on the CPU / torch backend; the Triton grouped GEMM
(``core_runner.kernels.fused_moe_triton``) runs where the other layers' Triton kernels do
(``forward_context.use_triton_kernels``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_SHARDS = ("gate", "up", "down")


def fused_moe_ref(
    hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """Loop over experts; float32 accumulation of the weighted expert outputs."""
    num_tokens, hidden_size = hidden.shape
    out = torch.zeros((num_tokens, hidden_size), dtype=torch.float32, device=hidden.device)
    ids = topk_ids.long()
    for e in range(w13.shape[0]):
        tok, slot = torch.where(ids == e)
        if tok.numel() == 0:
            continue
        gate, up = F.linear(hidden[tok], w13[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[e])
        out.index_add_(0, tok, y.float() * topk_weights[tok, slot].float().unsqueeze(-1))
    return out.to(hidden.dtype)


def expert_packed_mapping(num_experts: int, prefix: str = "experts") -> dict[str, tuple[str, tuple[int, str]]]:
    """``packed_modules_mapping`` entries for per-expert HF tensors of a FusedMoE named
    ``prefix`` (put them before generic "gate_proj"/"up_proj" entries: first match wins)."""
    mapping: dict[str, tuple[str, tuple[int, str]]] = {}
    for e in range(num_experts):
        mapping[f"{prefix}.{e}.gate_proj"] = (f"{prefix}.w13", (e, "gate"))
        mapping[f"{prefix}.{e}.up_proj"] = (f"{prefix}.w13", (e, "up"))
        mapping[f"{prefix}.{e}.down_proj"] = (f"{prefix}.w2", (e, "down"))
    return mapping


class _StackedExpertWeight(nn.Module):
    """Holds one stacked parameter ``weight`` [E, rows, cols] and loads per-expert slices."""

    def __init__(self, num_experts: int, rows: int, cols: int, shards: tuple[str, ...]) -> None:
        super().__init__()
        self.num_experts, self.shards = num_experts, shards
        self.shard_rows = rows // len(shards)
        self.weight = nn.Parameter(torch.empty(num_experts, rows, cols), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        # the loader requires every (expert, part) slice (or the whole stacked tensor)
        self.weight.shard_ids = tuple((e, s) for e in range(num_experts) for s in shards)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        if shard_id is None:  # an already stacked tensor
            if loaded.shape != param.shape:
                raise ValueError(f"stacked expert tensor has shape {tuple(loaded.shape)}, "
                                 f"expected {tuple(param.shape)}")
            param.data.copy_(loaded.to(param.dtype))
            return
        if (not isinstance(shard_id, tuple) or len(shard_id) != 2 or shard_id[1] not in self.shards
                or not 0 <= int(shard_id[0]) < self.num_experts):
            raise ValueError(f"expert shard {shard_id!r} is invalid: expected (0..{self.num_experts - 1}, "
                             f"one of {self.shards})")
        e, part = int(shard_id[0]), self.shards.index(shard_id[1])
        dst = param.data[e].narrow(0, part * self.shard_rows, self.shard_rows)
        if dst.shape != loaded.shape:
            raise ValueError(f"expert {e} {shard_id[1]}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                             f"expected {tuple(dst.shape)}")
        dst.copy_(loaded.to(param.dtype))


class FusedMoE(nn.Module):
    """Routed experts (SiLU-gated MLPs) with stacked weights; see the module docstring."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, impl: str = "auto") -> None:
        super().__init__()
        if impl not in ("auto", "torch", "triton"):
            raise ValueError(f"impl={impl!r} is invalid: expected 'auto', 'torch' or 'triton'")
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.impl = impl
        self.w13 = _StackedExpertWeight(num_experts, 2 * intermediate_size, hidden_size, ("gate", "up"))
        self.w2 = _StackedExpertWeight(num_experts, hidden_size, intermediate_size, ("down",))

    def _use_triton(self, hidden: torch.Tensor) -> bool:
        if self.impl != "auto":
            return self.impl == "triton"
        from core_runner.forward_context import use_triton_kernels

        return use_triton_kernels(hidden)

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        if self._use_triton(hidden):
            from core_runner.kernels.fused_moe_triton import fused_moe_triton

            return fused_moe_triton(hidden, self.w13.weight, self.w2.weight, topk_weights, topk_ids)
        return fused_moe_ref(hidden, self.w13.weight, self.w2.weight, topk_weights, topk_ids)
