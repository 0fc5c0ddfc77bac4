"""The ModelState contract: everything the generic runner must not know about a family.

The runner owns request rows, token ids, block tables, input prep and sampling. A
ModelState owns what differs between families: which caches the layers keep
(``kv_cache_specs``), any per-row state beyond the runner's (recurrent state, pooling
settings), extra model inputs and the attention metadata its layers read.

Rules (checked by the conformance suite):
- ``add_request`` initialises every per-row field the state owns; a reused row must
  behave exactly like a fresh one.
- A dummy run (``batch.is_dummy``) changes no persistent state.
- Per-row buffers are sized from the workload limits, never from a global maximum.
- Within a step the runner calls: remove_request (finished and preempted), add_request,
  apply_staged_writes, prepare_inputs, prepare_attn, forward, postprocess_state; in a
  step that verifies speculative proposals, postprocess_verification first.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import nn

from core_runner.attention.backend import AttnMetadata
from core_runner.config import EngineConfig
from core_runner.kv_cache_spec import KVCacheSpec
from core_runner.step_data.input_batch import InputBatch
from core_runner.step_data.scheduler_output import NewRequest


class ModelState(ABC):
    supported_tasks: ClassVar[tuple[str, ...]] = ("generate",)
    # False: steps that verify speculative proposals run eagerly (the runner logs it once),
    # for states whose layers keep per-position state only outside CUDA graphs
    verification_cuda_graphs: ClassVar[bool] = True

    def __init__(self, config: EngineConfig, model: nn.Module, device: torch.device) -> None:
        self.config = config
        self.model = model
        self.device = device

    @abstractmethod
    def kv_cache_specs(self) -> list[KVCacheSpec]:
        """Every cache the model's layers need, each naming its layer."""

    def bind_kv_caches(self, caches: dict[str, Any]) -> None:
        """Hand each layer its allocated cache (``module.kv_cache``)."""
        for name, cache in caches.items():
            self.model.get_submodule(name).kv_cache = cache

    @abstractmethod
    def add_request(self, row: int, request: NewRequest) -> None:
        """A request takes ``row``: initialise every per-row field this state owns."""

    @abstractmethod
    def remove_request(self, row: int) -> None:
        """The request in ``row`` finished or was preempted."""

    @abstractmethod
    def apply_staged_writes(self) -> None:
        """Flush per-row edits staged by add_request to the device."""

    @abstractmethod
    def prepare_inputs(self, batch: InputBatch) -> dict[str, torch.Tensor]:
        """Extra keyword arguments for ``model.forward`` beyond input_ids and positions."""

    @abstractmethod
    def prepare_attn(self, batch: InputBatch, *, for_capture: bool = False) -> AttnMetadata:
        """Attention (and other layer) metadata for this batch."""

    @abstractmethod
    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, torch.Tensor]:
        """Extra model kwargs for a dummy or capture run; must touch no persistent state."""

    @abstractmethod
    def postprocess_state(self, batch: InputBatch, sampled: torch.Tensor | None) -> None:
        """Update own state after sampling (``sampled``: [num_reqs] token ids)."""

    def postprocess_verification(self, batch: InputBatch, accepted: torch.Tensor, counts: torch.Tensor) -> None:
        """After sampling a verification step: request i kept ``accepted[i]`` of its
        ``counts[i]`` proposals (device [num_reqs]; counts 0 for requests that verified
        nothing). State that advanced over the rejected ones must be rolled back here,
        on the device. Requests verifying proposals are the last ones of the batch."""
        return None

    def pool(self, hidden_states: torch.Tensor, batch: InputBatch) -> list[torch.Tensor | None]:
        """Pooled outputs per request, for states whose task is not ``generate``."""
        raise TypeError(f"{type(self).__name__} supports {self.supported_tasks}, not pooling")

    def bind_state_snapshots(self, snapshots: dict[str, tuple[torch.Tensor, ...]]) -> None:
        """Snapshot slots beside each ``RowStateSpec`` layer's row state (``[slots, ...]`` per
        tensor; prefix caching of row state, docs/hybrid_prefix_caching.md). A state that
        owns row state must then restore ``NewRequest.state_slot`` in ``add_request`` and
        implement ``save_state_snapshots``."""
        if snapshots:
            raise TypeError(f"{type(self).__name__} keeps no row state snapshots: it cannot serve prefix caching "
                            f"of layers {sorted(snapshots)}")

    def save_state_snapshots(self, rows: list[int], slots: list[int]) -> None:
        """After this step's forward: copy each row's state into its slot (on the device)."""
        raise TypeError(f"{type(self).__name__} keeps no row state snapshots")

    def row_buffers(self) -> dict[str, torch.Tensor]:
        """Per-row tensors owned by this state (dim 0 = row), for hygiene checks."""
        return {}
