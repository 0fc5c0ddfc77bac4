"""A masked store of 4-byte values to data-dependent addresses, in the layout the values
already have.

``tl.store`` lets triton's coalescing pass pick the layout of every store from the
pointers' contiguity: for addresses it cannot prove contiguous (a compacted list's slots,
or one lane's address) it wants one element per thread, so a tensor held four to a
thread (as read 1's lanes are, after their 16-byte loads) is moved there through shared
memory first: pointers, values and mask, each a round with barriers. On sm90 (triton 3.6)
one such store of 512 lanes on 2 warps took 6 barriers and ~190 instructions; the same
store as ``st.global`` from each thread's own registers, 0 barriers (H200 session 10;
read 1 makes four of them per program). Nothing is gained by moving scattered data first.

``ASM`` (a constexpr) picks the inline PTX store; False, and always under triton's CPU
interpreter (which runs no PTX), ``tl.store``. Both store the same bytes.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _st_global_b32(ptr, val, mask):
    # each element: if mask, st.global.b32 [ptr], val (the result, 0, only carries the side effect)
    return tl.inline_asm_elementwise(
        "{\n.reg .pred p;\nsetp.ne.b32 p, $3, 0;\n@p st.global.b32 [$1], $2;\nmov.b32 $0, 0;\n}",
        "=r,l,r,r", [ptr.to(tl.int64, bitcast=True), val.to(tl.int32, bitcast=True), mask.to(tl.int32)],
        dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def scatter_store(ptr, val, mask, ASM: tl.constexpr):
    """``tl.store(ptr, val, mask=mask)`` for 32-bit val (float32 or int32) and a pointer
    tensor of val's shape; ASM: by inline PTX in val's own layout (module docstring)."""
    if ASM:
        _st_global_b32(ptr, val, mask)
    else:
        tl.store(ptr, val, mask=mask)
