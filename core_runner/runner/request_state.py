"""RequestState: a fixed table of request rows, separate from each step's inputs.

A request keeps its row from add to removal; nothing is reordered or compacted. Row
``max_num_reqs`` is a scratch row that no request ever gets: dummy runs and padding
point at it, so they can never disturb a live request.
"""
from __future__ import annotations

import torch

from core_runner.step_data.buffers import StagedWriteTensor
from core_runner.step_data.scheduler_output import NewRequest


class RequestState:
    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int, device: torch.device,
                 num_kv_groups: int = 1) -> None:
        self.max_num_reqs = max_num_reqs
        self.num_rows = max_num_reqs + 1
        self.scratch_row = max_num_reqs
        self.max_model_len = max_model_len
        self.max_blocks_per_req = max_blocks_per_req
        # pop() hands out the lowest free row first
        self.free_rows: list[int] = list(range(max_num_reqs - 1, -1, -1))
        self.req_id_to_row: dict[str, int] = {}
        self.token_ids = StagedWriteTensor((self.num_rows, max_model_len), torch.int32, device)
        # one block table per KV cache group (kv_cache_groups.py); group 0's is ``block_table``
        self.group_tables = [StagedWriteTensor((self.num_rows, max_blocks_per_req), torch.int32, device)
                             for _ in range(num_kv_groups)]
        self.block_table = self.group_tables[0]
        self.num_tokens = StagedWriteTensor((self.num_rows,), torch.int32, device)
        self.num_computed = StagedWriteTensor((self.num_rows,), torch.int32, device)
        self.num_prompt_tokens = StagedWriteTensor((self.num_rows,), torch.int32, device)
        # host mirror: how many block-table columns each row has filled, per group
        self.num_blocks_cpu = [[0] * self.num_rows for _ in range(num_kv_groups)]

    def set_num_kv_groups(self, n: int) -> None:
        """One block table per KV cache group; called before any request is added. With no
        group (a model without paged layers) ``block_table`` stays, all zeros, for input
        prep, whose slots then name no cache: no layer writes or reads them."""
        if self.req_id_to_row:
            raise RuntimeError("the number of KV cache groups is fixed once requests hold rows")
        t0 = self.block_table
        self.group_tables = [t0][:n] + [StagedWriteTensor(tuple(t0.gpu.shape), torch.int32, t0.gpu.device)
                                        for _ in range(n - 1)]
        self.num_blocks_cpu = [[0] * self.num_rows for _ in range(n)]

    def tables(self) -> dict[str, torch.Tensor]:
        out = {
            "token_ids": self.token_ids.gpu,
            "block_table": self.block_table.gpu,
            "num_tokens": self.num_tokens.gpu,
            "num_computed": self.num_computed.gpu,
            "num_prompt_tokens": self.num_prompt_tokens.gpu,
        }
        out.update({f"block_table.{g}": t.gpu for g, t in enumerate(self.group_tables) if g})
        return out

    def add(self, req: NewRequest) -> int:
        if req.req_id in self.req_id_to_row:
            raise ValueError(f"request {req.req_id!r} is already in the runner")
        if not self.free_rows:
            raise RuntimeError(f"no free request row: all {self.max_num_reqs} rows are in use")
        if len(req.token_ids) > self.max_model_len:
            raise ValueError(
                f"request {req.req_id!r} has {len(req.token_ids)} tokens > max_model_len={self.max_model_len}"
            )
        row = self.free_rows.pop()
        self.req_id_to_row[req.req_id] = row
        self.token_ids.stage_write(row, 0, req.token_ids)
        self.num_tokens.stage_scalar(row, len(req.token_ids))
        self.num_computed.stage_scalar(row, req.num_computed_tokens)
        self.num_prompt_tokens.stage_scalar(row, req.num_prompt_tokens)
        for counts in self.num_blocks_cpu:
            counts[row] = 0
        self.append_blocks(row, req.block_ids)
        return row

    def append_blocks(self, row: int, block_ids: list[list[int]] | list[int]) -> None:
        """Append per-group block ids (a flat list: group 0 of a one-group model)."""
        if not block_ids:
            return  # nothing new (or no KV cache group at all)
        per_group = block_ids if isinstance(block_ids[0], list) else [block_ids]
        if len(per_group) > len(self.group_tables):
            raise ValueError(f"{len(per_group)} KV cache groups of block ids for {len(self.group_tables)} tables")
        for g, ids in enumerate(per_group):
            if not ids:
                continue
            start = self.num_blocks_cpu[g][row]
            if start + len(ids) > self.max_blocks_per_req:
                raise ValueError(
                    f"row {row} would hold {start + len(ids)} blocks > max_blocks_per_req={self.max_blocks_per_req}"
                )
            self.group_tables[g].stage_write(row, start, ids)
            self.num_blocks_cpu[g][row] = start + len(ids)

    def remove(self, req_id: str) -> int | None:
        row = self.req_id_to_row.pop(req_id, None)
        if row is not None:
            for counts in self.num_blocks_cpu:
                counts[row] = 0
            self.free_rows.append(row)
        return row

    def apply_staged_writes(self) -> None:
        for t in (self.token_ids, self.block_table, *self.group_tables[1:], self.num_tokens, self.num_computed,
                  self.num_prompt_tokens):
            t.apply_staged_writes()
