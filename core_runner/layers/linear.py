"""Linear layers whose parameters know how to load their checkpoint tensors, each split
across the tensor-parallel ranks the way vLLM splits it.

Column-parallel layers keep 1/tp of the output rows (``ColumnParallelLinear``, the fused
``MergedColumnParallelLinear`` and ``QKVParallelLinear``); ``RowParallelLinear`` keeps
1/tp of the input columns and all-reduces its output. With one rank (the default) every
layer holds its whole weight and runs no collective, so a plugin written with these
classes runs unchanged with and without tensor parallelism. ``Linear`` (=
``ReplicatedLinear``) is whole on every rank.

Fused layers (q/k/v in one matrix, gate/up in one matrix) load each checkpoint tensor
into its slice through ``weight_loader(param, tensor, shard_id)``; the loader finds
which shard a checkpoint name belongs to through the model's ``packed_modules_mapping``.
A fused parameter lists its shard ids in ``param.shard_ids``: the loader requires every
one of them (or the whole tensor) to be loaded.

Built for an fp8 checkpoint (``core_runner.quantization``), every layer here keeps its
weight as float8_e4m3fn with a ``weight_scale_inv`` block grid and multiplies with the
W8A8 Triton kernel (dequantizing per call on the torch path): ``core_runner.layers.fp8_weight``.
``quantized=False`` keeps a layer dense (the checkpoint's fp8 weight dequantized at load),
for a weight used outside the layer's own forward (MLA's absorbed kv_b_proj). A subclass
that overrides ``weight_loader`` is kept dense too: its loader does not know the scales.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core_runner.distributed import (
    divide,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
)
from core_runner.distributed import tensor_model_parallel_all_reduce as all_reduce
from core_runner.layers.fp8_weight import _fp8_linear, _load_rows, _make_fp8_resident, is_fp8


def materialize(loaded) -> torch.Tensor:
    """A checkpoint tensor as a torch tensor: the loader may hand a lazy slice (anything
    with ``narrow`` and ``load()``) so that a rank reads only its part of the file."""
    return loaded if isinstance(loaded, torch.Tensor) else loaded.load()


def copy_into(dst: torch.Tensor, loaded, what: str = "checkpoint tensor") -> None:
    """Copy ``loaded`` (a tensor or lazy slice) into ``dst``, cast to its dtype; ValueError on
    a shape mismatch (checked before anything is read)."""
    if tuple(dst.shape) != tuple(loaded.shape):
        raise ValueError(f"{what} has shape {tuple(loaded.shape)}, expected {tuple(dst.shape)}")
    dst.copy_(materialize(loaded).to(dst.dtype))


def default_weight_loader(param: nn.Parameter, loaded, shard_id: object = None) -> None:
    """Copy a checkpoint tensor into an unfused, unsplit parameter (cast to its dtype);
    raises ValueError on a shape mismatch or a shard id (only fused parameters take shards)."""
    if shard_id is not None:
        raise ValueError(f"parameter of shape {tuple(param.shape)} is not fused; got shard {shard_id!r}")
    if tuple(param.shape) != tuple(loaded.shape):
        raise ValueError(f"checkpoint tensor has shape {tuple(loaded.shape)}, parameter expects {tuple(param.shape)}")
    param.data.copy_(materialize(loaded).to(param.dtype))


class Linear(nn.Module):
    """y = x W^T (+ b): ``forward(x [..., in_features]) -> [..., out_features]``, the whole
    weight on every rank. Its parameters carry ``weight_loader``, which split and fused
    subclasses override to load their slices. ``quantized=False``: stay dense when built for
    an fp8 checkpoint (module docstring)."""
    def __init__(self, in_features: int, out_features: int, bias: bool = False, quantized: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)
        self.fp8_block = None
        if quantized and getattr(type(self).weight_loader, "fp8_aware", False):
            _make_fp8_resident(self, self.weight)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        if shard_id is not None or param.dim() != 2:
            return default_weight_loader(param, loaded, shard_id)
        if tuple(param.shape) != tuple(loaded.shape):
            raise ValueError(f"checkpoint tensor has shape {tuple(loaded.shape)}, parameter expects "
                             f"{tuple(param.shape)}")
        _load_rows(self, param, 0, param.shape[0], loaded, "checkpoint tensor")

    weight_loader.fp8_aware = True

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x W^T (+ bias) with this rank's weight, fp8 or dense."""
        return _fp8_linear(self, x, bias) if is_fp8(self) else F.linear(x, self.weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


ReplicatedLinear = Linear


def _check_whole(loaded, want: tuple[int, ...]) -> None:
    """A split layer's checkpoint tensor must have the whole layer's shape: a rank that
    only narrowed it would silently load part of a larger (wrong) tensor."""
    if tuple(loaded.shape) != tuple(want):
        raise ValueError(f"checkpoint tensor has shape {tuple(loaded.shape)}, expected {tuple(want)}")


class ColumnParallelLinear(Linear):
    """Output rows split across ranks: rank r holds rows [r * out/tp, (r + 1) * out/tp) of
    the weight (and bias) and returns its part of the output, [..., out/tp]; with
    ``gather_output`` the ranks' parts are gathered into [..., out]."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, gather_output: bool = False,
                 quantized: bool = True) -> None:
        self.tp_size, self.tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.output_size = output_size
        self.output_size_per_partition = divide(output_size, self.tp_size, "output size")
        self.gather_output = gather_output
        super().__init__(input_size, self.output_size_per_partition, bias, quantized)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        if shard_id is not None:
            raise ValueError(f"parameter of shape {tuple(param.shape)} is not fused; got shard {shard_id!r}")
        n = param.shape[0]
        _check_whole(loaded, (n * self.tp_size, *param.shape[1:]))
        src = loaded.narrow(0, self.tp_rank * n, n) if self.tp_size > 1 else loaded
        if param.dim() == 1:
            return copy_into(param.data, src, f"checkpoint tensor (rank {self.tp_rank}'s rows)")
        _load_rows(self, param, 0, n, src, f"checkpoint tensor (rank {self.tp_rank}'s rows)")

    weight_loader.fp8_aware = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x, self.bias)
        if self.gather_output and self.tp_size > 1:
            y = tensor_model_parallel_all_gather(y, dim=-1)
        return y


class RowParallelLinear(Linear):
    """Input columns split across ranks: rank r holds columns [r * in/tp, (r + 1) * in/tp)
    and takes the matching part of x ([..., in/tp], as a column-parallel layer leaves it);
    the partial products are summed over the ranks (``reduce_results``) and the bias,
    whole on every rank, is added once after the sum."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True,
                 quantized: bool = True) -> None:
        self.tp_size, self.tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.input_size = input_size
        self.input_size_per_partition = divide(input_size, self.tp_size, "input size")
        self.reduce_results = reduce_results
        super().__init__(self.input_size_per_partition, output_size, bias, quantized)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        if shard_id is not None:
            raise ValueError(f"parameter of shape {tuple(param.shape)} is not fused; got shard {shard_id!r}")
        if param.dim() == 1:  # the bias is whole on every rank
            return copy_into(param.data, loaded)
        if self.tp_size == 1:
            return _load_rows(self, param, 0, param.shape[0], loaded, "checkpoint tensor")
        n = param.shape[1]
        _check_whole(loaded, (param.shape[0], n * self.tp_size))
        _load_rows(self, param, 0, param.shape[0], loaded.narrow(1, self.tp_rank * n, n),
                  f"checkpoint tensor (rank {self.tp_rank}'s columns)")

    weight_loader.fp8_aware = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.matmul(x, self.bias)
        y = self.matmul(x, None)
        if self.reduce_results:
            y = all_reduce(y)
        return y if self.bias is None else y + self.bias


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs stacked in one matrix (gate and up): shard i is
    ``output_sizes[i]`` rows in the checkpoint, of which each rank holds 1/tp; the
    rank's matrix stacks its parts of every shard, so its output is [..., sum/tp]."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False, quantized: bool = True) -> None:
        tp = get_tensor_model_parallel_world_size()
        self.output_sizes = list(output_sizes)
        self.local_sizes = [divide(s, tp, f"output size of part {i}") for i, s in enumerate(output_sizes)]
        self.offsets = [sum(self.local_sizes[:i]) for i in range(len(self.local_sizes))]
        super().__init__(input_size, sum(output_sizes), bias, quantized=quantized)
        for p in (self.weight, self.bias):
            if p is not None:
                p.shard_ids = self.part_ids()

    def part_ids(self) -> tuple:
        return tuple(range(len(self.output_sizes)))

    def shard_index(self, shard_id: object) -> int:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"shard {shard_id!r} is invalid: expected 0..{len(self.output_sizes) - 1}")
        return shard_id

    def part_rows(self, i: int) -> tuple[int, int]:
        """(first row, rows) of this rank's slice of checkpoint shard ``i``."""
        return self.tp_rank * self.local_sizes[i], self.local_sizes[i]

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        if shard_id is None:  # the whole fused matrix: take each part's slice
            if loaded.shape[0] != sum(self.output_sizes):
                raise ValueError(f"checkpoint tensor has {loaded.shape[0]} rows, expected {sum(self.output_sizes)}")
            start = 0
            for i, size in enumerate(self.output_sizes):
                self._load_part(param, loaded.narrow(0, start, size), i)
                start += size
            return
        self._load_part(param, loaded, self.shard_index(shard_id))

    weight_loader.fp8_aware = True

    def _load_part(self, param: nn.Parameter, loaded, i: int) -> None:
        want = (self.output_sizes[i], *param.shape[1:])
        if tuple(loaded.shape) != want:
            raise ValueError(f"shard {self.part_ids()[i]!r}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                             f"expected {want}")
        first, rows = self.part_rows(i)
        if param.dim() == 1:
            return copy_into(param.data.narrow(0, self.offsets[i], self.local_sizes[i]),
                             loaded.narrow(0, first, rows), f"shard {self.part_ids()[i]!r}")
        _load_rows(self, param, self.offsets[i], self.local_sizes[i], loaded.narrow(0, first, rows),
                  f"shard {self.part_ids()[i]!r}")


def check_head_split(num_heads: int, num_kv_heads: int) -> None:
    """ValueError naming the config field when the tensor-parallel size does not split the
    heads: it must divide num_attention_heads, and divide num_key_value_heads or be a
    multiple of it (then each KV head is replicated over tp / kv ranks). A model calls it
    before building ``QKVParallelLinear``, so the error names the config's fields."""
    tp = get_tensor_model_parallel_world_size()
    divide(num_heads, tp, "num_attention_heads")
    if tp <= num_kv_heads:
        divide(num_kv_heads, tp, "num_key_value_heads")
    elif tp % num_kv_heads:
        raise ValueError(f"tensor_parallel_size={tp} is not divisible by num_key_value_heads={num_kv_heads}: with "
                         "more ranks than KV heads each one is replicated over tp / num_key_value_heads ranks; pick "
                         f"a tensor_parallel_size that divides {num_kv_heads} or is a multiple of it")


class QKVParallelLinear(MergedColumnParallelLinear):
    """q, k and v projections in one matrix, split by heads; shards "q", "k", "v".

    Each rank keeps ``total_num_heads / tp`` query heads. With ``tp`` at most the KV head
    count each rank keeps ``total_num_kv_heads / tp`` of them; with more ranks than KV
    heads each rank keeps one, replicated over ``tp / total_num_kv_heads`` ranks (rank r
    holds KV head ``r * kv / tp``), so every query head still meets its own KV head.
    ``num_heads`` / ``num_kv_heads`` are the rank's counts."""

    def __init__(
        self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int | None = None,
        bias: bool = False, quantized: bool = True,
    ) -> None:
        tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        kv = total_num_kv_heads or total_num_heads
        self.head_size, self.total_num_heads, self.total_num_kv_heads = head_size, total_num_heads, kv
        self.num_heads = divide(total_num_heads, tp, "num_attention_heads")
        if tp >= kv:
            if tp % kv:
                raise ValueError(f"tensor_parallel_size={tp} is more than num_key_value_heads={kv} and not divisible "
                                 "by it (each KV head is replicated over tensor_parallel_size / num_key_value_heads "
                                 "ranks); pick a tensor_parallel_size that divides or is a multiple of it")
            self.num_kv_heads, self.kv_head_start = 1, rank * kv // tp
        else:
            self.num_kv_heads = divide(kv, tp, "num_key_value_heads")
            self.kv_head_start = rank * self.num_kv_heads
        # the parent splits each part by tp; give it the per-rank sizes times tp
        q, k = self.num_heads * head_size, self.num_kv_heads * head_size
        super().__init__(hidden_size, [q * tp, k * tp, k * tp], bias, quantized)
        self.output_sizes = [total_num_heads * head_size, kv * head_size, kv * head_size]

    def part_ids(self) -> tuple:
        return ("q", "k", "v")

    def shard_index(self, shard_id: object) -> int:
        names = {"q": 0, "k": 1, "v": 2}
        if shard_id not in names:
            raise ValueError(f"shard {shard_id!r} is invalid: expected one of 'q', 'k', 'v'")
        return names[shard_id]

    def part_rows(self, i: int) -> tuple[int, int]:
        if i == 0:
            return self.tp_rank * self.local_sizes[0], self.local_sizes[0]
        return self.kv_head_start * self.head_size, self.local_sizes[i]


# the names plugins used before the layers were split across ranks
MergedLinear = MergedColumnParallelLinear
QKVLinear = QKVParallelLinear
