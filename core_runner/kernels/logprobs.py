"""Per-row log-partition and token rank for logprobs (torch reference).

A logprob is ``logit - logsumexp(row)``; only the logsumexp needs the whole row, so
it is found once per row, together with the rank of one token (1 + the number of
tokens with a strictly larger logit, so tied tokens share the best rank). The
log-softmax of the row is never formed. The reference walks the rows in chunks so
that its temporaries stay bounded; the Triton twin is in ``logprobs_triton.py``.
"""
from __future__ import annotations

import torch

ROWS_PER_CHUNK = 64


def logsumexp_rank_ref(logits: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[n, V] logits, [n] token ids -> (logsumexp [n] f32, token logit [n] f32, rank [n] i64)."""
    n = logits.shape[0]
    lse = torch.empty(n, dtype=torch.float32, device=logits.device)
    rank = torch.empty(n, dtype=torch.int64, device=logits.device)
    tok = logits.gather(1, token_ids.long()[:, None])[:, 0].float()
    for s in range(0, n, ROWS_PER_CHUNK):
        chunk = logits[s: s + ROWS_PER_CHUNK].float()
        lse[s: s + ROWS_PER_CHUNK] = torch.logsumexp(chunk, dim=-1)
        rank[s: s + ROWS_PER_CHUNK] = (chunk > tok[s: s + ROWS_PER_CHUNK, None]).sum(dim=-1) + 1
    return lse, tok, rank
