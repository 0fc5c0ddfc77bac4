"""Block-scaled fp8 weights in DeepSeek-V3's checkpoint format.

A quantized Linear weight ``W`` [out, in] is stored as float8_e4m3fn beside
``W_scale_inv`` (``<prefix>.weight_scale_inv``), float32 [ceil(out/b0), ceil(in/b1)]
for ``weight_block_size = [b0, b1]``. The real weight is

    W[i, j] = float(W_fp8[i, j]) * scale_inv[i // b0, j // b1]

so the last row / column block may be partial. Modules DeepSeek leaves unquantized
(embeddings, norms, the router gate, lm_head) have no scale tensor and load as they are.
Leading dims (stacked experts [E, out, in] with scales [E, ., .]) are allowed.
"""
from __future__ import annotations

from typing import Any

import torch

from core_runner.quantization.base import Lookup, Quantization

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


def expand_block_scale(scale: torch.Tensor, shape: tuple[int, ...], block: tuple[int, int]) -> torch.Tensor:
    """Per-block scales [..., nb0, nb1] broadcast to one float32 value per element of ``shape``."""
    s = scale.float().repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)
    return s[..., : shape[-2], : shape[-1]]


def dequantize_fp8_block(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                         dtype: torch.dtype = torch.float32, name: str = "weight") -> torch.Tensor:
    """float(weight) * scale per [b0, b1] block, computed in float32 and rounded once to ``dtype``."""
    if weight.dim() < 2:
        raise ValueError(f"{name!r}: a block-quantized weight needs >= 2 dims, got shape {tuple(weight.shape)}")
    want = expected_scale_shape(tuple(weight.shape), block)
    if tuple(scale.shape) != want:
        raise ValueError(
            f"{name!r}: scale tensor has shape {tuple(scale.shape)}, but weight shape {tuple(weight.shape)} with "
            f"weight_block_size {list(block)} needs {want} (ceil(out/{block[0]}), ceil(in/{block[1]}))"
        )
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

    Dequantizes at load: the parameters hold ``dtype`` weights. A Triton matmul that
    keeps the fp8 weights resident is in ``core_runner/kernels/fp8_block_matmul_triton.py``.
    """

    method = "fp8"

    def __init__(self, block: tuple[int, int]) -> None:
        self.block = _check_block(list(block))

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

    def prepare(self, name: str, tensor: torch.Tensor, lookup: Lookup, dtype: torch.dtype) -> torch.Tensor:
        scale_name = self.scale_name(name)
        is_fp8 = tensor.dtype == torch.float8_e4m3fn
        scale = lookup(scale_name) if is_fp8 or name.endswith(".weight") else None
        if is_fp8 and scale is None:
            raise ValueError(
                f"checkpoint tensor {name!r} is float8_e4m3fn but its scale {scale_name!r} is not in the "
                "checkpoint: every fp8 weight needs its block scales (weight_scale_inv)"
            )
        if scale is None:
            return tensor
        if not is_fp8:
            raise ValueError(
                f"checkpoint tensor {name!r} has a scale {scale_name!r} but dtype {tensor.dtype}: "
                "expected float8_e4m3fn for a block-quantized weight"
            )
        return self.dequantize(name, tensor, scale, dtype)
