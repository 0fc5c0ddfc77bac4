"""fp8 weights kept resident in a layer: allocation, loading by block-aligned rows, and the matmul.

A layer built for a quantized checkpoint (``core_runner.quantization.construction``) holds
its ``weight`` as float8_e4m3fn and, beside it, the float32 buffer ``weight_scale_inv``
on the format's grid ``fp8_block = [b0, b1]`` (one value per b0 rows x b1 columns, the
last block possibly partial): ``W[i, j] = float(W_fp8[i, j]) * weight_scale_inv[i // b0, j // b1]``.
Stacked experts carry a leading expert dim on both.

Loading: a part of a fused weight (q/k/v, gate/up) lands at its row offset, which must be
a multiple of b0 (and so must a tensor-parallel rank's first row or column of the
checkpoint tensor: ``resident_scale`` checks that side). Where a split cannot align (a
40-wide expert split 4 ways over 16-wide blocks) the layer cannot keep its own scales: it
goes dense (dequantized at load, its weight in the model's dtype) with a warning naming
the layer, the rows and the block, rather than refusing a checkpoint that loads.
A checkpoint tensor that is not quantized (a router, an ``ignore``d module, or any
tensor handed over whole by a ``transform``) turns the layer back into a dense one of the
model's dtype, dequantizing what it already holds.

Matmul (``_fp8_linear``): where the step runs Triton kernels the W8A8 kernel
(``kernels/fp8_block_matmul_triton``: activations quantized per token and group of b1 on
the fly); elsewhere (CPU, the torch kernels) the weight is dequantized per call in the
activations' dtype, so the CPU tests compute with exactly the checkpoint's values.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from core_runner.quantization.construction import resident_fp8_block
from core_runner.quantization.fp8 import expand_block_scale, expected_scale_shape

logger = logging.getLogger(__name__)
FP8 = torch.float8_e4m3fn
SCALE = "weight_scale_inv"


def _make_fp8_resident(module: nn.Module, param: nn.Parameter) -> bool:
    """Turn ``param`` (module's ``weight``, [..., rows, cols]) into fp8 storage with its scale
    buffer when a quantized model is being built; False (nothing changed) otherwise."""
    block = resident_fp8_block()
    module.fp8_block = block
    if block is None:
        return False
    # the loader reads checkpoint tensors into this dtype (an unquantized tensor, or one that
    # turns the layer dense), never into fp8
    module.dense_dtype = param.dense_dtype = param.dtype
    shape = tuple(param.shape)
    param.data = torch.empty(shape, dtype=FP8, device=param.device)
    module.register_buffer(SCALE, torch.empty(expected_scale_shape(shape, block), dtype=torch.float32,
                                              device=param.device), persistent=False)
    return True


def is_fp8(module: nn.Module) -> bool:
    """Whether the module holds its weight as resident fp8 (with a block scale grid)."""
    return getattr(module, "fp8_block", None) is not None


def dense_weight(module: nn.Module, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The module's weight in ``dtype`` (default: the model's), dequantized when it is fp8."""
    w = module.weight
    if not is_fp8(module):
        return w if dtype is None else w.to(dtype)
    scale = expand_block_scale(getattr(module, SCALE), tuple(w.shape), module.fp8_block)
    return (w.float() * scale).to(dtype or module.dense_dtype)


def _to_dense(module: nn.Module) -> None:
    """Hold the weight in the model's dtype from now on (the checkpoint tensor was not fp8)."""
    if not is_fp8(module):
        return
    module.weight.data = dense_weight(module)
    delattr(module, SCALE)
    module.fp8_block = None


def _load_rows(module: nn.Module, param: nn.Parameter, row0: int, rows: int, loaded, what: str,
              index: int | None = None) -> None:
    """Copy ``loaded`` (a tensor or lazy checkpoint slice, [rows, cols]) into rows
    ``row0 .. row0 + rows`` of ``param`` (of its ``index``-th expert when given), keeping
    fp8 values and scales when both sides are fp8 (see the module docstring)."""
    from core_runner.layers.linear import copy_into

    def dst_of(t: torch.Tensor) -> torch.Tensor:
        t = t if index is None else t[index]
        return t.narrow(0, row0, rows)

    if param is not module.weight or not is_fp8(module) or not getattr(loaded, "is_quantized", False):
        if param is module.weight:
            _to_dense(module)
        return copy_into(dst_of(param.data), loaded, what)
    b0 = module.fp8_block[0]
    total = param.shape[-2]
    dst = dst_of(param.data)
    if tuple(dst.shape) != tuple(loaded.shape):
        raise ValueError(f"{what} has shape {tuple(loaded.shape)}, expected {tuple(dst.shape)}")
    try:
        if row0 % b0 or (rows % b0 and row0 + rows != total):
            raise ValueError(f"{what}: rows [{row0}, {row0 + rows}) of the fp8 weight ({total} rows) do not align to "
                             f"its scale blocks of {b0} rows (weight_block_size {list(module.fp8_block)}): fused "
                             f"parts and tensor-parallel splits must start at multiples of {b0}")
        scale = loaded.load_resident_scale()
    except ValueError as e:
        logger.warning("fp8 weights of %s kept dense (dequantized at load): %s", type(module).__name__, e)
        _to_dense(module)
        return copy_into(dst_of(param.data), loaded, what)
    scales = getattr(module, SCALE)
    scales = scales if index is None else scales[index]
    want = expected_scale_shape(tuple(dst.shape), module.fp8_block)
    if tuple(scale.shape) != want:
        raise ValueError(f"{what}: its scales have shape {tuple(scale.shape)}, expected {want}")
    dst.copy_(loaded.load_stored())
    scales.narrow(0, row0 // b0, want[0]).copy_(scale)


def _fp8_linear(module: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x W^T (+ bias) with the module's resident fp8 weight (see the module docstring)."""
    from core_runner.forward_context import use_triton_kernels

    if use_triton_kernels(x):
        from core_runner.kernels.fp8_block_matmul_triton import fp8_block_linear_triton

        y = fp8_block_linear_triton(x, module.weight, getattr(module, SCALE), module.fp8_block)
        return y if bias is None else y + bias
    return F.linear(x, dense_weight(module, x.dtype), bias)
