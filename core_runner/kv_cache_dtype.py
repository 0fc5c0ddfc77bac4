"""``EngineConfig.kv_cache_dtype``: the dtype paged K/V caches (and MLA latent caches) hold.

vLLM's names: "auto" is the model's dtype; "fp8" is "fp8_e4m3" (torch.float8_e4m3fn, the
format checkpoints' k_scale / v_scale are computed for), "fp8_e5m2" torch.float8_e5m2.
An fp8 entry is ``value / scale`` saturated to the format's finite range; a read is
``entry * scale`` in float32. The scales are per layer (the layer's ``kv_scale`` buffer, k
then v): 1.0, vLLM's default, unless the checkpoint carries them (``loader/kv_scales.py``).
They apply to either fp8 format; a model-dtype cache ignores them (``report_kv_scales`` logs
it). The runner applies the dtype to every paged spec a ModelState returns
(``apply_kv_cache_dtype``), so the layers and plugins do not change; the kernels read the
cache dtype from the tensor.
"""
from __future__ import annotations

import dataclasses
import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

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


def quantize_ref(x: torch.Tensor, dtype: torch.dtype, scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """``x`` as the cache stores it: cast, or for fp8 ``x / scale`` saturated then cast
    (``scale`` a number or a 0-d tensor on x's device: no host read)."""
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


def report_kv_scales(model: nn.Module, name: str) -> int:
    """Log what becomes of the checkpoint's KV cache scales under ``kv_cache_dtype=name``;
    returns how many layers carry them. A model-dtype cache ignores them (vLLM does too)."""
    loaded = [m for m in model.modules() if getattr(m, "kv_scale_loaded", ())]
    if loaded and torch_dtype(name) is None:
        logger.info("the checkpoint's KV cache scales of %d layer(s) are ignored: kv_cache_dtype=%r keeps K/V in "
                    "the model's dtype (pass kv_cache_dtype='fp8' to use them)", len(loaded), name)
    elif loaded:
        logger.info("fp8 KV cache: k / v scales from the checkpoint for %d layer(s)", len(loaded))
    elif torch_dtype(name) is not None:
        logger.info("fp8 KV cache: the checkpoint has no k / v scales; every layer uses 1.0")
    return len(loaded)

