"""Repetition, frequency and presence penalties, read from the runner's token table.

Semantics (vLLM's): over the tokens known when a token is sampled,
- repetition (HF-style): every token seen in the prompt or the output has its logit
  divided by the penalty when positive, multiplied by it otherwise;
- then frequency and presence (OpenAI-style), on output tokens only:
  logit -= frequency * count, then logit -= presence if count > 0.

Bounded working set, chosen over a per-row [vocab] count table: nothing here is of
size vocab. The penalised rows' tokens are gathered from the token table as a
[p, L] block (L = the longest of them this step), and the logits are edited in place
through gather / scatter at those token ids. Repetition writes the same value for
every occurrence of a token, so duplicate writes agree. For frequency and presence,
each row's output tokens are sorted (a [p, L] sort, L << vocab) so that runs of equal
ids give each distinct token its count and one "first occurrence"; only that position
adds -frequency * count and then -presence, so each logit gets exactly the two
subtractions of the reference, in the same order.
"""
from __future__ import annotations

import torch

from core_runner.sample.metadata import PenaltyInputs


def apply_penalties(logits: torch.Tensor, p: PenaltyInputs) -> None:
    """In place on ``logits`` [n, V] (float32) for the rows ``p.batch_idx``."""
    num, length = p.token_ids.shape
    if num == 0 or length == 0:
        return
    vocab = logits.shape[1]
    flat = logits.view(-1)
    tok = p.token_ids.long().clamp(0, vocab - 1)  # stale columns may hold anything
    pos = torch.arange(length, device=tok.device)[None, :]
    known = pos < p.seq_lens[:, None]
    base = p.batch_idx.long()[:, None] * vocab
    if p.repetition is not None:
        # columns past the known tokens repeat column 0's write (a known token)
        idx = (base + torch.where(known, tok, tok[:, :1])).view(-1)
        vals = flat.gather(0, idx).view(num, length)
        rep = p.repetition[:, None]
        flat.scatter_(0, idx, torch.where(vals > 0, vals / rep, vals * rep).view(-1))
    if p.frequency is not None:
        is_out = known & (pos >= p.num_prompt[:, None])
        s = torch.where(is_out, tok, vocab).sort(dim=1).values  # outputs first, sentinel last
        valid = s < vocab
        new_run = torch.ones_like(valid)
        new_run[:, 1:] = s[:, 1:] != s[:, :-1]
        first = valid & new_run
        run = (first.long().cumsum(dim=1) - 1).clamp(min=0)
        counts = torch.zeros(num, length, device=tok.device).scatter_add_(1, run, valid.float())
        idx = (base + torch.where(valid, s, 0)).view(-1)
        zero = torch.zeros((), device=logits.device)
        freq = torch.where(first, -p.frequency[:, None] * counts.gather(1, run), zero)
        flat.scatter_add_(0, idx, freq.view(-1))
        pres = torch.where(first, -p.presence[:, None].expand(num, length), zero)
        flat.scatter_add_(0, idx, pres.reshape(-1))
