"""What a model's weights will take, from its config alone, before anything is allocated.

The model class is built with fake tensors on the meta device (torch's FakeTensorMode:
shapes without storage, nothing allocated) and its parameters and buffers are summed,
numel x itemsize. A model of more than ``EXACT_LAYERS`` layers is
built with 1 and 2 layers instead (``num_hidden_layers`` and every list as long as it are
cut) and the difference extrapolated: building 10,000 layers, even of fake tensors, takes
seconds. A class that cannot be built so gives no estimate (the real build then runs).
The same fake build gives the bytes of per-row recurrent state (``RowStateSpec`` layers:
Mamba's conv and SSM state) one request row takes, which the default ``max_num_seqs`` is
fitted to before any row is allocated (``engine/defaults.fit_max_num_seqs``).
"""
from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch

from core_runner.kv_cache_spec import PagedCacheSpec, RowStateSpec, collect_kv_cache_specs
from core_runner.loader.config_checks import CORE_SIZES
from core_runner.quantization.construction import building_for

logger = logging.getLogger(__name__)

EXACT_LAYERS = 128  # up to this many layers the whole model is built (~1 ms a layer)


@dataclass(frozen=True)
class Footprint:
    bytes: int  # parameters + buffers, the whole model (all tensor-parallel ranks together)
    largest: str  # the largest tensor's name and shape
    largest_bytes: int
    extrapolated: bool  # from 1 and 2 layers (see the module docstring)
    state_bytes_per_row: int = 0  # every RowStateSpec layer's state for one request row
    snapshot_bytes_per_row: int = 0  # what a prefix-cache snapshot of that row keeps (no scratch)
    kv_bytes_per_token: int = 0  # every paged layer's K/V entry for one token, in the model's dtype


def _built_footprint(model_cls: type, hf_config: Any, dtype: torch.dtype,
                     quantization: Any = None) -> tuple[int, str, int, int, int, int]:
    # fake tensors take .to("cpu") (RoPE tables are built there), which meta tensors refuse; the meta
    # default device keeps every tensor, and every per-device cache key (shared RoPE tables), off
    # the devices a real build uses, so nothing fake can leak into one
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake: Any = FakeTensorMode(allow_non_fake_inputs=True)
    except ImportError:  # a torch without it: the meta device alone (a RoPE table's copy to the CPU fails there)
        fake = contextlib.nullcontext()
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with fake, torch.device("meta"), building_for(quantization):
            model = model_cls(hf_config)
    finally:
        torch.set_default_dtype(prev)
    total, largest, largest_bytes = 0, "", -1
    for name, t in chain(model.named_parameters(), model.named_buffers()):
        b = t.numel() * t.element_size()
        total += b
        if b > largest_bytes:
            largest, largest_bytes = f"{name} {list(t.shape)}", b
    specs = collect_kv_cache_specs(model, dtype)
    rows = [s for s in specs if isinstance(s, RowStateSpec)]
    return (total, largest, max(largest_bytes, 0), sum(s.bytes_per_row() for s in rows),
            sum(s.persistent().bytes_per_row() for s in rows),
            sum(s.bytes_per_token() for s in specs if isinstance(s, PagedCacheSpec)))


def _with_layers(hf_config: Any, k: int) -> Any:
    n = hf_config.num_hidden_layers
    out = copy.copy(hf_config)  # shallow: the cut lists are new objects, nothing shared is mutated
    for key, value in vars(hf_config).items():
        if isinstance(value, (list, tuple)) and len(value) == n:
            setattr(out, key, value[:k])
    out.num_hidden_layers = k
    return out


def estimate_footprint(model_cls: type, hf_config: Any, dtype: torch.dtype,
                       quantization: Any = None) -> Footprint | None:
    """The bytes of ``model_cls(hf_config)``'s parameters and buffers in ``dtype`` (layers that
    keep fp8 weights for ``quantization`` counted with their fp8 bytes and scales); None when
    the class cannot be built with fake tensors."""
    n = getattr(hf_config, "num_hidden_layers", None)
    try:
        if isinstance(n, int) and n > EXACT_LAYERS:
            one = _built_footprint(model_cls, _with_layers(hf_config, 1), dtype, quantization)
            two = _built_footprint(model_cls, _with_layers(hf_config, 2), dtype, quantization)
            more = [a + (n - 1) * max(0, b - a) for a, b in ((one[i], two[i]) for i in (0, 3, 4, 5))]
            return Footprint(more[0], two[1], two[2], True, *more[1:])
        total, largest, largest_bytes, *caches = _built_footprint(model_cls, hf_config, dtype, quantization)
        return Footprint(total, largest, largest_bytes, False, *caches)
    except Exception as e:  # noqa: BLE001 - any class that needs real storage to build: no estimate
        logger.debug("%s cannot be built with fake tensors (%s: %s): weights not estimated", model_cls.__name__,
                     type(e).__name__, e)
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_footprint(fp: Footprint | None, hf_config: Any, dtype: torch.dtype, device: str, free: int,
                    share: int = 1) -> None:
    """Refuse a model whose weights (``fp``, split over ``share`` ranks that each have ``free``
    bytes) cannot fit, naming the config's size fields and the largest tensor."""
    if fp is None or fp.bytes // share <= free:
        return
    sizes = ", ".join(f"{k}={getattr(hf_config, k)}" for k in sorted(CORE_SIZES) if hasattr(hf_config, k))
    how = "extrapolated from 1 and 2 layers" if fp.extrapolated else "measured with fake tensors"
    per = f" per rank ({share} ranks)" if share > 1 else ""
    raise ValueError(
        f"the model's weights need {_gib(fp.bytes // share)}{per} in {str(dtype).removeprefix('torch.')} ({how}) but "
        f"{device} has {_gib(free)} free: check config.json's sizes ({sizes}); the largest tensor is {fp.largest} "
        f"({_gib(fp.largest_bytes)})"
    )
