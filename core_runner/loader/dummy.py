"""``load_format="dummy"`` (vLLM's name): random weights instead of a checkpoint's.

For benchmarking shapes whose checkpoint would take tens of GB to write or download: the
model directory needs only its config.json. Each parameter gets values drawn uniformly
from [-0.001, 0.001) (vLLM's range: small enough that no activation overflows in bf16),
from a generator seeded by the engine seed and the parameter's name, so a run is
repeatable; norm weights (1-D parameters named ``*norm*``) are 1 so that the layers keep
their scale. Under tensor parallelism each rank draws its own slice: the ranks' model is
not the one-rank model, which is fine for speed and wrong for equality checks.

A quantized config (``quantization_config``: block fp8, compressed-tensors) builds the
layers that keep fp8 weights resident as it would for the checkpoint, and each gets
what a real one holds: the same uniform values quantized per block of its scale grid
(``quantize_fp8_block``: float8_e4m3fn values over the whole e4m3 range, positive
float32 scales amax / 448), so the fp8 kernels run on data shaped like a checkpoint's.
Layers a published fp8 checkpoint leaves unquantized are made dense again, as loading
that checkpoint would: MoE routers (``mlp.gate``, ``router``) and the config's
``modules_to_not_convert`` (fp8) or ``ignore`` (compressed-tensors; ``re:`` patterns).
"""
from __future__ import annotations

import fnmatch
import hashlib
import re
from typing import Any

import torch
from torch import nn

RANGE = 1e-3


SCALE = "weight_scale_inv"  # the scale buffer of a layer holding resident fp8 (core_runner.layers.fp8_weight)
ROUTERS = re.compile(r"(^|\.)(mlp\.gate|router)$")


def _uniform(name: str, shape: torch.Size, device: torch.device, seed: int) -> torch.Tensor:
    key = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") ^ seed
    gen = torch.Generator(device=device).manual_seed(key & (2**63 - 1))
    values = torch.rand(shape, generator=gen, device=device, dtype=torch.float32)
    return values.mul_(2 * RANGE).sub_(RANGE)


def _unquantized_patterns(quantization_config: Any) -> list[str]:
    qc = quantization_config
    if qc is not None and not isinstance(qc, dict):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else {}
    qc = qc or {}
    return list(qc.get("modules_to_not_convert") or []) + list(qc.get("ignore") or [])


def _kept_dense(name: str, patterns: list[str]) -> bool:
    """Whether a published checkpoint leaves module ``name`` unquantized (module docstring)."""
    if ROUTERS.search(name):
        return True
    for pat in patterns:
        if pat.startswith("re:"):
            if re.fullmatch(pat[3:], name) or re.search(pat[3:], name):
                return True
        elif name == pat or name.startswith(pat + ".") or name.endswith("." + pat) or fnmatch.fnmatch(name, pat):
            return True
    return False


def _fill_fp8(module: nn.Module, name: str, seed: int) -> None:
    from core_runner.quantization.fp8 import quantize_fp8_block

    w = module.weight
    q, scale = quantize_fp8_block(_uniform(name + ".weight", w.shape, w.device, seed), tuple(module.fp8_block))
    w.data.copy_(q)
    getattr(module, SCALE).copy_(scale)


def _make_dense(module: nn.Module) -> None:
    """The layer holds its weight in the model's dtype (filled with the dense parameters)."""
    module.weight.data = torch.empty(module.weight.shape, dtype=module.dense_dtype, device=module.weight.device)
    delattr(module, SCALE)
    module.fp8_block = None


def fill_dummy_weights(model: nn.Module, seed: int = 0, quantization_config: Any = None) -> None:
    patterns = _unquantized_patterns(quantization_config)
    fp8_weights = set()
    for name, module in model.named_modules():
        if getattr(module, "fp8_block", None) is None:
            continue
        if _kept_dense(name, patterns):
            _make_dense(module)
            continue
        _fill_fp8(module, name, seed)
        fp8_weights.add(id(module.weight))
    for name, p in model.named_parameters():
        if id(p) in fp8_weights:
            continue
        if p.dim() == 1 and "norm" in name:
            p.data.fill_(1.0)
            continue
        p.data.copy_(_uniform(name, p.shape, p.device, seed))
