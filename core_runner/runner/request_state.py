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
    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int, device: torch.device) -> None:
        self.max_num_reqs = max_num_reqs
        self.num_rows = max_num_reqs + 1
        self.scratch_row = max_num_reqs
        self.max_model_len = max_model_len
        self.max_blocks_per_req = max_blocks_per_req
        # pop() hands out the lowest free row first
        self.free_rows: list[int] = list(range(max_num_reqs - 1, -1, -1))
        self.req_id_to_row: dict[str, int] = {}
        self.token_ids = StagedWriteTensor((self.num_rows, max_model_len), torch.int32, device)
        self.block_table = StagedWriteTensor((self.num_rows, max_blocks_per_req), torch.int32, device)
        self.num_tokens = StagedWriteTensor((self.num_rows,), torch.int32, device)
        self.num_computed = StagedWriteTensor((self.num_rows,), torch.int32, device)
        self.num_prompt_tokens = StagedWriteTensor((self.num_rows,), torch.int32, device)
        # host mirror: how many block-table columns each row has filled
        self.num_blocks_cpu = [0] * self.num_rows

    def tables(self) -> dict[str, torch.Tensor]:
        return {
            "token_ids": self.token_ids.gpu,
            "block_table": self.block_table.gpu,
            "num_tokens": self.num_tokens.gpu,
            "num_computed": self.num_computed.gpu,
            "num_prompt_tokens": self.num_prompt_tokens.gpu,
        }

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
        self.num_blocks_cpu[row] = 0
        self.append_blocks(row, req.block_ids)
        return row

    def append_blocks(self, row: int, block_ids: list[int]) -> None:
        start = self.num_blocks_cpu[row]
        if start + len(block_ids) > self.max_blocks_per_req:
            raise ValueError(
                f"row {row} would hold {start + len(block_ids)} blocks > max_blocks_per_req={self.max_blocks_per_req}"
            )
        self.block_table.stage_write(row, start, block_ids)
        self.num_blocks_cpu[row] = start + len(block_ids)

    def remove(self, req_id: str) -> int | None:
        row = self.req_id_to_row.pop(req_id, None)
        if row is not None:
            self.num_blocks_cpu[row] = 0
            self.free_rows.append(row)
        return row

    def apply_staged_writes(self) -> None:
        for t in (self.token_ids, self.block_table, self.num_tokens, self.num_computed, self.num_prompt_tokens):
            t.apply_staged_writes()
