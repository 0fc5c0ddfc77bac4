"""Device-side lookup of the request a ragged-batch attention program serves, from
query_start_loc alone (shared by ``paged_attention`` and ``mla_attention``)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def request_of_program(qsl_ptr, pid, num_reqs, BLOCK_Q: tl.constexpr, ONE_BLOCK_PER_REQ: tl.constexpr):
    """(req, tok0): the request program ``pid`` serves and its first query token. With
    ONE_BLOCK_PER_REQ program i serves request i from qsl[i]; otherwise request i owns the
    programs from ``qsl[i] // BLOCK_Q + i`` on, one per BLOCK_Q query tokens, and req is
    the last one starting at or before pid (binary search over qsl[0:num_reqs])."""
    if ONE_BLOCK_PER_REQ:
        req = pid
        tok0 = tl.load(qsl_ptr + req)
    else:
        lo = pid * 0
        hi = lo + num_reqs
        while hi - lo > 1:  # last req with qsl[req] // BLOCK_Q + req <= pid
            mid = (lo + hi) // 2
            go_right = tl.load(qsl_ptr + mid) // BLOCK_Q + mid <= pid
            lo = tl.where(go_right, mid, lo)
            hi = tl.where(go_right, hi, mid)
        req = lo
        q_start = tl.load(qsl_ptr + req)
        tok0 = q_start + (pid - (q_start // BLOCK_Q + req)) * BLOCK_Q
    return req, tok0

