"""Checkpoint fp8 KV cache scales -> the ``kv_scale`` buffer of the attention layer they belong to.

Names (vLLM's, docs/fp8_kv_cache.md), as the model's ``map_weight_name`` returns them:
``<attn>.k_scale``, ``<attn>.v_scale``, ``<attn>.kv_scale`` (both), the older
``<attn>.k_proj.k_scale`` / ``<attn>.v_proj.v_scale``, and compressed-tensors'
``<attn>.k_proj.output_scale`` / ``<attn>.v_proj.output_scale``. ``<attn>`` is the
checkpoint's attention module (``model.layers.3.self_attn``); the scale goes to the one
layer holding a ``kv_scale`` buffer (``Attention`` / ``MLAAttention``) at or under it. An MLA
layer reads its latent with k's scale (v's is kept, unused), as vLLM does.

A scale is one positive finite number per tensor (vLLM's per-tensor scheme); a per-head or
otherwise shaped one, a non-positive one, a scale no layer owns and a second scale for the
same entry are refused naming the tensor. The scales are loaded whatever ``kv_cache_dtype``
is; the layers use them only with an fp8 cache (``kv_cache_dtype.report_kv_scales`` logs
when a model-dtype cache ignores them).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core_runner.loader.files import CheckpointError
from core_runner.loader.finite import where

# a checkpoint name -> (the attention module's prefix, which entries of kv_scale it sets)
_NAMES = (
    (re.compile(r"^(.*)\.k_proj\.(?:k_scale|output_scale)$"), (0,)),
    (re.compile(r"^(.*)\.v_proj\.(?:v_scale|output_scale)$"), (1,)),
    (re.compile(r"^(.*)\.k_scale$"), (0,)),
    (re.compile(r"^(.*)\.v_scale$"), (1,)),
    (re.compile(r"^(.*)\.kv_scale$"), (0, 1)),
)
_ENTRY = ("k", "v")


def kv_scale_target(name: str) -> tuple[str, tuple[int, ...]] | None:
    """(attention prefix, kv_scale entries) for a KV cache scale name, else None."""
    for pattern, entries in _NAMES:
        m = pattern.match(name)
        if m:
            return m[1], entries
    return None


class KVScaleLoader:
    """Resolves and stores the KV cache scales of one model's checkpoint."""

    def __init__(self, model: nn.Module) -> None:
        self.model_name = type(model).__name__
        self.layers = {n: m for n, m in model.named_modules() if isinstance(getattr(m, "kv_scale", None), torch.Tensor)
                       and hasattr(m, "kv_cache_spec")}
        self.seen: dict[tuple[str, int], str] = {}

    def _layer(self, prefix: str, file: Path, name: str) -> tuple[str, nn.Module]:
        found = [n for n in self.layers if n == prefix or n.startswith(prefix + ".")]
        if len(found) != 1:
            what = "no attention layer" if not found else f"{len(found)} attention layers ({found[:4]})"
            raise CheckpointError(
                f"{where(file, name)} is a KV cache scale for {prefix!r}, but {self.model_name} has {what} there "
                f"(layers holding kv_scale: {list(self.layers)[:4]}{' ...' if len(self.layers) > 4 else ''}); "
                "add it to ignored_weight_patterns if it is unused")
        return found[0], self.layers[found[0]]

    def load(self, f: Any, file: Path, name: str, target: str) -> bool:
        """Store the scale ``name`` (model-side name ``target``) if it is one; False otherwise."""
        resolved = kv_scale_target(target)
        if resolved is None:
            return False
        prefix, entries = resolved
        layer_name, layer = self._layer(prefix, file, name)
        t = f.get_tensor(name)
        value = float(t.float().reshape(-1)[0]) if t.numel() == 1 else None
        if value is None or not math.isfinite(value) or value <= 0:
            got = f"shape {tuple(t.shape)}" if value is None else f"value {value}"
            raise CheckpointError(f"{where(file, name)}: a KV cache scale must be one positive finite number "
                                  f"(a per-tensor scale), got {got}")
        for i in entries:
            prev = self.seen.get((layer_name, i))
            if prev is not None:
                raise CheckpointError(f"{where(file, name)} and {prev} both set the {_ENTRY[i]} cache scale of "
                                      f"{layer_name!r}")
            self.seen[(layer_name, i)] = f"{file.name}:{name}"
            with torch.no_grad():
                layer.kv_scale[i] = value  # at load time, before any graph: a host write is fine here
        layer.kv_scale_loaded = (*layer.kv_scale_loaded, name)
        return True
