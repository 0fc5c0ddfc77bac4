"""The bitmask kernel at the served vocabulary's width on the GPU (151,936 columns, bf16)."""
from __future__ import annotations

import pytest
import torch

from core_runner.sample.bitmask import apply_bitmask_ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_bitmask_kernel_full_vocab_gpu():
    from core_runner.sample.bitmask_triton import apply_bitmask_triton

    g = torch.Generator().manual_seed(1)
    v = 151936
    logits = torch.randn(64, v, generator=g).to(torch.bfloat16)
    mask = torch.randint(-(2**31), 2**31 - 1, (16, v // 32), generator=g, dtype=torch.int64).to(torch.int32)
    rows = torch.randperm(64, generator=g)[:16]
    ref = logits.clone()
    apply_bitmask_ref(ref, mask, rows)
    out = logits.cuda()
    apply_bitmask_triton(out, mask.cuda(), rows.cuda())
    assert torch.equal(out.cpu(), ref)
