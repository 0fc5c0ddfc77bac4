"""DefaultModelState: attention-only decoders (dense and MoE), causal attention."""
from __future__ import annotations

import torch

from core_runner.sdk import AttnMetadata, InputBatch, KVCacheSpec, ModelState, NewRequest, collect_kv_cache_specs


def attn_metadata_from_batch(batch: InputBatch, causal: bool = True) -> AttnMetadata:
    return AttnMetadata(
        num_reqs=batch.num_reqs,
        num_tokens=batch.num_tokens,
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        block_tables=batch.block_tables,
        slot_mapping=batch.slot_mapping,
        query_start_loc_cpu=batch.query_start_loc_cpu,
        seq_lens_cpu=batch.seq_lens_cpu,
        max_query_len=batch.max_query_len,
        max_seq_len=batch.max_seq_len,
        causal=causal,
        kv_groups=tuple(zip(batch.group_block_tables, batch.group_slot_mappings)),
    )


class DefaultModelState(ModelState):
    """Nothing per row beyond the runner's own state; causal paged attention."""

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        dtype = next(self.model.parameters()).dtype
        specs = collect_kv_cache_specs(self.model, dtype)
        if not specs:
            raise ValueError(f"{type(self.model).__name__} has no layer with a kv_cache_spec")
        return specs

    def add_request(self, row: int, request: NewRequest) -> None:
        return None

    def remove_request(self, row: int) -> None:
        return None

    def apply_staged_writes(self) -> None:
        return None

    def prepare_inputs(self, batch: InputBatch) -> dict[str, torch.Tensor]:
        return {}

    def prepare_attn(self, batch: InputBatch, *, for_capture: bool = False) -> AttnMetadata:
        return attn_metadata_from_batch(batch, causal=True)

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, torch.Tensor]:
        return {}

    def postprocess_state(self, batch: InputBatch, sampled: torch.Tensor | None) -> None:
        return None
