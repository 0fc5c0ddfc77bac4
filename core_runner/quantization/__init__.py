"""Quantized checkpoints: which formats load, and how their tensors become weights.

``quantization_from_config(hf_config)`` reads ``config.json``'s ``quantization_config``
and returns a ``Quantization`` (None for an unquantized checkpoint). The loader asks it
which checkpoint tensors are auxiliary (scales, consumed with their weight), which scale
each weight is dequantized with (``scale_for``, headers only) and dequantizes the region of
it that a rank reads (``dequantize_region``); ``prepare`` does the same for a whole tensor.
"""
from core_runner.quantization.base import Quantization, TensorLookup, quantization_from_config
from core_runner.quantization.fp8 import Fp8BlockQuantization, dequantize_fp8_block, quantize_fp8_block

__all__ = [
    "Fp8BlockQuantization", "Quantization", "TensorLookup", "dequantize_fp8_block", "quantization_from_config",
    "quantize_fp8_block",
]
