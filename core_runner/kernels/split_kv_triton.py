"""Split-KV (flash-decoding) shared by ``paged_attention`` and ``mla_attention``.

With few (request, head) programs a decode batch leaves SMs idle, so a grid axis splits
each context into NUM_SPLITS ranges (``split_range``, inside the attention kernel); each
program writes its running (max, sum, unnormalised acc) to fp32 scratch indexed by
(token, head, split) and ``merge_splits`` combines them into the output. The split count
comes from host ints only (``pick_num_splits``), so the launch can be captured in a CUDA
graph. The merge has no torch twin of its own: split and unsplit attention are checked
against ``paged_attention_ref`` / ``mla_attention_ref`` (tests/kernels/test_paged_attention.py,
test_mla_attention.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_NEG_BIG = tl.constexpr(-1.0e30)  # finite "minus infinity": keeps exp2(m_old - m_new) NaN-free


@triton.jit
def split_range(kv_end, split, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """[kv_lo, kv_hi): split ``split``'s keys of [0, kv_end) in NUM_SPLITS BLOCK_N-aligned
    chunks (flash-decoding); a split past the end gets an empty range."""
    if NUM_SPLITS > 1:
        chunk = tl.cdiv(tl.cdiv(kv_end, NUM_SPLITS), BLOCK_N) * BLOCK_N
        kv_lo = split * chunk
        return kv_lo, tl.minimum(kv_lo + chunk, kv_end)
    return 0, kv_end  # a constant start, as the unsplit loops were compiled and measured


@triton.jit
def split_range_from(kv_start, kv_end, split, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """As ``split_range`` over keys [kv_start, kv_end) (a sliding window's first key on)."""
    if NUM_SPLITS > 1:
        chunk = tl.cdiv(tl.cdiv(kv_end - kv_start, NUM_SPLITS), BLOCK_N) * BLOCK_N
        kv_lo = kv_start + split * chunk
        return kv_lo, tl.minimum(kv_lo + chunk, kv_end)
    return kv_start, kv_end


@triton.jit(do_not_specialize=["num_reqs"])
def _merge_kernel(
    out_ptr, m_ptr, l_ptr, acc_ptr, qsl_ptr, num_reqs, s_ot, s_oh,
    HEAD_SIZE: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """out[tok, head] from the splits' (m, l, acc) rows of BLOCK_D floats. Padding tokens
    past qsl[num_reqs] read no scratch, which a kernel need not have written for them, and
    come out as zeros."""
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    sp = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, BLOCK_D)
    sp_ok = sp < tl.where(tok < tl.load(qsl_ptr + num_reqs), NUM_SPLITS, 0)
    base = (tok * NUM_HEADS + head) * NUM_SPLITS
    # _NEG_BIG, not -inf, for absent splits: when none is present the max stays finite
    m = tl.load(m_ptr + base + sp, mask=sp_ok, other=_NEG_BIG)
    l = tl.load(l_ptr + base + sp, mask=sp_ok, other=0.0)
    acc = tl.load(acc_ptr + (base + sp)[:, None] * BLOCK_D + d[None, :], mask=sp_ok[:, None], other=0.0)
    w = tl.exp2(m - tl.max(m, 0))  # max is finite: every real split wrote >= _NEG_BIG
    l_tot = tl.sum(w * l, 0)
    o = tl.sum(w[:, None] * acc, 0) / tl.where(l_tot > 0.0, l_tot, 1.0)
    tl.store(out_ptr + tok * s_ot + head * s_oh + d, o.to(out_ptr.dtype.element_ty), mask=d < HEAD_SIZE)


def pick_num_splits(device: torch.device, num_reqs: int, progs_per_req: int, max_seq_len: int) -> int:
    """Split until there are up to ~4 programs per SM (a decode program alone cannot keep an
    SM's memory pipe busy), each still covering >= 256 context tokens, at most 16.
    progs_per_req: programs per request before splitting (kv heads, or MLA's head tiles).
    The count rounds down: one split more than fits the SMs' ~4 resident programs leaves a
    second, mostly empty round of programs (Gemma-3 decode, 128 requests x 1 kv head on
    132 SMs: 5 splits 408 us, 4 splits 350 us on the H100; benchmarks/RESULTS.md)."""
    if device.type != "cuda":
        return 1
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    work = max(num_reqs * progs_per_req, 1)
    return max(min(4 * num_sms // work, max_seq_len // 256, 16), 1)


def split_scratch(num_tokens: int, num_heads: int, num_splits: int, width: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m, l, acc) fp32 scratch of every (token, head, split); acc rows ``width`` wide."""
    parts = num_tokens * num_heads * num_splits
    m = torch.empty(parts, dtype=torch.float32, device=device)
    return m, torch.empty_like(m), torch.empty(parts * width, dtype=torch.float32, device=device)


def merge_splits(out: torch.Tensor, scratch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                 query_start_loc: torch.Tensor, num_reqs: int, num_splits: int, width: int) -> None:
    """out [tokens, heads, D] <- the splits in ``scratch`` (rows ``width`` >= D wide)."""
    num_tokens, num_heads, head_size = out.shape
    _merge_kernel[(num_tokens, num_heads)](
        out, *scratch, query_start_loc, num_reqs, out.stride(0), out.stride(1),
        HEAD_SIZE=head_size, NUM_HEADS=num_heads, NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits), BLOCK_D=width, num_warps=4,
    )
