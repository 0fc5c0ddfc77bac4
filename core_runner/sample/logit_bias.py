"""Logit bias and min_tokens masking, as one sparse edit of the logits.

Both touch a handful of token ids per row, so they are never a [batch, vocab] tensor:
each row's (token id, value) pairs are built on the host when the request is added
(one list with the bias alone, one with the stop tokens set to -inf on top, used while
fewer than min_tokens tokens are out), and each step the lists of the rows in the batch
are concatenated, shifted to flat [batch * vocab] indices, copied once and added.
"""
from __future__ import annotations

import torch

from core_runner.sample.stage import Stage, Step, host_to_device
from core_runner.step_data.scheduler_output import NewRequest

Edits = tuple[torch.Tensor, torch.Tensor]  # (token ids int64, values float32), unique ids


def row_edits(bias: dict[int, float] | None, stop_ids: list[int] | tuple[int, ...]) -> Edits | None:
    """The edit list of one row: bias values, and -inf for ``stop_ids`` (which win over
    a bias on the same token). None when there is nothing to edit."""
    values = dict(bias or {})
    for t in stop_ids:
        values[int(t)] = float("-inf")
    if not values:
        return None
    ids = torch.tensor(list(values), dtype=torch.int64)
    return ids, torch.tensor(list(values.values()), dtype=torch.float32)


def pack_edits(parts: list[tuple[int, Edits]], vocab: int) -> Edits | None:
    """[(batch position, edits)] -> flat indices into [n * vocab] and values. Ids outside
    the logits (a stop id past the model's vocabulary) are dropped: they cannot be sampled."""
    idx, vals = [], []
    for i, (ids, values) in parts:
        if ids.numel() and int(ids.max()) >= vocab:
            keep = ids < vocab
            ids, values = ids[keep], values[keep]
        idx.append(ids + i * vocab)
        vals.append(values)
    if not idx:
        return None
    return torch.cat(idx), torch.cat(vals)


def apply_logit_edits(logits: torch.Tensor, flat_idx: torch.Tensor, values: torch.Tensor) -> None:
    """In place: logits.view(-1)[flat_idx] += values (indices are unique per row)."""
    logits.view(-1).scatter_add_(0, flat_idx, values)


class LogitBiasStage(Stage):
    """Each row's edit lists (host only): the bias, and the bias with its stop ids masked,
    used while fewer than min_tokens tokens are out."""

    def __init__(self, num_rows: int, device: torch.device) -> None:
        super().__init__(num_rows, device)
        self.rows: list[tuple[Edits | None, Edits | None, int, int]] = [(None, None, 0, 0)] * num_rows

    def add_request(self, row: int, req: NewRequest) -> None:
        sp = req.sampling_params
        bias = masked = None
        if sp is not None:
            stop_ids = list(sp.stop_token_ids) + ([] if sp.ignore_eos else list(req.eos_token_ids))
            bias = row_edits(sp.logit_bias, ())
            if sp.min_tokens > 0 and stop_ids:
                masked = row_edits(sp.logit_bias, stop_ids)
        self.rows[row] = (bias, masked, req.num_prompt_tokens, sp.min_tokens if sp is not None else 0)
        self.users.discard(row)
        if bias is not None or masked is not None:
            self.users.add(row)

    def remove_request(self, row: int) -> None:
        super().remove_request(row)
        self.rows[row] = (None, None, 0, 0)

    def prepare(self, step: Step, vocab: int) -> Edits | None:
        users = self.in_batch(step)
        if not users:
            return None
        seq_lens = step.batch.seq_lens_cpu[: step.n].tolist()
        parts = []
        for i in users:
            bias, masked, num_prompt, min_tokens = self.rows[step.rows[i]]
            e = masked if masked is not None and seq_lens[i] - num_prompt < min_tokens else bias
            if e is not None:
                parts.append((i, e))
        packed = pack_edits(parts, vocab)
        if packed is None:
            return None
        return host_to_device(packed[0], self.device), host_to_device(packed[1], self.device)

    @staticmethod
    def apply(logits: torch.Tensor, edits: Edits) -> None:
        apply_logit_edits(logits, *edits)
