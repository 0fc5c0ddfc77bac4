"""Block-scaled fp8 weights in DeepSeek-V3's checkpoint format.

A quantized Linear weight ``W`` [out, in] is stored as float8_e4m3fn beside
``W_scale_inv`` (``<prefix>.weight_scale_inv``), float32 [ceil(out/b0), ceil(in/b1)]
for ``weight_block_size = [b0, b1]``. The real weight is

    W[i, j] = float(W_fp8[i, j]) * scale_inv[i // b0, j // b1]

so the last row / column block may be partial. A region of the weight (a tensor-parallel
rank's rows or columns) needs only the scale blocks that overlap it: rows
``start // b0 .. ceil(stop / b0)`` (columns likewise), expanded and cropped by the
region's offset inside its first block, so a region need not align to blocks.
Modules DeepSeek leaves unquantized
(embeddings, norms, the router gate, lm_head) have no scale tensor and load as they are.
Leading dims (stacked experts [E, out, in] with scales [E, ., .]) are allowed.
"""
from __future__ import annotations

from typing import Any

import torch

from core_runner.quantization.base import Bounds, Lookup, Quantization, RegionLookup

FP8_MAX = 448.0  # largest finite float8_e4m3fn
SCALE_SUFFIX = "_scale_inv"


def _check_block(block: Any) -> tuple[int, int]:
    if (not isinstance(block, (list, tuple)) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise ValueError(
            f"quantization_config.weight_block_size={block!r} is invalid: expected two positive ints [b0, b1] "
            "(DeepSeek-V3 uses [128, 128]); per-tensor fp8 (no weight_block_size) is not supported"
        )
    return int(block[0]), int(block[1])


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def expected_scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    return (*shape[:-2], _cdiv(shape[-2], block[0]), _cdiv(shape[-1], block[1]))


def expand_block_scale(scale: torch.Tensor, shape: tuple[int, ...], block: tuple[int, int],
                       offset: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """Per-block scales [..., nb0, nb1] broadcast to one float32 value per element of ``shape``.
    ``offset`` is where that region starts in the weight's last two dims when ``scale`` holds
    only the blocks overlapping it (``scale_bounds``): the first block may start before it."""
    r0, c0 = offset[0] % block[0], offset[1] % block[1]
    s = scale.float().repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)
    return s[..., r0: r0 + shape[-2], c0: c0 + shape[-1]]


def scale_bounds(bounds: Bounds, block: tuple[int, int]) -> Bounds:
    """The blocks of the scale tensor that cover region ``bounds`` of its weight (leading
    dims, e.g. experts, are taken as they are)."""
    (r0, r1), (c0, c1) = bounds[-2], bounds[-1]
    rows = (r0 // block[0], max(r0 // block[0], _cdiv(r1, block[0])))
    cols = (c0 // block[1], max(c0 // block[1], _cdiv(c1, block[1])))
    return (*bounds[:-2], rows, cols)


def check_scale_shape(name: str, shape: tuple[int, ...], scale_shape: tuple[int, ...], block: tuple[int, int]) -> None:
    """ValueError unless a weight of ``shape`` can carry block scales of ``scale_shape``."""
    if len(shape) < 2:
        raise ValueError(f"{name!r}: a block-quantized weight needs >= 2 dims, got shape {tuple(shape)}")
    want = expected_scale_shape(tuple(shape), block)
    if tuple(scale_shape) != want:
        raise ValueError(
            f"{name!r}: scale tensor has shape {tuple(scale_shape)}, but weight shape {tuple(shape)} with "
            f"weight_block_size {list(block)} needs {want} (ceil(out/{block[0]}), ceil(in/{block[1]}))"
        )


def dequantize_fp8_block(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                         dtype: torch.dtype = torch.float32, name: str = "weight") -> torch.Tensor:
    """float(weight) * scale per [b0, b1] block, computed in float32 and rounded once to ``dtype``."""
    check_scale_shape(name, tuple(weight.shape), tuple(scale.shape), block)
    return (weight.float() * expand_block_scale(scale, tuple(weight.shape), block)).to(dtype)


def quantize_fp8_block(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse used to write fp8 checkpoints: per block scale_inv = amax / 448 and
    W_fp8 = W / scale_inv rounded to float8_e4m3fn. Returns (W_fp8, scale_inv float32)."""
    b0, b1 = block
    *lead, rows, cols = weight.shape
    w = weight.float()
    padded = torch.zeros(*lead, _cdiv(rows, b0) * b0, _cdiv(cols, b1) * b1, dtype=torch.float32,
                         device=weight.device)
    padded[..., :rows, :cols] = w
    tiles = padded.unflatten(-1, (-1, b1)).unflatten(-3, (-1, b0))  # [..., nb0, b0, nb1, b1]
    # an all-zero block gets a tiny scale rather than 0 (0 / 0 would store NaNs)
    scale = tiles.abs().amax(dim=(-3, -1)).clamp(min=1e-12) / FP8_MAX
    q = (w / expand_block_scale(scale, tuple(w.shape), block)).clamp(-FP8_MAX, FP8_MAX)
    return q.to(torch.float8_e4m3fn), scale


class Fp8BlockQuantization(Quantization):
    """quant_method 'fp8', fmt 'e4m3', dynamic activations, block-scaled weights.

    Layers of ``core_runner.layers`` that can hold fp8 keep the weights and their block
    scales as they are (``resident_scale``: the scale blocks of a block-aligned region);
    every other module gets its weights dequantized at load (``prepare`` /
    ``dequantize_region``). The GPU matmul is ``core_runner/kernels/fp8_block_matmul_triton.py``.
    """

    method = "fp8"

    def __init__(self, block: tuple[int, int]) -> None:
        self.block = _check_block(list(block))
        self.resident_block = self.block

    def resident_scale(self, name: str, bounds: Bounds, scale_name: str, lookup: RegionLookup) -> torch.Tensor:
        shape = lookup.shape(name)
        for dim, ((a, b), n, blk) in enumerate(zip(bounds[-2:], shape[-2:], self.block, strict=True)):
            if a % blk or (b % blk and b != n):
                raise ValueError(
                    f"{name!r}: the region [{a}, {b}) of dim {dim} (of {n}) does not align to weight_block_size "
                    f"{list(self.block)}, so it cannot keep its own fp8 block scales: a tensor-parallel split or "
                    f"fused-shard offset must be a multiple of {blk} (pick a tensor_parallel_size that keeps it so)")
        return lookup.read(scale_name, scale_bounds(bounds, self.block)).float()

    @classmethod
    def from_config(cls, qc: dict) -> Fp8BlockQuantization:
        # HF's FineGrainedFP8Config writes no 'fmt'; e4m3 is then the only meaning
        fmt = qc.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ValueError(f"quantization_config.fmt={fmt!r} is not supported for quant_method 'fp8': "
                             "expected 'e4m3' (float8_e4m3fn weights)")
        act = qc.get("activation_scheme", "dynamic")
        if act != "dynamic":
            raise ValueError(f"quantization_config.activation_scheme={act!r} is not supported for quant_method "
                             "'fp8': expected 'dynamic' (static activation scales are not loaded)")
        if "weight_block_size" not in qc or qc["weight_block_size"] is None:
            raise ValueError("quantization_config has quant_method 'fp8' but no weight_block_size: expected "
                             "block-scaled weights, e.g. weight_block_size [128, 128] (per-tensor fp8 is not "
                             "supported)")
        fmt_scale = qc.get("scale_fmt")
        if fmt_scale not in (None, "ue8m0"):
            raise ValueError(f"quantization_config.scale_fmt={fmt_scale!r} is not supported: expected none "
                             "(float32 scales) or 'ue8m0'")
        return cls(_check_block(qc["weight_block_size"]))

    def is_auxiliary(self, name: str) -> bool:
        return name.endswith(SCALE_SUFFIX)

    def scale_name(self, weight_name: str) -> str:
        return weight_name + SCALE_SUFFIX

    def dequantize(self, name: str, tensor: torch.Tensor, scale: torch.Tensor,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_fp8_block(tensor, scale, self.block, dtype, name)

    def _paired(self, name: str, dtype: torch.dtype, has_scale: bool) -> bool:
        """Whether ``name`` is dequantized; ValueError for an fp8 tensor without a scale or a
        scale beside a tensor that is not fp8."""
        scale_name = self.scale_name(name)
        is_fp8 = dtype == torch.float8_e4m3fn
        if is_fp8 and not has_scale:
            raise ValueError(
                f"checkpoint tensor {name!r} is float8_e4m3fn but its scale {scale_name!r} is not in the "
                "checkpoint: every fp8 weight needs its block scales (weight_scale_inv)"
            )
        if has_scale and not is_fp8:
            raise ValueError(
                f"checkpoint tensor {name!r} has a scale {scale_name!r} but dtype {dtype}: "
                "expected float8_e4m3fn for a block-quantized weight"
            )
        return has_scale

    def _may_have_scale(self, name: str, dtype: torch.dtype) -> bool:
        # a lookup per bias and norm would be wasted: only fp8 tensors and '.weight's can carry scales
        return dtype == torch.float8_e4m3fn or name.endswith(".weight")

    def prepare(self, name: str, tensor: torch.Tensor, lookup: Lookup, dtype: torch.dtype) -> torch.Tensor:
        scale = lookup(self.scale_name(name)) if self._may_have_scale(name, tensor.dtype) else None
        if not self._paired(name, tensor.dtype, scale is not None):
            return tensor
        return self.dequantize(name, tensor, scale, dtype)

    def scale_for(self, name: str, dtype: torch.dtype, shape: tuple[int, ...], lookup: RegionLookup) -> str | None:
        scale_name = self.scale_name(name)
        scale_shape = lookup.shape(scale_name) if self._may_have_scale(name, dtype) else None
        if not self._paired(name, dtype, scale_shape is not None):
            return None
        check_scale_shape(name, shape, scale_shape, self.block)
        return scale_name

    def dequantize_region(self, name: str, tensor: torch.Tensor, bounds: Bounds, scale_name: str,
                          lookup: RegionLookup, dtype: torch.dtype) -> torch.Tensor:
        scale = lookup.read(scale_name, scale_bounds(bounds, self.block))
        offset = (bounds[-2][0], bounds[-1][0])
        return (tensor.float() * expand_block_scale(scale, tuple(tensor.shape), self.block, offset)).to(dtype)
