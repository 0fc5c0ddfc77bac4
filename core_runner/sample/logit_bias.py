"""Logit bias and min_tokens masking, as one sparse edit of the logits.

Both touch a handful of token ids per row, so they are never a [batch, vocab] tensor:
each row's (token id, value) pairs are built on the host when the request is added
(one list with the bias alone, one with the stop tokens set to -inf on top, used while
fewer than min_tokens tokens are out), and each step the lists of the rows in the batch
are concatenated, shifted to flat [batch * vocab] indices, copied once and added.
"""
from __future__ import annotations

import torch

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
