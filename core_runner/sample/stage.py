"""The shape every sampling stage shares: per-row state, host mirrors, one step's view.

A stage owns the per-row settings of one sampling feature: device tables the kernels read
(``StagedWriteTensor``, written on add, applied in bulk) and host mirrors that decide
whether the stage runs at all this step. ``users`` holds the rows whose request uses the
stage, so a stage nobody in the batch uses costs one set test and never reads the device.
Every stage writes every row field it owns on ``add_request``: a reused row behaves exactly
like a fresh one.
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import Any

import torch

from core_runner.step_data.buffers import StagedWriteTensor
from core_runner.step_data.input_batch import InputBatch
from core_runner.step_data.scheduler_output import NewRequest


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host-built tensor on the device without a stream sync (pinned, async)."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _plain(v: Any) -> Any:
    """Tensors as lists, sets sorted, containers rebuilt: a copy that compares by value."""
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, set):
        return sorted(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return copy.deepcopy(v)


class Step:
    """One step's batch as the stages see it: host rows and the device idx_mapping."""

    def __init__(self, batch: InputBatch) -> None:
        self.batch = batch
        self.n = batch.num_reqs
        self.rows: list[int] = batch.idx_mapping_cpu[: self.n].tolist()
        self.idx = batch.idx_mapping[: self.n].long()


class Stage(ABC):
    """Base: per-row device tables by name, the users set, add / remove / apply."""

    def __init__(self, num_rows: int, device: torch.device, tables: dict[str, torch.dtype] | None = None) -> None:
        self.device = torch.device(device)
        self.num_rows = num_rows
        self.staged = {k: StagedWriteTensor((num_rows,), dt, self.device) for k, dt in (tables or {}).items()}
        self.users: set[int] = set()

    def tables(self) -> dict[str, torch.Tensor]:
        return {k: t.gpu for k, t in self.staged.items()}

    @property
    def has_staged(self) -> bool:
        return any(t.has_staged for t in self.staged.values())

    def write(self, row: int, **values: float | int) -> None:
        for k, v in values.items():
            self.staged[k].stage_scalar(row, v)

    def gather(self, name: str, step: Step) -> torch.Tensor:
        """This step's values of table ``name``, in batch order."""
        return self.staged[name].gpu[step.idx]

    def in_batch(self, step: Step) -> list[int]:
        """Batch positions whose row uses this stage (host mirrors only)."""
        if not self.users or self.users.isdisjoint(step.rows):
            return []
        return [i for i, r in enumerate(step.rows) if r in self.users]

    @abstractmethod
    def add_request(self, row: int, req: NewRequest) -> None:
        """Write every per-row field this stage owns for the request now in ``row``."""

    def remove_request(self, row: int) -> None:
        self.users.discard(row)

    def host_state(self) -> dict[str, Any]:
        """A plain copy of the host mirrors (every attribute but the device tables) that
        compares with ``==``: for state checks."""
        return {k: _plain(v) for k, v in vars(self).items()
                if k not in ("staged", "device") and not isinstance(v, torch.Tensor)}

    def apply_staged_writes(self) -> None:
        for t in self.staged.values():
            t.apply_staged_writes()
