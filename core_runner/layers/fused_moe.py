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

Across the tensor-parallel ranks (``core_runner.distributed``) the experts are split one
of two ways, and either way each rank computes a partial sum of the output:

- tensor parallel (the default when tp > 1): every rank holds every expert with 1/tp of
  its intermediate dimension, rows [r I/tp, (r+1) I/tp) of gate and of up and the same
  columns of down. silu(gate) * up is elementwise in that dimension, so rank r's down
  product is the sum over its slice of the intermediate units.
- expert parallel (``expert_parallel_enabled()``, the engine's enable_expert_parallel):
  rank r holds experts [r E/tp, (r+1) E/tp) whole; a (token, expert) pair routed to
  another rank's expert contributes nothing here. Routing must then be identical on
  every rank (a replicated router over replicated hidden states gives that).

``reduce_results=True`` all-reduces the partial sums; with False the caller does, e.g.
after adding a shared expert's own partial sum so that one all-reduce serves both.
Parameters hold the rank's part: w13 [E_local, 2 I_local, H], w2 [E_local, H, I_local].
Shard ids keep global expert ids: the loader skips other ranks' experts, and
``param.shard_ids`` lists this rank's only, so loading requires exactly those.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core_runner.distributed import (
    divide,
    expert_parallel_enabled,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from core_runner.layers.linear import copy_into


def fused_moe_ref(
    hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """Loop over experts; float32 accumulation of the weighted expert outputs. Ids outside
    [0, E) (an expert-parallel layer marks other ranks' experts -1) contribute nothing."""
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
    """One stacked parameter ``weight`` [len(experts), parts * rows, cols]: this rank's
    experts (global ids ``experts``), each the concatenation of its ``shards`` parts.

    ``part_shape`` is one part's checkpoint shape (an expert's gate, up or down matrix);
    tensor parallelism keeps 1/``tp_parts`` of its ``split_dim`` (0: gate/up rows, 1:
    down columns), the slice of ``tp_rank``."""

    def __init__(self, num_experts: int, experts: range, part_shape: tuple[int, int], shards: tuple[str, ...],
                 split_dim: int, tp_rank: int, tp_parts: int) -> None:
        super().__init__()
        self.num_experts, self.experts, self.shards = num_experts, experts, shards
        self.part_shape, self.split_dim, self.tp_rank, self.tp_parts = part_shape, split_dim, tp_rank, tp_parts
        local = list(part_shape)
        local[split_dim] //= tp_parts
        self.local_part = tuple(local)
        self.shard_rows = local[0]
        self.weight = nn.Parameter(torch.empty(len(experts), local[0] * len(shards), local[1]), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        # the loader requires every (expert, part) slice of this rank's experts (or the
        # whole stacked tensor); other ranks' expert tensors are skipped, not required
        self.weight.shard_ids = tuple((e, s) for e in experts for s in shards)

    def _split(self, loaded, dim: int):
        """This rank's tensor-parallel slice of ``loaded`` along ``dim``."""
        if self.tp_parts == 1:
            return loaded
        n = self.local_part[self.split_dim]
        return loaded.narrow(dim, self.tp_rank * n, n)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        if shard_id is None:  # an already stacked tensor of every expert
            rows, cols = self.part_shape
            full = (self.num_experts, rows * len(self.shards), cols)
            if tuple(loaded.shape) != full:
                raise ValueError(f"stacked expert tensor has shape {tuple(loaded.shape)}, expected {full}")
            if len(self.experts) != self.num_experts:
                loaded = loaded.narrow(0, self.experts.start, len(self.experts))
            for i, part in enumerate(self.shards):
                src = self._split(loaded.narrow(1, i * rows, rows), self.split_dim + 1)
                copy_into(param.data.narrow(1, i * self.shard_rows, self.shard_rows), src,
                          f"stacked experts, part {part!r}")
            return
        if (not isinstance(shard_id, tuple) or len(shard_id) != 2 or shard_id[1] not in self.shards
                or not 0 <= int(shard_id[0]) < self.num_experts):
            raise ValueError(f"expert shard {shard_id!r} is invalid: expected (0..{self.num_experts - 1}, "
                             f"one of {self.shards})")
        e, part = int(shard_id[0]), self.shards.index(shard_id[1])
        if e not in self.experts:
            return  # another rank's expert (expert parallel)
        what = f"expert {e} {shard_id[1]}"
        if tuple(loaded.shape) != self.part_shape:
            raise ValueError(f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, expected {self.part_shape}")
        dst = param.data[e - self.experts.start].narrow(0, part * self.shard_rows, self.shard_rows)
        copy_into(dst, self._split(loaded, self.split_dim), what)


class FusedMoE(nn.Module):
    """Routed experts (SiLU-gated MLPs) with stacked weights; see the module docstring.

    ``num_experts`` / ``intermediate_size`` are the checkpoint's (global) sizes. ``impl``
    picks the kernel ("auto": Triton where the step runs Triton kernels).
    ``reduce_results`` (used with tp > 1): all-reduce the ranks' partial sums here
    (True), or return this rank's partial sum for the caller to reduce (False). Under
    expert parallelism ``num_experts`` must divide by tp (ValueError naming it);
    otherwise ``intermediate_size`` must."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, impl: str = "auto",
                 reduce_results: bool = True) -> None:
        super().__init__()
        if impl not in ("auto", "torch", "triton"):
            raise ValueError(f"impl={impl!r} is invalid: expected 'auto', 'torch' or 'triton'")
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.impl, self.reduce_results = impl, reduce_results
        self.tp_size, self.tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.expert_parallel = expert_parallel_enabled()
        if self.expert_parallel:
            self.local_num_experts = divide(num_experts, self.tp_size, "num_experts")
            self.intermediate_size_per_partition, tp_parts = intermediate_size, 1
        else:
            self.local_num_experts = num_experts
            self.intermediate_size_per_partition = divide(intermediate_size, self.tp_size, "moe_intermediate_size")
            tp_parts = self.tp_size
        self.expert_start = self.tp_rank * self.local_num_experts if self.expert_parallel else 0
        experts = range(self.expert_start, self.expert_start + self.local_num_experts)
        self.w13 = _StackedExpertWeight(num_experts, experts, (intermediate_size, hidden_size), ("gate", "up"),
                                        0, self.tp_rank, tp_parts)
        self.w2 = _StackedExpertWeight(num_experts, experts, (hidden_size, intermediate_size), ("down",),
                                       1, self.tp_rank, tp_parts)

    def _use_triton(self, hidden: torch.Tensor) -> bool:
        if self.impl != "auto":
            return self.impl == "triton"
        from core_runner.forward_context import use_triton_kernels

        return use_triton_kernels(hidden)

    def local_expert_ids(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """Global expert ids -> this rank's stacked index, -1 for another rank's expert."""
        if not self.expert_parallel:
            return topk_ids
        local = topk_ids - self.expert_start
        return torch.where((local >= 0) & (local < self.local_num_experts), local, -1)

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        ids = self.local_expert_ids(topk_ids)
        if self._use_triton(hidden):
            from core_runner.kernels.fused_moe_triton import fused_moe_triton

            out = fused_moe_triton(hidden, self.w13.weight, self.w2.weight, topk_weights, ids,
                                   skip_invalid_ids=self.expert_parallel)
        else:
            out = fused_moe_ref(hidden, self.w13.weight, self.w2.weight, topk_weights, ids)
        if self.reduce_results and self.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        return out
