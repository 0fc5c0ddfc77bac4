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

from dataclasses import dataclass

import torch

from core_runner.sample.stage import Stage, Step, host_to_device
from core_runner.step_data.scheduler_output import NewRequest


@dataclass(slots=True)
class PenaltyInputs:
    """The rows that use a penalty, with their known tokens read from the token table."""

    batch_idx: torch.Tensor  # [p] int64 batch positions
    token_ids: torch.Tensor  # [p, L] prompt then output tokens (columns >= seq_lens are stale)
    seq_lens: torch.Tensor  # [p] tokens known when this step's token is sampled
    num_prompt: torch.Tensor  # [p] prompt length (outputs start there)
    repetition: torch.Tensor | None  # [p] float32, None when no row of the batch uses it
    frequency: torch.Tensor | None  # [p] float32; set together with presence
    presence: torch.Tensor | None


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


class PenaltiesStage(Stage):
    """The three penalties and the prompt length of each row; reads the runner's token table."""

    def __init__(self, num_rows: int, device: torch.device, token_ids: torch.Tensor | None) -> None:
        super().__init__(num_rows, device, {"repetition_penalty": torch.float32, "frequency_penalty": torch.float32,
                                            "presence_penalty": torch.float32, "num_prompt": torch.int32})
        self.token_ids = token_ids  # [rows, max_model_len], the runner's table
        self.rep_users: set[int] = set()

    def add_request(self, row: int, req: NewRequest) -> None:
        sp = req.sampling_params
        rep, freq, pres = (sp.repetition_penalty, sp.frequency_penalty, sp.presence_penalty) if sp else (1.0, 0.0, 0.0)
        self.write(row, repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres,
                   num_prompt=req.num_prompt_tokens)
        self.remove_request(row)
        if rep != 1.0:
            self.rep_users.add(row)
        if freq != 0.0 or pres != 0.0:
            self.users.add(row)

    def remove_request(self, row: int) -> None:
        self.users.discard(row)
        self.rep_users.discard(row)

    def prepare(self, step: Step, vocab: int) -> PenaltyInputs | None:
        fp = set(self.in_batch(step))
        rep = {i for i, r in enumerate(step.rows) if r in self.rep_users} if self.rep_users else set()
        if not fp and not rep:
            return None
        pen = sorted(fp | rep)
        length = max(int(step.batch.seq_lens_cpu[i]) for i in pen)
        bi = host_to_device(torch.tensor(pen, dtype=torch.int64), self.device)
        prow = step.idx[bi]
        table = lambda name: self.staged[name].gpu[prow]  # noqa: E731
        return PenaltyInputs(
            batch_idx=bi, token_ids=self.token_ids[prow, :length], seq_lens=step.batch.seq_lens[bi],
            num_prompt=table("num_prompt"), repetition=table("repetition_penalty") if rep else None,
            frequency=table("frequency_penalty") if fp else None, presence=table("presence_penalty") if fp else None,
        )

    @staticmethod
    def apply(logits: torch.Tensor, inputs: PenaltyInputs) -> None:
        apply_penalties(logits, inputs)
