"""Linear layers whose parameters know how to load their checkpoint tensors.

Fused layers (q/k/v in one matrix, gate/up in one matrix) load each checkpoint tensor
into its slice through ``weight_loader(param, tensor, shard_id)``; the loader finds
which shard a checkpoint name belongs to through the model's ``packed_modules_mapping``.
A fused parameter lists its shard ids in ``param.shard_ids``: the loader requires every
one of them (or the whole tensor) to be loaded.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
    """Copy a checkpoint tensor into an unfused parameter (cast to its dtype); raises
    ValueError on a shape mismatch or a shard id (only fused parameters take shards)."""
    if shard_id is not None:
        raise ValueError(f"parameter of shape {tuple(param.shape)} is not fused; got shard {shard_id!r}")
    if param.shape != loaded.shape:
        raise ValueError(f"checkpoint tensor has shape {tuple(loaded.shape)}, parameter expects {tuple(param.shape)}")
    param.data.copy_(loaded.to(param.dtype))


class Linear(nn.Module):
    """y = x W^T (+ b): ``forward(x [..., in_features]) -> [..., out_features]``. Its
    parameters carry ``weight_loader``, which fused subclasses override to load slices."""
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        default_weight_loader(param, loaded, shard_id)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several output blocks stacked in one matrix; shard i is ``output_sizes[i]`` rows."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False) -> None:
        super().__init__(in_features, sum(output_sizes), bias)
        self.offsets = [sum(output_sizes[:i]) for i in range(len(output_sizes))]
        self.output_sizes = list(output_sizes)
        for p in (self.weight, self.bias):
            if p is not None:
                p.shard_ids = self.part_ids()

    def part_ids(self) -> tuple:
        return tuple(range(len(self.output_sizes)))

    def shard_index(self, shard_id: object) -> int:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"shard {shard_id!r} is invalid: expected 0..{len(self.output_sizes) - 1}")
        return shard_id

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        if shard_id is None:
            return default_weight_loader(param, loaded)
        i = self.shard_index(shard_id)
        rows = param.data.narrow(0, self.offsets[i], self.output_sizes[i])
        if rows.shape != loaded.shape:
            raise ValueError(
                f"shard {shard_id!r}: checkpoint tensor has shape {tuple(loaded.shape)}, expected {tuple(rows.shape)}"
            )
        rows.copy_(loaded.to(param.dtype))


class QKVLinear(MergedLinear):
    """q, k and v projections in one matrix; shards are named "q", "k", "v"."""

    def __init__(self, hidden: int, head_size: int, num_heads: int, num_kv_heads: int, bias: bool = False) -> None:
        super().__init__(hidden, [num_heads * head_size, num_kv_heads * head_size, num_kv_heads * head_size], bias)

    def part_ids(self) -> tuple:
        return ("q", "k", "v")

    def shard_index(self, shard_id: object) -> int:
        names = {"q": 0, "k": 1, "v": 2}
        if shard_id not in names:
            raise ValueError(f"shard {shard_id!r} is invalid: expected one of 'q', 'k', 'v'")
        return names[shard_id]
