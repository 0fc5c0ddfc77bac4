"""``scatter_store`` (``core_runner/kernels/scatter_store.py``): a compaction (the lane lists'
pattern: a scan places each selected lane, one lane stores the count) gives the torch
reference's values, order and count, with ``tl.store`` (CPU interpreter and GPU) and with
the inline PTX store (GPU only: the interpreter runs no PTX), for float32 and int32."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from core_runner.kernels.scatter_store import scatter_store


@triton.jit
def _compact_kernel(x_ptr, out_ptr, cnt_ptr, thr, B: tl.constexpr, ASM: tl.constexpr):
    r = tl.arange(0, B)
    x = tl.load(x_ptr + r)
    sel = x > thr + tl.zeros([], x.dtype)
    at = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    scatter_store(out_ptr + at, x, sel, ASM)
    scatter_store(cnt_ptr + tl.zeros_like(at), at + 1, r == B - 1, ASM)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_compaction_matches_torch(device, dtype):
    gen = torch.Generator().manual_seed(3)
    b = 512
    x = torch.randn(b, generator=gen) * 100
    x = x.to(dtype)
    thr = 60
    want = x[x > thr]
    forms = [False, True] if device == "cuda" else [False]
    for asm in forms:
        out = torch.full((b,), -7, dtype=dtype, device=device)
        cnt = torch.zeros(1, dtype=torch.int32, device=device)
        _compact_kernel[(1,)](x.to(device), out, cnt, thr, B=b, ASM=asm, num_warps=2)
        n = int(cnt)
        assert n == want.numel() > 0, (asm, n)
        assert torch.equal(out[:n].cpu(), want), asm
        assert bool((out[n:] == -7).all()), asm  # nothing stored past the selected lanes
