"""Logprobs of sampled tokens and of prompt tokens, and their trip to the host.

Raw logprobs (vLLM's default): of the model's distribution, before bias, penalties,
temperature and cuts, so they describe the model rather than the sampling settings.
The top-k ids come from the logits (``torch.topk``: [n, k] out, no sort of the row),
then ``logsumexp`` and the given token's rank are found in one pass per row; a
logprob is logit - logsumexp, so only k + 1 values per row are ever formed.

``LogprobsStage`` keeps each row's k; ``StepLogprobs`` holds one step's device tensors,
which ``AsyncOutput`` copies to the host with the sampled ids before ``fill`` turns them
into per-request dicts. The Triton twin of ``logsumexp_rank_ref`` is in ``logprobs_triton.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from core_runner.sample.stage import Stage, Step, host_to_device
from core_runner.step_data.scheduler_output import NewRequest

ROWS_PER_CHUNK = 64  # the reference's temporaries stay [64, V]


def logsumexp_rank_ref(logits: torch.Tensor, token_ids: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[n, V] logits, [n] token ids -> (logsumexp [n] f32, token logit [n] f32, rank [n] i64);
    rank = 1 + the number of tokens with a strictly larger logit (ties share the best rank)."""
    n = logits.shape[0]
    lse = torch.empty(n, dtype=torch.float32, device=logits.device)
    rank = torch.empty(n, dtype=torch.int64, device=logits.device)
    tok = logits.gather(1, token_ids.long()[:, None])[:, 0].float()
    for s in range(0, n, ROWS_PER_CHUNK):
        chunk = logits[s: s + ROWS_PER_CHUNK].float()
        lse[s: s + ROWS_PER_CHUNK] = torch.logsumexp(chunk, dim=-1)
        rank[s: s + ROWS_PER_CHUNK] = (chunk > tok[s: s + ROWS_PER_CHUNK, None]).sum(dim=-1) + 1
    return lse, tok, rank


@dataclass(slots=True)
class LogprobTensors:
    token_ids: torch.Tensor  # [n] the sampled (or prompt) token
    token_logprobs: torch.Tensor  # [n]
    ranks: torch.Tensor  # [n] 1 + tokens with a larger logit
    top_ids: torch.Tensor  # [n, k]
    top_logprobs: torch.Tensor  # [n, k]

    @staticmethod
    def cat(parts: list["LogprobTensors"]) -> "LogprobTensors":
        if len(parts) == 1:
            return parts[0]
        return LogprobTensors(*(torch.cat([getattr(p, f) for p in parts]) for f in LogprobTensors.__slots__))


def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int, use_triton: bool = False) -> LogprobTensors:
    """Raw logprobs of ``token_ids`` and of each row's ``k`` most likely tokens (logits of any
    float dtype: the kernels and the reference compute in float32, nothing is copied whole)."""
    if use_triton:
        from core_runner.sample.logprobs_triton import logsumexp_rank_triton

        lse, tok, rank = logsumexp_rank_triton(logits, token_ids)
    else:
        lse, tok, rank = logsumexp_rank_ref(logits, token_ids)
    k = min(max(k, 0), logits.shape[1])
    top_vals, top_ids = logits.topk(k, dim=-1) if k else (logits[:, :0], logits[:, :0].long())
    return LogprobTensors(token_ids.long(), tok - lse, rank, top_ids, top_vals.float() - lse[:, None])


class LogprobsStage(Stage):
    """The number of logprobs each row asked for (-1: none); host only."""

    def __init__(self, num_rows: int, device: torch.device) -> None:
        super().__init__(num_rows, device)
        self.k = [-1] * num_rows

    def add_request(self, row: int, req: NewRequest) -> None:
        sp = req.sampling_params
        self.k[row] = -1 if sp is None or sp.logprobs is None else sp.logprobs
        self.users.discard(row)
        if self.k[row] >= 0:
            self.users.add(row)

    def remove_request(self, row: int) -> None:
        super().remove_request(row)
        self.k[row] = -1

    def prepare(self, step: Step) -> list[tuple[int, int]]:
        """(batch position, k) of the rows that want logprobs."""
        return [(i, self.k[step.rows[i]]) for i in self.in_batch(step)]


def gather_logprobs(raw: torch.Tensor, sampled: torch.Tensor, rows: list[tuple[int, int]],
                    use_triton: bool) -> LogprobTensors:
    """Raw logprobs of the rows ``rows`` (batch position, k), in that order. A minority of the
    batch is gathered first (an r x V copy); otherwise every row is computed (no copy) and
    the small results are gathered."""
    k = max(k for _, k in rows)
    if len(rows) == raw.shape[0] and all(i == j for j, (i, _) in enumerate(rows)):
        return compute_logprobs(raw, sampled, k, use_triton)
    idx = host_to_device(torch.tensor([i for i, _ in rows], dtype=torch.int64), raw.device)
    if 2 * len(rows) <= raw.shape[0]:
        return compute_logprobs(raw.index_select(0, idx), sampled.index_select(0, idx), k, use_triton)
    lp = compute_logprobs(raw, sampled, k, use_triton)
    return LogprobTensors(*(getattr(lp, f).index_select(0, idx) for f in LogprobTensors.__slots__))


def _entries(lists: tuple[list, ...], rows: range | list[int], ks: list[int]) -> list[dict[int, float]]:
    tok, lp, top_ids, top_lp = lists
    out = []
    for r, k in zip(rows, ks):
        d = {tok[r]: lp[r]}  # the chosen token first, then the top k (vLLM's order)
        for t, v in zip(top_ids[r][:k], top_lp[r][:k]):
            d.setdefault(t, v)
        out.append(d)
    return out


def _host_lists(host: dict[str, torch.Tensor], prefix: str) -> tuple[list, ...]:
    return tuple(host[prefix + f].tolist() for f in ("token_ids", "token_logprobs", "top_ids", "top_logprobs"))


class StepLogprobs:
    """One step's logprob tensors (sampled tokens and prompt chunks) and their layout."""

    def __init__(
        self, req_ids: list[str], sampled: LogprobTensors | None, sampled_rows: list[tuple[int, int]],
        prompt: LogprobTensors | None, prompt_spans: list[tuple[str, int, int, int, int]],
    ) -> None:
        self.req_ids = req_ids
        self.sampled_rows = sampled_rows  # (batch position, k), one per row of ``sampled``
        self.prompt_spans = prompt_spans  # (req_id, first position, count, k, offset)
        self.tensors: dict[str, torch.Tensor] = {}
        for prefix, t in (("lp.", sampled), ("plp.", prompt)):
            if t is not None:
                self.tensors.update({prefix + f: getattr(t, f) for f in LogprobTensors.__slots__})

    @classmethod
    def collect(
        cls, req_ids: list[str], sampled: LogprobTensors | None, sampled_rows: list[tuple[int, int]],
        prompt: tuple[LogprobTensors, list[tuple[str, int, int, int, int]]] | None,
    ) -> "StepLogprobs | None":
        """None when the step computed no logprobs at all."""
        if sampled is None and prompt is None:
            return None
        tensors, spans = prompt if prompt is not None else (None, [])
        return cls(req_ids, sampled, sampled_rows, tensors, spans)

    def fill(self, out, host: dict[str, torch.Tensor]) -> None:
        """Write per-request results into ``out`` (a ModelRunnerOutput)."""
        if self.sampled_rows:
            r = len(self.sampled_rows)
            entries = _entries(_host_lists(host, "lp."), range(r), [k for _, k in self.sampled_rows])
            ranks = host["lp.ranks"].tolist()
            for j, ((i, _), e) in enumerate(zip(self.sampled_rows, entries)):
                out.logprobs[self.req_ids[i]] = (e, ranks[j])
        if self.prompt_spans:
            lists = _host_lists(host, "plp.")
            for req_id, first, count, k, off in self.prompt_spans:
                out.prompt_logprobs[req_id] = (first, _entries(lists, range(off, off + count), [k] * count))
