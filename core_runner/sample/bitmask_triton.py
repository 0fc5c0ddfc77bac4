"""Triton kernel: packed int32 token bitmask -> -inf logits (torch reference: ``bitmask.apply_bitmask_ref``).

Grid (mask rows, column blocks); each program reads BLOCK logits of one row and BLOCK / 32
mask words. Reads and writes only the grammar rows (bytes: rows x V x 4 + rows x V / 8).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _apply_bitmask_kernel(logits_ptr, logits_stride, mask_ptr, mask_stride, rows_ptr, vocab,
                          BLOCK: tl.constexpr):
    j = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < vocab
    row = tl.load(rows_ptr + j).to(tl.int64)
    words = tl.load(mask_ptr + j * mask_stride + cols // 32, mask=ok, other=0)
    allowed = ((words >> (cols % 32)) & 1) != 0
    ptr = logits_ptr + row * logits_stride + cols
    tl.store(ptr, tl.full([BLOCK], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty), mask=ok & ~allowed)


def apply_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """In place: logits[rows[j], t] = -inf where bit t of bitmask[j] is 0."""
    if rows.numel() == 0:
        return
    vocab = logits.shape[-1]
    grid = (rows.numel(), triton.cdiv(vocab, _BLOCK))
    _apply_bitmask_kernel[grid](logits, logits.stride(0), bitmask, bitmask.stride(0), rows, vocab, BLOCK=_BLOCK)
