"""The Triton token-bitmask kernel masks exactly what the torch reference masks (bf16 and fp32
logits, a vocabulary that is not a multiple of 32, a mask word with bit 31 set, rows out of order);
on the GPU when there is one, else in the interpreter (tests/kernels/conftest.py)."""
from __future__ import annotations

import pytest
import torch

from core_runner.sample.bitmask import apply_bitmask_ref
from core_runner.sample.bitmask_triton import apply_bitmask_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitmask_kernel_matches_reference(device, dtype):
    g = torch.Generator().manual_seed(0)
    n, v = 5, 1100
    logits = torch.randn(n, v, generator=g).to(dtype)
    words = -(-v // 32)
    mask = torch.randint(-(2**31), 2**31 - 1, (3, words), generator=g, dtype=torch.int64).to(torch.int32)
    mask[0, 0] = -(2**31)  # only bit 31 of the first word: tokens 0..30 masked, 31 allowed
    rows = torch.tensor([3, 0, 4])
    ref = logits.clone()
    apply_bitmask_ref(ref, mask, rows)
    out = logits.to(device)
    apply_bitmask_triton(out, mask.to(device), rows.to(device))
    assert torch.equal(out.cpu(), ref)
    assert torch.isinf(ref[3, :31]).all() and torch.isfinite(ref[3, 31])
    assert torch.equal(ref[[1, 2]], logits[[1, 2]])  # rows without a mask are untouched
