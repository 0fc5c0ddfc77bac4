"""``EngineConfig.kv_cache_dtype``: the dtype paged K/V caches (and MLA latent caches) hold.

vLLM's names: "auto" is the model's dtype; "fp8" is "fp8_e4m3" (torch.float8_e4m3fn, the
format checkpoints' k_scale / v_scale are computed for), "fp8_e5m2" torch.float8_e5m2.
An fp8 entry is ``value / scale`` saturated to the format's finite range; a read is
``entry * scale`` in float32. The scales are per layer and 1.0 here (vLLM's default when a
checkpoint has none; reading a checkpoint's k_scale / v_scale is not implemented yet and
such a checkpoint is refused by the loader as an unknown tensor). The runner applies the
dtype to every paged spec a ModelState returns (``apply_kv_cache_dtype``), so the layers
and plugins do not change; the kernels read the cache dtype from the tensor.
"""
from __future__ import annotations

import dataclasses

import torch

#: kv_cache_dtype -> the torch dtype (None: the model's)
KV_CACHE_TORCH_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None, "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
}
#: the capability a family declares supported to run with an fp8 KV cache
CAPABILITY = "kv_cache_dtype:fp8"


def torch_dtype(name: str) -> torch.dtype | None:
    if name not in KV_CACHE_TORCH_DTYPES:
        raise ValueError(f"kv_cache_dtype={name!r} is invalid: expected one of {tuple(KV_CACHE_TORCH_DTYPES)}")
    return KV_CACHE_TORCH_DTYPES[name]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def saturation(dtype: torch.dtype) -> float:
    """The largest finite value of an fp8 ``dtype`` (stores clamp to it); 0.0 for others."""
    return float(torch.finfo(dtype).max) if is_fp8(dtype) else 0.0


def quantize_ref(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """``x`` as the cache stores it: cast, or for fp8 ``x / scale`` saturated then cast."""
    if not is_fp8(dtype):
        return x.to(dtype)
    sat = saturation(dtype)
    return (x.float() / scale).clamp(-sat, sat).to(dtype)


def apply_kv_cache_dtype(specs: list, name: str) -> list:
    """Every PagedCacheSpec of ``specs`` with the dtype ``name`` asks for ("auto": unchanged)."""
    from core_runner.kv_cache_spec import PagedCacheSpec

    dtype = torch_dtype(name)
    if dtype is None:
        return specs
    return [dataclasses.replace(s, dtype=dtype) if isinstance(s, PagedCacheSpec) else s for s in specs]
