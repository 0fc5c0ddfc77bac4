"""Per-row logsumexp and token rank in one pass (Triton twin of ``logsumexp_rank_ref``).

One program per row streams the row once with an online max / rescaled sum and counts
the tokens whose logit is strictly above the given token's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _logsumexp_rank_kernel(logits_ptr, s_row, tok_ptr, lse_ptr, tok_logit_ptr, rank_ptr, vocab,
                           BLOCK: tl.constexpr):
    i = tl.program_id(0)
    row = logits_ptr + i.to(tl.int64) * s_row
    t = tl.load(row + tl.load(tok_ptr + i)).to(tl.float32)
    m = -float("inf")
    s = 0.0
    above = 0
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(row + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        scale = tl.where(m == m_new, 1.0, tl.exp(m - m_new))
        e = tl.where(x > -float("inf"), tl.exp(x - m_new), 0.0)
        s = s * scale + tl.sum(e, axis=0)
        m = m_new
        above += tl.sum((x > t).to(tl.int32), axis=0)
    tl.store(lse_ptr + i, m + tl.log(s))
    tl.store(tok_logit_ptr + i, t)
    tl.store(rank_ptr + i, (above + 1).to(tl.int64))


def logsumexp_rank_triton(logits: torch.Tensor, token_ids: torch.Tensor, block: int = 2048
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    dev = logits.device
    lse = torch.empty(n, dtype=torch.float32, device=dev)
    tok = torch.empty(n, dtype=torch.float32, device=dev)
    rank = torch.empty(n, dtype=torch.int64, device=dev)
    if n:
        _logsumexp_rank_kernel[(n,)](logits, logits.stride(0), token_ids.long().contiguous(), lse, tok, rank,
                                     vocab, BLOCK=block)
    return lse, tok, rank
