"""Torch reference of the fp8 fused MoE (twin of ``kernels.fused_moe_fp8_triton``).

The bf16 reference (``fused_moe_ref``) run on dequantized operands, with the kernel's two
activation quantizations in place: the hidden states quantized per token and group of
b1 (``per_token_group_quant_fp8_ref``) and dequantized, and likewise each expert's
activation before its down product. Everything is float32, so against the kernel in
float32 the only differences are summation order (the tests' tight tolerance); in bf16
the kernel also rounds gate_up to bf16 before the activation.

Tests use it; the layer's torch path does not quantize activations: it dequantizes the
weights per call (``FusedMoE.forward``), computing with exactly the checkpoint's values.
"""
from __future__ import annotations

import torch

from core_runner.kernels.fp8_block_matmul import per_token_group_quant_fp8_ref
from core_runner.layers.fused_moe import SWIGLU_ALPHA, SWIGLU_LIMIT, fused_moe_ref
from core_runner.quantization.fp8 import dequantize_fp8_block, expand_block_scale


def quant_dequant_rows(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [rows, K] through the per-token-group fp8 quantizer and back, in float32."""
    q, s = per_token_group_quant_fp8_ref(x, group)
    return q.float() * expand_block_scale(s, tuple(q.shape), (1, group))


def fused_moe_fp8_ref(
    hidden: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
    block: tuple[int, int], topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None, activation: str = "silu",
    swiglu_alpha: float = SWIGLU_ALPHA, swiglu_limit: float = SWIGLU_LIMIT,
) -> torch.Tensor:
    """Arguments as ``fused_moe_fp8_triton``'s; the result in hidden's dtype."""
    group = int(block[1])
    x = quant_dequant_rows(hidden, group)
    w13_d = dequantize_fp8_block(w13, w13_scale, block, torch.float32, "w13")
    w2_d = dequantize_fp8_block(w2, w2_scale, block, torch.float32, "w2")
    out = fused_moe_ref(x, w13_d, w2_d, topk_weights, topk_ids,
                        None if w13_bias is None else w13_bias.float(), None if w2_bias is None else w2_bias.float(),
                        activation, swiglu_alpha, swiglu_limit, quantize_act=lambda a: quant_dequant_rows(a, group))
    return out.to(hidden.dtype)
