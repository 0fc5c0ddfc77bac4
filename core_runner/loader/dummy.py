"""``load_format="dummy"`` (vLLM's name): random weights instead of a checkpoint's.

For benchmarking shapes whose checkpoint would take tens of GB to write or download: the
model directory needs only its config.json. Each parameter gets values drawn uniformly
from [-0.001, 0.001) (vLLM's range: small enough that no activation overflows in bf16),
from a generator seeded by the engine seed and the parameter's name, so a run is
repeatable; norm weights (1-D parameters named ``*norm*``) are 1 so that the layers keep
their scale. Under tensor parallelism each rank draws its own slice: the ranks' model is
not the one-rank model, which is fine for speed and wrong for equality checks.
"""
from __future__ import annotations

import hashlib

import torch
from torch import nn

RANGE = 1e-3


def fill_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    for name, p in model.named_parameters():
        if p.dim() == 1 and "norm" in name:
            p.data.fill_(1.0)
            continue
        key = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") ^ seed
        gen = torch.Generator(device=p.device).manual_seed(key & (2**63 - 1))
        values = torch.rand(p.shape, generator=gen, device=p.device, dtype=torch.float32)
        p.data.copy_(values.mul_(2 * RANGE).sub_(RANGE))
