"""InputBatch: this step's inputs, gathered from persistent state through idx_mapping."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class InputBatch:
    """Step inputs. Requests appear in batch order (decode rows first).

    Device tensors feed the model; ``*_cpu`` twins are host copies the scheduler already
    knew (no device read needed) for planning and the reference backends.
    """

    req_ids: list[str]
    num_reqs: int
    num_tokens: int
    idx_mapping: torch.Tensor  # [num_reqs] rows of RequestState
    idx_mapping_cpu: torch.Tensor
    query_start_loc: torch.Tensor  # [num_reqs + 1]
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor  # [num_reqs] cached tokens after this step
    seq_lens_cpu: torch.Tensor
    num_computed_cpu: torch.Tensor  # [num_reqs] cached tokens before this step
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    slot_mapping: torch.Tensor  # [num_tokens], -1 = pad
    block_tables: torch.Tensor  # [num_reqs, max_blocks_per_req]
    logits_indices: torch.Tensor  # [num_reqs] last token of each request
    max_query_len: int
    max_seq_len: int
    is_dummy: bool = False
    num_reqs_padded: int = 0  # tensors are sized for the padded batch (CUDA graphs)
    num_tokens_padded: int = 0
    graph_key: object | None = None
    # speculative decoding: proposals each request verifies this step (None: no request does)
    spec_counts: list[int] | None = None
    # speculative decoding: the requests (indices) that sample and get proposals after this step
    propose_reqs: list[int] | None = None
    # KV cache groups 1.. (kv_cache_groups.py): their block tables and slot mappings
    group_block_tables: tuple[torch.Tensor, ...] = ()
    group_slot_mappings: tuple[torch.Tensor, ...] = ()


class InputBuffers:
    """Per-step input tensors at fixed device addresses, sized from the workload limits.

    The host writes this step's rows and query offsets into one pinned snapshot
    ([idx_mapping (R) | query_start_loc (R + 1)]) copied with one H2D copy; everything
    else is built on the device from persistent state. CUDA graphs capture these
    addresses, so a replay only needs the buffers refreshed.
    """

    def __init__(self, max_num_reqs: int, max_num_tokens: int, max_blocks: int, device: torch.device) -> None:
        from core_runner.step_data.buffers import UvaBackedTensor

        r = max_num_reqs
        self.max_num_reqs, self.max_num_tokens = r, max_num_tokens
        self.host = UvaBackedTensor((2 * r + 1,), torch.int32, device)
        i32, i64 = torch.int32, torch.int64
        self.out = {
            "input_ids": torch.zeros(max_num_tokens, dtype=i32, device=device),
            "positions": torch.zeros(max_num_tokens, dtype=i64, device=device),
            "slot_mapping": torch.full((max_num_tokens,), -1, dtype=i64, device=device),
            "seq_lens": torch.zeros(r, dtype=i32, device=device),
            "block_tables": torch.zeros((r, max_blocks), dtype=i32, device=device),
            "logits_indices": torch.zeros(r, dtype=i64, device=device),
        }

    def add_kv_groups(self, n: int) -> None:
        """Static block tables and slot mappings for KV cache groups 1..n-1."""
        bt, sm = self.out["block_tables"], self.out["slot_mapping"]
        for g in range(1, n):
            self.out[f"block_tables.{g}"] = torch.zeros_like(bt)
            self.out[f"slot_mapping.{g}"] = torch.full_like(sm, -1)

    def stage(self, rows: list[int], q_lens: list[int], num_reqs_pad: int, pad_row: int) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor
    ]:
        """Write rows and offsets (padded with ``pad_row`` / empty queries), snapshot to the
        device. Returns (idx_mapping, query_start_loc) as device views and host copies."""
        r, n = self.max_num_reqs, len(rows)
        cpu = self.host.cpu
        cpu[:n] = torch.tensor(rows, dtype=torch.int32)
        cpu[n:num_reqs_pad] = pad_row
        qsl = cpu[r: r + num_reqs_pad + 1]
        qsl[0] = 0
        torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0, out=qsl[1: n + 1])
        qsl[n + 1:] = qsl[n]
        dev = self.host.snapshot()
        return dev[:num_reqs_pad], dev[r: r + num_reqs_pad + 1], cpu[:num_reqs_pad].clone(), qsl.clone()
