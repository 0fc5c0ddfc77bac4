"""Speculative decoding on the device: n-gram proposals, the verification view of a step,
and acceptance.

A decoding request with k proposed tokens is scheduled 1 + k tokens: its last known token
and the proposals, which sit in the token table right after its known tokens (the
proposer writes them there), so input prep reads them like any tokens. Logits come from
all 1 + k positions; each is sampled by the normal pipeline at its own position, with the
request's own settings and (seed, position) noise, exactly as decoding would sample that
position. Proposal j + 1 is accepted while it equals the token sampled at position j, so
the output is the first mismatch or, when all k match, one more: a + 1 tokens. With a
deterministic proposal (q one-hot) this is speculative rejection sampling: a proposal is
kept with probability p(d) = min(1, p(d) / q(d)), and on rejection the sampled token is
drawn from p without d, i.e. (p - q)+ normalised. Because the noise of a position is the
same as without speculation, a seeded request gives exactly the tokens it gives without
it (logits permitting). Rejected proposals' KV slots are overwritten by later steps.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod

import torch

from core_runner.step_data.input_batch import InputBatch


@dataclasses.dataclass
class Verification:
    view: InputBatch  # one entry per logits row: the request's row, the position it samples
    logits_indices: torch.Tensor  # [M] token index of each logits row
    counts: list[int]  # per request: k (0 for a request sampling one token)
    first: torch.Tensor  # [n] the logits row of each request's first position
    counts_dev: torch.Tensor  # [n] ``counts`` on the device


def verification_view(batch: InputBatch, counts: list[int]) -> Verification:
    """The step's batch expanded to its logits rows: a request with k proposals gets rows
    for its last 1 + k positions, the others their last position. Built from host lists
    the scheduler already knew; the device gets two index copies."""
    n = batch.num_reqs
    qsl = batch.query_start_loc_cpu[: n + 1].tolist()
    computed = batch.num_computed_cpu[:n].tolist()
    rows = batch.idx_mapping_cpu[:n].tolist()
    tok_idx, req_of, seq_cpu, comp_cpu, firsts = [], [], [], [], []
    for i, k in enumerate(counts):
        firsts.append(len(tok_idx))
        end = qsl[i + 1]
        for j in range(k + 1):
            t = end - 1 - k + j
            tok_idx.append(t)
            req_of.append(i)
            seq_cpu.append(computed[i] + (t - qsl[i]) + 1)
            comp_cpu.append(computed[i] + (t - qsl[i]))
    device = batch.idx_mapping.device
    pad = [0] * (len(tok_idx) - n)
    pack = torch.tensor([tok_idx, req_of, firsts + pad, list(counts) + pad], dtype=torch.int64)
    dev = pack.to(device, non_blocking=True)  # one copy for every index the step needs
    logits_indices, req_dev, first, counts_dev = dev[0], dev[1], dev[2, :n], dev[3, :n]
    view = dataclasses.replace(
        batch, req_ids=[batch.req_ids[i] for i in req_of], num_reqs=len(tok_idx),
        idx_mapping=batch.idx_mapping[:n][req_dev], idx_mapping_cpu=torch.tensor([rows[i] for i in req_of]),
        seq_lens=(batch.positions[logits_indices] + 1).to(torch.int32),
        seq_lens_cpu=torch.tensor(seq_cpu, dtype=torch.int32), num_computed_cpu=torch.tensor(comp_cpu),
        logits_indices=logits_indices, num_reqs_padded=len(tok_idx),
    )
    return Verification(view, logits_indices, counts, first, counts_dev)


def accept(sampled: torch.Tensor, v: Verification, rows: torch.Tensor, num_tokens: torch.Tensor,
           token_ids: torch.Tensor, cap: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(accepted [n], final token [n], target [n, kmax + 1]): how many proposals each request
    keeps, the token sampled after them, and the tokens sampled at its positions.
    ``sampled`` [M] holds the token sampled at every logits row; the proposals are read
    from the token table at the request's known length. ``cap`` [n] (structured outputs:
    the positions the grammar could mask) bounds how many each request keeps."""
    n, kmax = len(v.counts), max(v.counts)
    device = sampled.device
    j = torch.arange(kmax + 1, device=device)
    counts = v.counts_dev
    at = (v.first[:, None] + torch.minimum(j[None, :], counts[:, None])).clamp_max(sampled.numel() - 1)
    target = sampled[at]  # [n, kmax + 1]
    if kmax == 0:
        return torch.zeros(n, dtype=torch.int64, device=device), target[:, 0], target
    pos = (num_tokens[rows].long()[:, None] + j[None, :kmax]).clamp_max(token_ids.shape[1] - 1)
    proposed = token_ids[rows[:, None], pos]
    match = (target[:, :kmax] == proposed.to(target.dtype)) & (j[None, :kmax] < counts[:, None])
    accepted = match.long().cumprod(dim=1).sum(dim=1)
    if cap is not None:
        accepted = torch.minimum(accepted, cap)
    return accepted, target.gather(1, accepted[:, None]).squeeze(1), target


def propose_ngram(token_ids: torch.Tensor, rows: torch.Tensor, num_tokens: torch.Tensor, k: int,
                  min_n: int, max_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([len(rows), k] proposals, [len(rows)] whether a match was found): for each row, the
    k tokens that followed the most recent earlier occurrence of its last n tokens, for the
    largest n in [min_n, max_n] that occurs; a row without a match proposes its last token
    k times (the scheduler, told through ``ProposalExtra``, does not verify them). Known
    tokens are ``token_ids[row, :num_tokens[row]]``; positions past them propose the last
    known token. No host synchronisation."""
    device = token_ids.device
    table = token_ids[rows].long()  # [R, L]
    length = num_tokens[rows].long()  # [R]
    r, width = table.shape
    ar = torch.arange(width, device=device)
    last = table.gather(1, (length - 1).clamp_min(0)[:, None])  # [R, 1]
    best = torch.full((r,), -1, dtype=torch.long, device=device)  # start of the continuation
    for n in range(max_n, min_n - 1, -1):
        if n >= width:
            continue
        suffix = table.gather(1, (length[:, None] - n + torch.arange(n, device=device)).clamp_min(0))  # [R, n]
        windows = table.unfold(1, n, 1)  # [R, L - n + 1, n]: windows[s] = tokens s..s+n-1
        starts = ar[: width - n + 1]
        hit = (windows == suffix[:, None, :]).all(dim=2) & (starts[None, :] + n < length[:, None])
        hit &= (length >= n + 1)[:, None]
        latest = torch.where(hit, starts[None, :], -1).amax(dim=1)  # the most recent occurrence
        found = (latest >= 0) & (best < 0)
        best = torch.where(found, latest + n, best)
    src = best[:, None] + torch.arange(k, device=device)[None, :]
    ok = (best[:, None] >= 0) & (src < length[:, None])
    picked = table.gather(1, src.clamp(0, width - 1))
    return torch.where(ok, picked, last), best >= 0


def write_proposals(token_ids: torch.Tensor, rows: torch.Tensor, num_tokens: torch.Tensor,
                    proposals: torch.Tensor) -> None:
    """Put each row's proposals right after its known tokens, those that fit in the table.
    No data-dependent shapes (a boolean mask would sync the host): positions past the
    table are clamped onto its last column and write there the value it gets anyway (the
    proposal that lands on it, or what it holds), so duplicate writes agree."""
    k, width = proposals.shape[1], token_ids.shape[1]
    j = torch.arange(k, device=token_ids.device)
    start = num_tokens[rows].long()
    last_j = (width - 1 - start).clamp(-1, k - 1)  # the proposal landing on the last column, -1: none
    src = torch.minimum(j[None, :], last_j[:, None])
    held = token_ids[rows, width - 1].to(proposals.dtype)[:, None]
    vals = torch.where(src >= 0, proposals.gather(1, src.clamp_min(0)), held)
    pos = (start[:, None] + j[None, :]).clamp_max(width - 1)
    token_ids[rows[:, None].expand_as(pos), pos] = vals.to(token_ids.dtype)


class _ChainedExtra(ABC):
    """Host copies a step adds to AsyncOutput's copy-out (``tensors``), chained with the
    step's other extras (``inner``): ``fill`` lets the inner one fill first, then ``_fill``."""

    def __init__(self, tensors: dict[str, torch.Tensor], inner=None) -> None:
        self.inner = inner
        self.tensors = {**tensors, **(inner.tensors if inner is not None else {})}

    def fill(self, out, host: dict[str, torch.Tensor]) -> None:
        if self.inner is not None:
            self.inner.fill(out, host)
        self._fill(out, host)

    @abstractmethod
    def _fill(self, out, host: dict[str, torch.Tensor]) -> None:
        """Put this extra's host copies into the step's ModelRunnerOutput."""


class SpecExtra(_ChainedExtra):
    """The host copies a verification step adds (per request the sampled tokens of its
    positions and how many proposals it kept), chained with the step's logprobs."""

    def __init__(self, req_ids: list[str], counts: list[int], target: torch.Tensor, accepted: torch.Tensor,
                 inner=None) -> None:
        super().__init__({"spec.target": target, "spec.accepted": accepted}, inner)
        self.req_ids, self.counts = req_ids, counts

    def _fill(self, out, host: dict[str, torch.Tensor]) -> None:
        target, accepted = host["spec.target"].tolist(), host["spec.accepted"].tolist()
        for i, k in enumerate(self.counts):
            if k:
                out.spec_token_ids[self.req_ids[i]] = target[i][: accepted[i]]


class ProposalExtra(_ChainedExtra):
    """The host copy of which requests' proposer found something to propose (n-gram: a
    match; None for a draft model, which always proposes), chained with the step's other
    extras: a request without one is not verified next step (as vLLM's n-gram proposer,
    which proposes nothing then). ``proposals`` [len(req_ids), k], copied only when a
    structured-output request proposed: its next step's masks walk them on the host."""

    def __init__(self, req_ids: list[str], matched: torch.Tensor | None, proposals: torch.Tensor | None = None,
                 inner=None) -> None:
        tensors = {} if matched is None else {"spec.matched": matched}
        if proposals is not None:
            tensors["spec.proposals"] = proposals
        super().__init__(tensors, inner)
        self.req_ids = req_ids

    def _fill(self, out, host: dict[str, torch.Tensor]) -> None:
        if "spec.matched" in host:
            out.spec_matched.update(zip(self.req_ids, host["spec.matched"].tolist()))
        if "spec.proposals" in host:
            out.spec_proposals.update(zip(self.req_ids, host["spec.proposals"].tolist()))
