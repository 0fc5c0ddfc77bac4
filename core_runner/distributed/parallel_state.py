"""The tensor-parallel group of this process, and the collectives layers call.

Names follow vLLM (``get_tensor_model_parallel_rank`` / ``_world_size``,
``tensor_model_parallel_all_reduce`` / ``_all_gather``). Without ``init_tensor_parallel``
the group is a single rank: every layer then builds its whole weight and every collective
returns its input, so a model runs unchanged in one process.

A group holds two process groups over the same ranks: ``device_group`` for tensors on
the model's device (NCCL on CUDA, gloo on the CPU) and ``cpu_group`` (always gloo) for
the engine's control messages (two groups, so that a control message can never be
matched against a pending model collective). Expert parallelism uses the same ranks: with
``expert_parallel`` set, a fused-MoE layer keeps whole experts (1/size of them) instead of
1/size of every expert's intermediate dimension.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class GroupCoordinator:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device_group: Any = None
    cpu_group: Any = None
    expert_parallel: bool = False

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of ``x`` over the ranks (in place where the backend allows; use the result)."""
        if self.world_size == 1:
            return x
        dist.all_reduce(x, group=self.device_group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The ranks' ``x`` concatenated along ``dim`` in rank order."""
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """``x`` of rank ``src`` on every rank (in place)."""
        if self.world_size == 1:
            return x
        dist.broadcast(x, src=src, group=self.device_group)
        return x


_TP = GroupCoordinator()


def get_tp_group() -> GroupCoordinator:
    return _TP


def get_tensor_model_parallel_world_size() -> int:
    """Ranks in the current TP group (1 without tensor parallelism)."""
    return _TP.world_size


def get_tensor_model_parallel_rank() -> int:
    """This process's rank in the current TP group (0 without tensor parallelism)."""
    return _TP.rank


def expert_parallel_enabled() -> bool:
    """Whether MoE layers hold whole experts per rank (enable_expert_parallel, TP > 1)."""
    return _TP.expert_parallel and _TP.world_size > 1


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over the TP ranks (``x`` itself with one rank); use the result."""
    return _TP.all_reduce(x)


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The TP ranks' ``x`` concatenated along ``dim`` in rank order (``x`` with one rank)."""
    return _TP.all_gather(x, dim)


def divide(total: int, parts: int, what: str) -> int:
    """``total / parts`` for a size split across ranks; ValueError naming ``what`` when it
    does not divide."""
    if total % parts:
        raise ValueError(f"{what}={total} is not divisible by tensor_parallel_size={parts}; pick a "
                         f"tensor_parallel_size that divides it")
    return total // parts


def init_tensor_parallel(
    world_size: int, rank: int, local_rank: int, backend: str, init_method: str, *,
    expert_parallel: bool = False, timeout_s: float = 600.0,
) -> GroupCoordinator:
    """Join the process group (every rank calls it) and make it this process's TP group.

    A process holds one such group (torch.distributed's default group): a second one
    needs ``destroy_tensor_parallel`` first."""
    from datetime import timedelta

    global _TP
    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a tensor-parallel group (one engine with "
                           "tensor_parallel_size > 1 per process): shut that engine down first")
    dist.init_process_group(backend, init_method=init_method, world_size=world_size, rank=rank,
                            timeout=timedelta(seconds=timeout_s))
    cpu_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    _TP = GroupCoordinator(rank, world_size, local_rank, dist.group.WORLD, cpu_group, expert_parallel)
    return _TP


@contextmanager
def use_tp_group(group: GroupCoordinator) -> Iterator[GroupCoordinator]:
    """``group`` is the TP group inside the block: layers built there split themselves for
    it, and the collectives called there use it. A runner holds its group and enters it
    around every forward, so an engine of one rank and one of several can share a process."""
    prev = set_tp_group(group)
    try:
        yield group
    finally:
        set_tp_group(prev)


def set_tp_group(group: GroupCoordinator) -> GroupCoordinator:
    """Install ``group`` as the TP group (tests build layers for a given rank without a
    process group); returns the previous one."""
    global _TP
    prev, _TP = _TP, group
    return prev


def destroy_tensor_parallel() -> None:
    global _TP
    if dist.is_initialized():
        dist.destroy_process_group()
    _TP = GroupCoordinator()
