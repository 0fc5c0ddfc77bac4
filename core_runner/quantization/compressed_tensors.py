"""fp8 checkpoints in compressed-tensors' ``float-quantized`` format (llm-compressor's FP8 /
FP8_DYNAMIC schemes, most fp8 checkpoints on the hub).

A quantized Linear weight ``W`` [out, in] is stored as float8_e4m3fn beside
``<prefix>.weight_scale``: one float per tensor (strategy ``tensor``, shape [] or [1]) or
one per output row (strategy ``channel``, [out, 1]); ``W = float(W_fp8) * weight_scale``.
Activations are quantized dynamically per token (``input_activations.dynamic``) or with a
static per-tensor ``<prefix>.input_scale``. Modules in ``ignore`` (lm_head, routers) are
stored unquantized and load as they are.

The config is parsed with the ``compressed-tensors`` library's own classes
(``QuantizationConfig``), imported when a checkpoint names this method; anything but the
schemes above (int weights, groups, blocks, asymmetric, sparsity, a KV-cache scheme,
another format) is refused by name with the scheme found.

Resident fp8: the scales a layer keeps use the block grid ``(1, RESIDENT_GROUP)`` (one
value per output row and group of 128 input columns, the per-tensor or per-channel scale
repeated), so one Triton W8A8 kernel (the block kernel) serves both formats: about
3 % of the fp8 weight's bytes in float32 scales. The GPU path quantizes activations per
token and group of 128 (finer than per token; a static ``input_scale`` is read and not
used: dynamic scales are at least as precise). docs/quantization.md has the table.
"""
from __future__ import annotations

from typing import Any

import torch

from core_runner.quantization.base import Bounds, Lookup, Quantization, RegionLookup

RESIDENT_GROUP = 128  # K tile of the block kernel; any power of two >= 16 would do
SCALE_SUFFIX = "_scale"  # '<x>.weight' -> '<x>.weight_scale'
AUXILIARY = (".weight_scale", ".input_scale", ".weight_zero_point", ".input_zero_point", ".weight_global_scale")


def _scheme_text(scheme: Any) -> str:
    w, a = scheme.weights, scheme.input_activations
    def args(q: Any) -> str:
        if q is None:
            return "none"
        return (f"num_bits={q.num_bits} type={q.type!r} strategy={getattr(q.strategy, 'value', q.strategy)!r} "
                f"symmetric={q.symmetric} dynamic={q.dynamic} group_size={q.group_size}")
    return f"targets={scheme.targets} weights=({args(w)}) input_activations=({args(a)})"


def _strategy(q: Any) -> str:
    return str(getattr(q.strategy, "value", q.strategy))


class CompressedTensorsFp8(Quantization):
    """quant_method 'compressed-tensors', format 'float-quantized', fp8 e4m3 weights with
    per-tensor or per-channel scales (see the module docstring)."""

    method = "compressed-tensors"
    resident_block = (1, RESIDENT_GROUP)

    def __init__(self, weight_strategy: str, activation: str, ignore: list[str]) -> None:
        self.weight_strategy, self.activation, self.ignore = weight_strategy, activation, list(ignore)

    @classmethod
    def from_config(cls, qc: dict) -> CompressedTensorsFp8:
        try:
            from compressed_tensors.quantization import QuantizationConfig
        except ImportError:
            raise ValueError("quantization_config.quant_method='compressed-tensors' needs the compressed-tensors "
                             "package: install compressed-tensors (pip install compressed-tensors) to load this "
                             "checkpoint") from None
        try:
            config = QuantizationConfig.model_validate(qc)
        except Exception as e:  # noqa: BLE001 - pydantic's ValidationError, whatever its version
            raise ValueError(f"quantization_config (compressed-tensors) does not parse: {e}") from e
        fmt = config.format
        if fmt != "float-quantized":
            raise ValueError(f"quantization_config.format={fmt!r} (compressed-tensors) is not supported: core-runner "
                             "loads 'float-quantized' (fp8 e4m3 weights with per-tensor or per-channel scales)")
        kv = config.kv_cache_scheme
        # static per-tensor fp8 KV scales are what the loader reads (core_runner/loader/kv_scales.py);
        # the cache dtype itself still comes from EngineConfig.kv_cache_dtype
        if kv is not None and (kv.num_bits, str(kv.type), str(kv.strategy), kv.dynamic) != (8, "float", "tensor",
                                                                                           False):
            raise ValueError(f"quantization_config.kv_cache_scheme={kv!r} is not supported: core-runner reads "
                             "static per-tensor fp8 KV cache scales (num_bits 8, type 'float', strategy 'tensor', "
                             "dynamic false); the cache dtype comes from EngineConfig.kv_cache_dtype")
        if getattr(config, "sparsity_config", None):
            raise ValueError("quantization_config.sparsity_config is not supported (sparse checkpoints)")
        groups = config.config_groups or {}
        if len(groups) != 1:
            raise ValueError(f"quantization_config.config_groups has {len(groups)} groups "
                             f"({sorted(groups)}): core-runner loads exactly one fp8 scheme for every Linear")
        (gname, scheme), = groups.items()
        w, a = scheme.weights, scheme.input_activations
        ok_w = (w is not None and w.num_bits == 8 and str(getattr(w.type, "value", w.type)) == "float"
                and w.symmetric and not w.dynamic and _strategy(w) in ("tensor", "channel"))
        ok_a = a is None or (a.num_bits == 8 and str(getattr(a.type, "value", a.type)) == "float" and a.symmetric
                             and ((a.dynamic is True and _strategy(a) == "token")
                                  or (not a.dynamic and _strategy(a) == "tensor")))
        if not (ok_w and ok_a) or scheme.output_activations is not None:
            raise ValueError(
                f"quantization_config.config_groups[{gname!r}] ({_scheme_text(scheme)}) is not supported: "
                "core-runner loads 8-bit float symmetric weights with strategy 'tensor' or 'channel' and "
                "activations dynamic per 'token', static per 'tensor', or none")
        activation = "none" if a is None else ("dynamic_token" if a.dynamic else "static_tensor")
        return cls(_strategy(w), activation, list(config.ignore or []))

    def is_auxiliary(self, name: str) -> bool:
        return name.endswith(AUXILIARY)

    def scale_name(self, weight_name: str) -> str:
        return weight_name + SCALE_SUFFIX

    def _paired(self, name: str, dtype: torch.dtype, scale_shape: tuple[int, ...] | None,
                shape: tuple[int, ...]) -> bool:
        is_fp8 = dtype == torch.float8_e4m3fn
        if is_fp8 and scale_shape is None:
            raise ValueError(f"checkpoint tensor {name!r} is float8_e4m3fn but its scale {self.scale_name(name)!r} "
                             "is not in the checkpoint")
        if scale_shape is not None and not is_fp8:
            raise ValueError(f"checkpoint tensor {name!r} has a scale {self.scale_name(name)!r} but dtype {dtype}: "
                             "expected float8_e4m3fn")
        if scale_shape is None:
            return False
        numel = 1
        for n in scale_shape:
            numel *= n
        want = 1 if self.weight_strategy == "tensor" else shape[0]
        if len(shape) != 2 or numel != want or (self.weight_strategy == "channel" and scale_shape[0] != shape[0]):
            raise ValueError(f"{self.scale_name(name)!r} has shape {tuple(scale_shape)} for weight {tuple(shape)}: "
                             f"strategy {self.weight_strategy!r} needs "
                             f"{'one value' if want == 1 else f'[{shape[0]}, 1]'}")
        return True

    @staticmethod
    def _rows(scale: torch.Tensor, rows: int) -> torch.Tensor:
        """The scale as one float per row [rows, 1] (a per-tensor scale repeated)."""
        s = scale.float().reshape(-1, 1)
        return s.expand(rows, 1) if s.shape[0] == 1 else s

    def _region_scale(self, scale_name: str, bounds: Bounds, lookup: RegionLookup) -> torch.Tensor:
        (r0, r1) = bounds[0]
        if self.weight_strategy == "tensor":
            return self._rows(lookup.read(scale_name, tuple((0, n) for n in lookup.shape(scale_name))), r1 - r0)
        shape = lookup.shape(scale_name)
        return self._rows(lookup.read(scale_name, ((r0, r1), *((0, n) for n in shape[1:]))), r1 - r0)

    def prepare(self, name: str, tensor: torch.Tensor, lookup: Lookup, dtype: torch.dtype) -> torch.Tensor:
        scale = lookup(self.scale_name(name)) if name.endswith(".weight") else None
        if not self._paired(name, tensor.dtype, None if scale is None else tuple(scale.shape), tuple(tensor.shape)):
            return tensor
        return (tensor.float() * self._rows(scale, tensor.shape[0])).to(dtype)

    def scale_for(self, name: str, dtype: torch.dtype, shape: tuple[int, ...], lookup: RegionLookup) -> str | None:
        scale_shape = lookup.shape(self.scale_name(name)) if name.endswith(".weight") else None
        return self.scale_name(name) if self._paired(name, dtype, scale_shape, shape) else None

    def dequantize_region(self, name: str, tensor: torch.Tensor, bounds: Bounds, scale_name: str,
                          lookup: RegionLookup, dtype: torch.dtype) -> torch.Tensor:
        return (tensor.float() * self._region_scale(scale_name, bounds, lookup)).to(dtype)

    def resident_scale(self, name: str, bounds: Bounds, scale_name: str, lookup: RegionLookup) -> torch.Tensor:
        (c0, c1) = bounds[-1]
        groups = -(-(c1 - c0) // RESIDENT_GROUP)
        # constant along K, so any column split keeps exact scales (no alignment needed)
        return self._region_scale(scale_name, bounds, lookup).expand(-1, groups).contiguous()
